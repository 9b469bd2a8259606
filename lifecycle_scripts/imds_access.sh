#!/usr/bin/env bash
# imds_access.sh: on a Slurm cluster (HyperPod or ParallelCluster) with teams, the instance metadata service (IMDS),
# and with it the node role's credentials, for root and the node's own services only. Skipped (nothing changes)
# without teams.
#
# Why: whoever reaches IMDS (169.254.169.254, and fd00:ec2::254 over IPv6) gets the node role's temporary
# credentials, so every team member could use what the role may do: the sagemaker-* buckets of the managed policy,
# network-interface creation, aps:RemoteWrite, the accounting database's secret. Members need none of it: their data
# and checkpoints are on /fsx, and their image pulls get an ECR token from moe-ecr-password (below).
#
# What it installs (all root's):
#   /usr/local/sbin/moe-cdk-imds-rules    the rules below; run now, and at every boot by moe-cdk-imds.service
#                                         (netfilter rules live in the kernel only and a reboot loses them)
#   /etc/systemd/system/moe-cdk-imds.service
#   /usr/local/bin/moe-ecr-password       REGION: prints an ECR authorization token, run as root (mode 0755)
#   /etc/sudoers.d/moe-cdk-ecr            every user may run moe-ecr-password, and nothing else, as root without a
#                                         password (mode 0440; checked with visudo -cf where visudo exists)
#
# The rules, with iptables, and with ip6tables for fd00:ec2::254 where it works, in a chain of their own,
# MOE_CDK_IMDS, that OUTPUT jumps to for the traffic to IMDS's address (the jump is inserted first in OUTPUT, once:
# `-C` finds it on the next run). The chain is flushed and refilled by each run, so it always holds exactly:
#   -m owner --uid-owner UID -j RETURN    for each allowed uid (ALLOWED below): on through OUTPUT as before
#   -m limit -j LOG --log-uid             what is refused, with its uid, in the kernel log (a few lines a minute)
#   -j REJECT                             everyone else: the connection is refused at once, not left to time out
# OUTPUT sees the traffic of the node's own network namespace: processes on the host, enroot containers (pyxis
# gives them the host's network) and Docker containers started with --net host, each with its own uid. Docker's
# bridged containers go through FORWARD instead; on these nodes only root runs Docker, and runs none bridged.
#
# Source: AWS ParallelCluster locks its head node's IMDS the same way (AWS ParallelCluster User Guide, "HeadNode
# section": HeadNode / Imds / Secured, true by default). Its cookbook's imds-access.sh (aws/aws-parallelcluster-
# cookbook, cookbooks/aws-parallelcluster-environment/files/imds/imds-access.sh) keeps a chain, PARALLELCLUSTER_IMDS,
# that OUTPUT jumps to for 169.254.169.254 and, with ip6tables, fd00:ec2::254; it accepts the allowed users by
# `-m owner --uid-owner` and rejects the rest, and the allowed users are root and ParallelCluster's own admin and
# daemon users (the cookbook's head_node_imds_allowed_users attribute). What differs, and why:
#   * Every node role, not the head node only: members log in to the login node and run on the compute nodes.
#   * Allowed uids go on through OUTPUT (RETURN) instead of being accepted there, so rules of the node's own below
#     this chain still apply to them; and the list is per node role (ALLOWED).
#   * The chain is flushed and refilled on each run rather than edited rule by rule: the result is the same for
#     any earlier state. For the moment between flush and refill the chain is empty, which lets everyone through
#     (a rerun on a live node; at boot nothing of the members runs yet).
#   * A boot unit applies the rules again after a reboot; the cookbook's Chef run does that for ParallelCluster.
#
# Paths carry ${MOE_LC_ROOT}, so the tests run this in a sandbox with stand-ins for iptables and ip6tables, and in
# a network namespace of its own with the real ones (tests/lifecycle_scripts/test_imds_access.py).
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly RULES="${MOE_LC_ROOT}/usr/local/sbin/moe-cdk-imds-rules"
readonly UNIT_NAME="moe-cdk-imds.service"
readonly UNIT="${MOE_LC_ROOT}/etc/systemd/system/${UNIT_NAME}"
readonly HELPER_PATH="/usr/local/bin/moe-ecr-password"
readonly HELPER="${MOE_LC_ROOT}${HELPER_PATH}"
readonly SUDOERS="${MOE_LC_ROOT}/etc/sudoers.d/moe-cdk-ecr"

