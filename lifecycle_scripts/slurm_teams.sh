#!/usr/bin/env bash
# slurm_teams.sh: the teams of provisioning_parameters.json ("teams"; moe-cdk's `teams` section) on a HyperPod
# Slurm cluster. Skipped when there are none.
#
#   every node   each member as a POSIX user with the same uid everywhere and the home /fsx/<name>, and an SSH key
#                pair in that shared home that the user's own authorized_keys accepts, so `ssh` between nodes and
#                MPI launchers work (AWS's base-config add_users.sh, fsx_ubuntu.sh and gen-keypair-ubuntu.sh do the
#                same: aws-samples/awsome-distributed-training at 0edaf15, LifecycleScripts/base-config)
#   controller   the QoS tiers, one account per team with its fair share, QoS and default QoS, and its users
#                (slurm_teams.py apply, with sacctmgr); then the scheduler settings priority and preemption need
#                (slurm_teams.py conf) in moe-cdk-teams.conf beside slurm.conf, which slurm.conf includes
#
# Accounting: HyperPod runs slurmdbd with MariaDB on the controller by default (SageMaker Developer Guide, "Using
# an external accounting database"), or an external database (cluster.accounting_database). sacctmgr needs it; a
# cluster without it fails here with a hint.
#
# slurm.conf is HyperPod's: the Include line is the one change made to it, and the configuration asks for
# SlurmConfigStrategy Merge, under which "HyperPod preserves manual slurm.conf changes" (SageMaker Developer Guide,
# "SageMaker HyperPod references"; Managed fails UpdateCluster on a changed slurm.conf and Overwrite discards the
# change). A changed setting takes a slurmctld restart: PriorityType, PreemptType and AccountingStorageEnforce are
# read at start (slurm.conf(5) of 22.05 says so for AccountingStorageEnforce; preempt.shtml for plugin changes).
# Where systemd runs slurmctld it is restarted; elsewhere `scontrol reconfigure` is what there is, and what it does
# not take is logged.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly SLURM_ETC="${MOE_LC_ROOT}/opt/slurm/etc"
readonly TEAMS_CONF="${SLURM_ETC}/moe-cdk-teams.conf"

teams_py() {
  python3 "${MOE_LC_DIR}/slurm_teams.py" "$@" "${MOE_LC_PARAMS}"
}

# ensure_user NAME UID: the user (and its group) with home /fsx/NAME; an existing user is left as it is.
ensure_user() {
  local name="$1" uid="$2" prefix=()
  [[ -n "${MOE_LC_ROOT}" ]] && prefix=(--prefix "${MOE_LC_ROOT}")
  if grep -q "^${name}:" "${MOE_LC_ROOT}/etc/passwd"; then
    log "user ${name} exists"
  elif awk -F: -v uid="${uid}" '$3 == uid { found = 1 } END { exit !found }' "${MOE_LC_ROOT}/etc/passwd"; then
    die "uid ${uid} of team member ${name} is another user's on this node: pick a free uid in teams"
  else
    useradd "${prefix[@]}" --uid "${uid}" --user-group --no-create-home --home-dir "/fsx/${name}" \
      --shell /bin/bash "${name}"
    log "user ${name} (uid ${uid}) added"
  fi
}

# ensure_home NAME UID: the home on the shared file system and its SSH key pair, made once for all nodes: the
# nodes run this together, so the first to take the lock makes them and the others find them.
ensure_home() {
  local name="$1" uid="$2" home="${MOE_LC_ROOT}/fsx/$1"
  mkdir -p "${home}/.ssh"
  (
    flock 9
    if [[ ! -f "${home}/.ssh/id_ed25519" ]]; then
      ssh-keygen -q -t ed25519 -N "" -C "${name}@moe-cdk" -f "${home}/.ssh/id_ed25519"
      log "SSH key pair for ${name} made in /fsx/${name}/.ssh"
    fi
    touch "${home}/.ssh/authorized_keys"
    grep -qxF "$(cat "${home}/.ssh/id_ed25519.pub")" "${home}/.ssh/authorized_keys" \
      || cat "${home}/.ssh/id_ed25519.pub" >>"${home}/.ssh/authorized_keys"
    chmod 700 "${home}/.ssh"
    chmod 600 "${home}/.ssh/id_ed25519" "${home}/.ssh/authorized_keys"
    chown -R "${uid}:${uid}" "${home}"
  ) 9>"${home}/.ssh/.moe-cdk.lock"
}

# include_teams_conf: slurm.conf includes moe-cdk-teams.conf once; 0 when the line was added. The path is relative,
# as HyperPod's own "Include accounting.conf" is: Slurm resolves it beside slurm.conf, and configless slurmd get the
# files of slurm.conf's folder from slurmctld.
include_teams_conf() {
  local conf="${SLURM_ETC}/slurm.conf" line="Include ${TEAMS_CONF##*/}"
  [[ -f "${conf}" ]] || die "no ${conf}: HyperPod's configuration has not written slurm.conf on this controller"
  if grep -qxF "${line}" "${conf}"; then
    return 1
  fi
  printf '\n# moe-cdk teams: priority and preemption (lifecycle_scripts/slurm_teams.sh)\n%s\n' "${line}" >>"${conf}"
}

restart_slurmctld() {
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet slurmctld; then
    systemctl restart slurmctld
    log "slurmctld restarted for the scheduler settings"
  else
    scontrol reconfigure
    warn "no systemd slurmctld to restart: ran scontrol reconfigure; slurm.conf(5) says AccountingStorageEnforce (and a plugin change) may take effect only at slurmctld's next start"
  fi
  wait_for_slurmctld
}

controller() {
  wait_for_slurmctld
  if ! sacctmgr -n show cluster >/dev/null 2>&1; then
    die "sacctmgr cannot reach slurmdbd: HyperPod sets up accounting (slurmdbd) on the controller; check systemctl status slurmdbd and AccountingStorageType in ${SLURM_ETC}"
  fi
  teams_py apply | while read -r line; do log "${line}"; done
  local new="${TEAMS_CONF}.new" changed=1
  {
    echo "# Written by moe-cdk's lifecycle (slurm_teams.sh) from the teams section; included by slurm.conf."
    teams_py conf
  } >"${new}"
  replace_if_changed "${new}" "${TEAMS_CONF}" 0644 && changed=0
  include_teams_conf && changed=0
  if ((changed == 0)); then
    restart_slurmctld
  else
    log "scheduler settings unchanged"
  fi
}

main() {
  install_err_trap
  load_node_facts
  if [[ -z "$(teams_py names)" ]]; then
    log "no teams in the parameters: nothing to set up"
    return 0
  fi
  local name uid
  while read -r name uid; do
    ensure_user "${name}" "${uid}"
    ensure_home "${name}" "${uid}"
  done < <(teams_py members)
  if [[ "${MOE_NODE_ROLE}" == controller ]]; then
    controller
  fi
}

main "$@"