# The uids that keep IMDS, one entry each: "UID ROLES WHO" (ROLES: the node roles, comma-separated, where it is
# allowed; WHO: the rule's comment). Uids rather than names: a container's processes are seen on the host by their
# uid, whatever the host calls it.
ALLOWED=(
  # root: HyperPod's own agents, the SSM agent, these lifecycle scripts (aws ssm get-parameter, and
  # setup_observability.sh's aws ecr get-login-password), Docker's daemon pulling the exporter images, slurmd's
  # prolog and epilog, and moe-ecr-password, which members run through sudo.
  "0 controller,login,compute root"
  # nobody (65534) on the controller: the Prometheus agent of setup_observability.sh. Its image runs as USER nobody
  # (setup_observability.sh, PROMETHEUS_UID), on the host network, and signs its remote-write to AMP (aps:RemoteWrite)
  # with SigV4 and the instance's credentials, which it reads from IMDS. node_exporter's container on the controller
  # runs as nobody too, and so passes as well; it has no use for IMDS. Compute and login nodes run no agent, and
  # refuse nobody.
  "65534 controller prometheus-agent"
)
# Left out, and why:
#   slurm (SlurmUser, where it is not root): slurmctld and slurmdbd call no AWS API; the one program these scripts
#     have SlurmUser run, the reconfig trigger (slurm_features.sh --reapply), runs scontrol only; HyperPod's agents,
#     as root, read the accounting database's secret.
#   the exporters' other users (node_exporter, DCGM, EFA on every node): they read the node, not AWS.
#   team members and every other user: their jobs run as them (batch scripts, srun steps, enroot containers).

# On ParallelCluster, by name (their uids are its cookbook's to choose), on every node role: its admin user, which
# runs its daemons (clustermgtd and the head node's other daemons, computemgtd on compute nodes), and the OS's
# default user, the administrator's login. ParallelCluster's own lock on the head node's IMDS lets both through, with
# root (aws/aws-parallelcluster-cookbook, attributes: head_node_imds_allowed_users is root, cluster_admin_user
# "pcluster-admin" and cluster_user, "ubuntu" on the Ubuntu AMIs moe-cdk deploys); this chain, first in OUTPUT, must
# not refuse what that one allows, or clustermgtd could no longer reach EC2.
readonly PARALLELCLUSTER_ALLOWED=(pcluster-admin ubuntu)

# allowed_entries ROLE: the ALLOWED entries of ROLE, and on ParallelCluster its users, as "UID:WHO" lines.
allowed_entries() {
  local role="$1" uid roles who entry name
  for entry in "${ALLOWED[@]}"; do
    read -r uid roles who <<<"${entry}"
    if [[ ",${roles}," == *",${role},"* ]]; then
      printf '%s:%s\n' "${uid}" "${who}"
    fi
  done
  [[ "${MOE_CLUSTER_MANAGER}" == parallelcluster ]] || return 0
  for name in "${PARALLELCLUSTER_ALLOWED[@]}"; do
    uid="$(awk -F: -v name="${name}" '$1 == name { print $3; exit }' "${MOE_LC_ROOT}/etc/passwd" 2>/dev/null || true)"
    if [[ -n "${uid}" ]]; then
      printf '%s:%s\n' "${uid}" "${name} (ParallelCluster)"
    else
      warn "no user ${name} on this ParallelCluster node: not in the IMDS allow list" >&2  # stdout is the list
    fi
  done
}

# ---- The rules program (moe-cdk-imds-rules). These functions are copied into it with declare -f and run there,
# at boot too, so they use nothing of lib.sh: plain lines on stdout, which the boot unit sends to the journal.

# imds_chain TOOL ADDRESS UID:WHO...: the chain and the jump for one address family (see the header).
imds_chain() {
  local tool="$1" address="$2" chain="MOE_CDK_IMDS" entry
  shift 2
  if ! "${tool}" -w -n -L "${chain}" >/dev/null 2>&1; then
    "${tool}" -w -N "${chain}"
  fi
  "${tool}" -w -F "${chain}"
  for entry in "$@"; do
    "${tool}" -w -A "${chain}" -m owner --uid-owner "${entry%%:*}" -m comment --comment "moe-cdk: ${entry#*:}" -j RETURN
  done
  "${tool}" -w -A "${chain}" -m limit --limit 6/min -m comment --comment "moe-cdk: log the refused" \
    -j LOG --log-prefix "moe-cdk IMDS refused: " --log-uid
  "${tool}" -w -A "${chain}" -m comment --comment "moe-cdk: everyone else" -j REJECT
  if "${tool}" -w -C OUTPUT -d "${address}" -j "${chain}" 2>/dev/null; then
    echo "${tool}: OUTPUT already jumps to ${chain} for ${address}"
  else
    "${tool}" -w -I OUTPUT 1 -d "${address}" -j "${chain}"
    echo "${tool}: OUTPUT jumps to ${chain} for ${address}"
  fi
  echo "${tool}: ${chain} lets uids ${*%%:*} reach ${address} and refuses every other"
}

# imds_rules UID:WHO...: IPv4 always (no iptables is an error); IPv6 where ip6tables can reach the kernel's tables
# (a kernel booted with ipv6.disable=1 has none, and then IMDS has no IPv6 address to reach either).
imds_rules() {
  if ! command -v iptables >/dev/null 2>&1; then
    echo "iptables is not installed: it is needed to keep IMDS from the team members" >&2
    return 1
  fi
  imds_chain iptables 169.254.169.254/32 "$@"
  if command -v ip6tables >/dev/null 2>&1 && ip6tables -w -n -L OUTPUT >/dev/null 2>&1; then
    imds_chain ip6tables fd00:ec2::254/128 "$@"
  else
    echo "ip6tables: not installed or no IPv6 tables in this kernel; IMDS's IPv6 address left alone"
  fi
}

# ---- What the lifecycle step does.

# install_text TARGET MODE: stdin as TARGET (root's, MODE) when it differs; 0 when it changed.
install_text() {
  local target="$1" mode="$2" tmp
  mkdir -p -- "$(dirname -- "${target}")"
  tmp="$(mktemp "${target}.moe-cdk.XXXXXX")"
  cat >"${tmp}"
  chown 0:0 -- "${tmp}"
  replace_if_changed "${tmp}" "${target}" "${mode}"
}

rules_program() {
  local entries=("$@")
  cat <<EOF
#!/bin/bash
# Written by moe-cdk's lifecycle_scripts/imds_access.sh for this ${MOE_NODE_ROLE} node; run by ${UNIT_NAME} at
# every boot. Instance metadata (IMDS) for the uids below only: see imds_access.sh's header.
set -euo pipefail
$(declare -f imds_chain imds_rules)
imds_rules ${entries[*]@Q}
EOF
}

rules_unit() {
  cat <<EOF
# Written by moe-cdk's lifecycle_scripts/imds_access.sh: the IMDS rules again after a reboot. Ordered before
# network-pre.target, which systemd.special(7) gives to firewall services that must run before any network is up.
[Unit]
Description=moe-cdk: instance metadata (IMDS) for root and the node's services only
DefaultDependencies=no
After=local-fs.target systemd-modules-load.service
Before=network-pre.target shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=${RULES#"${MOE_LC_ROOT}"}

[Install]
WantedBy=multi-user.target
EOF
}

# The ECR helper. The batch script's enroot credentials (jobs/slurm_job.py, _ENROOT_CREDENTIALS) ask enroot to run
# `sudo -n moe-ecr-password REGION` at each pull, as the member; the helper runs as root, which reaches IMDS. What
# this trades: a member can get an ECR authorization token, valid 12 hours, with the node role's ECR permissions,
# which are pull-only (ecr:BatchCheckLayerAvailability, BatchGetImage and GetDownloadUrlForLayer on the training
# image's repository and HyperPod's exporter images: constructs/hyperpod_slurm_cluster.py); not the role's
# credentials. The helper takes nothing from the caller but REGION (checked): a fixed PATH, an empty environment,
# and the AWS CLI found when it was installed.
helper_program() {
  local aws="$1"
  cat <<EOF
#!/bin/bash
# Written by moe-cdk's lifecycle_scripts/imds_access.sh. moe-ecr-password REGION: an Amazon ECR authorization
# token for REGION, from the node role (run as root: IMDS is root's on this node). Members run it through sudo
# (/etc/sudoers.d/moe-cdk-ecr) when enroot pulls from ECR.
set -euo pipefail
if [[ \$# -ne 1 || ! "\$1" =~ ^[a-z]{2}(-[a-z]+)+-[0-9]+\$ ]]; then
  echo "usage: moe-ecr-password REGION (a region name such as us-east-2)" >&2
  exit 2
fi
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \\
  ${aws@Q} ecr get-login-password --region "\$1"
EOF
}

sudoers_text() {
  cat <<EOF
# Written by moe-cdk's lifecycle_scripts/imds_access.sh: every user may run moe-ecr-password as root without a
# password (the ECR token for enroot's pulls; the node's IMDS is root's), and only that command.
ALL ALL=(root) NOPASSWD: ${HELPER_PATH}
EOF
}

# install_sudoers: the drop-in, checked by visudo before it is put in place (a drop-in that sudo cannot parse
# would break every sudo on the node).
install_sudoers() {
  local tmp
  mkdir -p -- "$(dirname -- "${SUDOERS}")"
  # A name with a dot is skipped by sudo's #includedir, so the unchecked temporary file is never read.
  tmp="$(mktemp "${SUDOERS}.moe-cdk.XXXXXX")"
  sudoers_text >"${tmp}"
  chown 0:0 -- "${tmp}"
  chmod 0440 -- "${tmp}"
  if command -v visudo >/dev/null 2>&1; then
    if ! visudo -cf "${tmp}" >/dev/null; then
      rm -f -- "${tmp}"
      die "visudo rejects the sudoers drop-in for moe-ecr-password: ${SUDOERS} left as it was"
    fi
  else
    warn "no visudo on this node: ${SUDOERS} installed unchecked"
  fi
  if replace_if_changed "${tmp}" "${SUDOERS}" 0440; then
    log "installed ${SUDOERS}: every user may run ${HELPER_PATH} as root"
  else
    log "${SUDOERS} is already up to date"
  fi
}

install_helper() {
  local aws
  aws="$(command -v aws)" || die "the AWS CLI is not installed: moe-ecr-password needs it (HyperPod's AMI ships it)"
  if helper_program "${aws}" | install_text "${HELPER}" 0755; then
    log "installed ${HELPER_PATH} (${aws} ecr get-login-password, run as root)"
  else
    log "${HELPER_PATH} is already up to date"
  fi
  install_sudoers
}

install_rules() {
  local entries=() entry line changed=1
  while IFS= read -r entry; do
    entries+=("${entry}")
  done < <(allowed_entries "${MOE_NODE_ROLE}")
  if ((${#entries[@]} == 0)); then
    die "imds_access.sh: no allowed uid for node role '${MOE_NODE_ROLE}' (allowed controller, login, compute)"
  fi
  if rules_program "${entries[@]}" | install_text "${RULES}" 0755; then changed=0; fi
  if rules_unit | install_text "${UNIT}" 0644; then changed=0; fi
  if ((changed == 0)); then
    retry 5 2 systemctl daemon-reload
    retry 5 2 systemctl enable "${UNIT_NAME}"
    log "installed ${RULES} and enabled ${UNIT_NAME}: the rules are applied again at every boot"
  fi
  "${RULES}" | while IFS= read -r line; do log "${line}"; done
}

main() {
  install_err_trap
  local teams
  load_node_facts
  load_params
  # On a line of its own, so that a failure stops the step: inside [[ ]] it would read as "no teams", IMDS left open.
  teams="$(python3 "${MOE_LC_DIR}/slurm_teams.py" names "${MOE_LC_PARAMS}")"
  if [[ -z "${teams}" ]]; then
    log "no teams in the parameters: IMDS stays open to every user of this node; nothing to do"
    return 0
  fi
  # The helper first: by the time members are refused IMDS, their pulls have the helper to turn to.
  install_helper
  install_rules
  log "IMDS on this ${MOE_NODE_ROLE} node: root and the services listed in imds_access.sh only;" \
    "members get ECR tokens from ${HELPER_PATH}"
}

main "$@"
