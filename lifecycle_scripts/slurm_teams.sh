#!/usr/bin/env bash
# slurm_teams.sh: the teams of provisioning_parameters.json ("teams"; moe-cdk's `teams` section) on a Slurm cluster
# (HyperPod or ParallelCluster). Skipped when there are none.
#
#   every node   each member as a POSIX user with the same uid everywhere and the home /fsx/<name> (0700), and an SSH
#                key pair in that shared home that the user's own authorized_keys accepts, so `ssh` between nodes and
#                MPI launchers work (AWS's base-config add_users.sh, fsx_ubuntu.sh and gen-keypair-ubuntu.sh do the
#                same: aws-samples/awsome-distributed-training at 0edaf15, LifecycleScripts/base-config), with
#                /etc/skel's files in a new home; a member whose uid is another user's on the node is skipped there
#                with a warning (as add_users.sh skips it), and the node does not fail
#   controller   the QoS tiers (with their preempt exempt time and GPU limits), one account per team with its fair
#                share, QoS, default QoS, GPU cap and job limit, and its users (slurm_teams.py apply, with
#                sacctmgr); then the scheduler settings priority and preemption need (slurm_teams.py conf) in
#                moe-cdk-teams.conf beside slurm.conf, which slurm.conf includes
#
# Accounting: HyperPod runs slurmdbd with MariaDB on the controller by default (SageMaker Developer Guide, "Using
# an external accounting database"), or an external database (cluster.accounting_database). sacctmgr needs it; a
# cluster without it fails here with a hint.
#
# On ParallelCluster, accounting is the external database of SlurmSettings.Database (cluster.accounting_database),
# and an update rewrites slurm.conf without the Include line: the head node's OnNodeUpdated runs this step again after
# every update, and puts it back (docs/parallelcluster.md).
#
# slurm.conf is HyperPod's: the Include line is the one change made to it, and the configuration asks for
# SlurmConfigStrategy Merge, under which "HyperPod preserves manual slurm.conf changes" (SageMaker Developer Guide,
# "SageMaker HyperPod references"; Managed fails UpdateCluster on a changed slurm.conf and Overwrite discards the
# change). With continuous provisioning there is no strategy (any is an API error) and no AWS page says whether
# HyperPod keeps the edit; so what can be is kept in the accounting database, and docs/teams.md says how to check
# for the Include line after scaling and run this step again. A changed setting takes a slurmctld restart: PriorityType, PreemptType and AccountingStorageEnforce are
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

# uid_clash NAME UID: the user that already has UID on this node when NAME is not a user here (empty otherwise).
uid_clash() {
  local name="$1" uid="$2"
  grep -q "^${name}:" "${MOE_LC_ROOT}/etc/passwd" && return 0
  awk -F: -v uid="${uid}" '$3 == uid { print $1; exit }' "${MOE_LC_ROOT}/etc/passwd"
}

# ensure_user NAME UID: the user (and its group) with home /fsx/NAME; an existing user is left as it is.
ensure_user() {
  local name="$1" uid="$2" prefix=()
  [[ -n "${MOE_LC_ROOT}" ]] && prefix=(--prefix "${MOE_LC_ROOT}")
  if grep -q "^${name}:" "${MOE_LC_ROOT}/etc/passwd"; then
    log "user ${name} exists"
  else
    useradd "${prefix[@]}" --uid "${uid}" --user-group --no-create-home --home-dir "/fsx/${name}" \
      --shell /bin/bash "${name}"
    log "user ${name} (uid ${uid}) added"
  fi
}

# The homes' SSH keys are made by all nodes at once on the shared file system, so each member's are made under a
# lock that every node sees: flock(1) on a file in a folder only root can write (root_dir), on /fsx itself, not
# in the member's home. Lustre serializes flock across clients when mounted with "flock", as mount_fsx.sh mounts
# it; a lock in /run would serialize one node only, and two nodes would each make a key pair and append it.
readonly LOCK_DIR="${MOE_LC_ROOT}/fsx/.moe-cdk/locks"

# root_dir DIR: DIR exists, is root's and only root can write it (made 0755 when missing). A symbolic link or a
# folder that another user owns or can write is refused: root writes in it.
root_dir() {
  local dir="$1" owner mode
  [[ -L "${dir}" ]] && die "${dir} is a symbolic link: the teams step keeps its locks in a folder of root's; remove the link"
  [[ -d "${dir}" ]] || install -d -m 0755 -- "${dir}"
  read -r owner mode < <(stat -c '%u %a' -- "${dir}")
  if [[ "${owner}" != 0 ]] || ((8#${mode} & 8#022)); then
    die "${dir} is owned by uid ${owner} with mode ${mode}: the teams step keeps its locks there only when root owns it and no one else can write it (chown root:root, chmod 755)"
  fi
}

# member_gid NAME: the primary group of NAME in this node's passwd (useradd --user-group made it).
member_gid() {
  awk -F: -v name="$1" '$1 == name { print $4; found = 1 } END { exit !found }' "${MOE_LC_ROOT}/etc/passwd"
}

# as_member UID GID cmd...: run cmd as the member, with no capability left, so the kernel checks every path it
# opens (a link planted in the home leads only where the member may write). Numeric ids and --clear-groups, not
# runuser or --init-groups: those need the name in the system's user database, which the tests' users are not in.
as_member() {
  local uid="$1" gid="$2"
  shift 2
  setpriv --reuid="${uid}" --regid="${gid}" --clear-groups --inh-caps=-all --no-new-privs -- "$@"
}

# member_ssh SSH_DIR PUBLIC_KEY: run as the member (a fresh bash under as_member, never as root). SSH_DIR (made 0700
# when missing) gets the key pair when it has no id_ed25519: PUBLIC_KEY as id_ed25519.pub and the private key read
# from stdin, each written to a temporary name and renamed, the private key last, so a key exists only whole. Then
# authorized_keys (made 0600 when missing) gets id_ed25519.pub's key unless it has it. What it did, on stdout.
member_ssh() {
  set -euo pipefail
  umask 077
  local ssh="$1" public="$2" tmp
  [[ -d "${ssh}" ]] || mkdir -m 0700 -- "${ssh}"
  if [[ ! -e "${ssh}/id_ed25519" && ! -L "${ssh}/id_ed25519" ]]; then
    tmp="${ssh}/.moe-cdk-new-$$"
    printf '%s\n' "${public}" >"${tmp}.pub"
    cat >"${tmp}"
    mv -f -- "${tmp}.pub" "${ssh}/id_ed25519.pub"
    mv -f -- "${tmp}" "${ssh}/id_ed25519"
    echo "SSH key pair made"
  fi
  public="$(head -n 1 -- "${ssh}/id_ed25519.pub")"
  if [[ -z "${public}" ]]; then
    echo "${ssh}/id_ed25519.pub has no key" >&2
    return 1
  fi
  [[ -e "${ssh}/authorized_keys" ]] || : >"${ssh}/authorized_keys"
  if ! grep -qxF -- "${public}" "${ssh}/authorized_keys"; then
    # A last line without its newline would run into the key.
    if [[ -n "$(tail -c 1 -- "${ssh}/authorized_keys")" ]]; then
      printf '\n' >>"${ssh}/authorized_keys"
    fi
    printf '%s\n' "${public}" >>"${ssh}/authorized_keys"
    echo "authorized_keys accepts id_ed25519.pub"
  fi
}

# skeleton UID GID HOME NAME: the skeleton files (/etc/skel: .bashrc, .profile) in a home just made, as useradd -m
# gives them (AWS's add_users.sh makes its users with useradd -m), copied as the member, so every file is the
# member's and root writes nothing in the home. Only into a new home: an existing one is the member's own.
skeleton() {
  local uid="$1" gid="$2" home="$3" name="$4" skel="${MOE_LC_ROOT}/etc/skel" error
  if [[ ! -d "${skel}" ]]; then
    log "no ${skel}: /fsx/${name} starts empty"
    return 0
  fi
  if error="$(as_member "${uid}" "${gid}" cp -R --preserve=mode,timestamps -- "${skel}/." "${home}/" 2>&1)"; then
    log "/fsx/${name}: skeleton files from /etc/skel"
  else
    warn "could not copy /etc/skel into /fsx/${name} as ${name}: ${error##*: }; the home starts without them"
  fi
}

# ensure_home NAME UID: the home /fsx/NAME and its SSH key pair, made once for all nodes (under the member's lock).
# Root makes only the home, when it is missing: private (0700), the member's and the member's group's from the
# start. What is in the home is the member's: root never opens, changes or chowns anything there. The key pair is
# generated by root in a private temporary folder of its own and handed to member_ssh, which writes it as the
# member (ssh-keygen run as the member needs the member in the system's user database). A home that exists is left
# as it is (its mode too: homes made before homes were private are 0755; `chmod 700` makes one private); one that is
# not a folder of the member's, or where member_ssh fails, gets a warning and no key: the member's files are theirs
# to mend, and a node does not fail over them.
ensure_home() {
  local name="$1" uid="$2" home="${MOE_LC_ROOT}/fsx/$1" gid lock
  gid="$(member_gid "${name}")" || die "user ${name} is not in ${MOE_LC_ROOT}/etc/passwd: the home needs its group"
  root_dir "${MOE_LC_ROOT}/fsx/.moe-cdk"
  root_dir "${LOCK_DIR}"
  lock="${LOCK_DIR}/${name}.lock"
  (
    flock 9
    local owner tmp said line
    if [[ ! -e "${home}" && ! -L "${home}" ]]; then
      install -d -o "${uid}" -g "${gid}" -m 0700 -- "${home}"
      log "home /fsx/${name} made (mode 700, owner ${uid}:${gid})"
      skeleton "${uid}" "${gid}" "${home}" "${name}"
    fi
    owner="$(stat -L -c %u -- "${home}" 2>/dev/null)" || owner=""
    if [[ ! -d "${home}" || "${owner}" != "${uid}" ]]; then
      warn "/fsx/${name} is not a folder owned by ${name} (uid ${uid}): left as it is, and no SSH key set up for ${name}"
      exit 0
    fi
    tmp="$(mktemp -d)"
    ssh-keygen -q -t ed25519 -N "" -C "${name}@moe-cdk" -f "${tmp}/id_ed25519"
    if said="$(as_member "${uid}" "${gid}" bash -c "$(declare -f member_ssh); member_ssh \"\$@\"" member_ssh \
      "${home}/.ssh" "$(cat -- "${tmp}/id_ed25519.pub")" <"${tmp}/id_ed25519" 2>"${tmp}/error")"; then
      while IFS= read -r line; do
        [[ -z "${line}" ]] || log "/fsx/${name}/.ssh: ${line}"
      done <<<"${said}"
    else
      warn "could not set up the SSH key of ${name} in /fsx/${name}/.ssh, writing as ${name}: $(tail -n 1 -- "${tmp}/error" | sed 's/^[^:]*: line [0-9]*: //'); left as it is"
    fi
    rm -rf -- "${tmp}"
  ) 9>"${lock}"
}

# ensure_team NAME GID MEMBERS: the team's group (named as the team, the same gid on every node) with its members
# (comma-separated, or -), and its folder /fsx/teams/NAME: root's, the team's group, mode 2770 (setgid, so what a
# member writes there is the team's), made once; an existing one is left as it is. The team's checkpoints and
# profiles go there (slurm render --team), out of other teams' reach: FSx for Lustre checks the numeric ids.
ensure_team() {
  local team="$1" gid="$2" members="$3" prefix=() found member
  [[ -n "${MOE_LC_ROOT}" ]] && prefix=(--prefix "${MOE_LC_ROOT}")
  found="$(awk -F: -v name="${team}" '$1 == name { print $3 }' "${MOE_LC_ROOT}/etc/group")"
  if [[ -z "${found}" ]]; then
    if awk -F: -v gid="${gid}" '$3 == gid { found = 1 } END { exit !found }' "${MOE_LC_ROOT}/etc/group"; then
      die "gid ${gid} of team ${team} is another group's on this node: set teams[].gid to a free gid"
    fi
    groupadd "${prefix[@]}" --gid "${gid}" "${team}"
    log "group ${team} (gid ${gid}) added"
  elif [[ "${found}" != "${gid}" ]]; then
    die "group ${team} has gid ${found} on this node, the configuration says ${gid}: the team's files would change hands"
  fi
  if [[ "${members}" != - ]]; then
    for member in ${members//,/ }; do
      # A member skipped for a uid clash (ensure_user) has no user here to add.
      if grep -q "^${member}:" "${MOE_LC_ROOT}/etc/passwd"; then
        usermod "${prefix[@]}" --append --groups "${team}" "${member}"
      fi
    done
  fi
  root_dir "${MOE_LC_ROOT}/fsx/teams"
  if [[ ! -e "${MOE_LC_ROOT}/fsx/teams/${team}" && ! -L "${MOE_LC_ROOT}/fsx/teams/${team}" ]]; then
    install -d -o 0 -g "${gid}" -m 2770 -- "${MOE_LC_ROOT}/fsx/teams/${team}"
    log "folder /fsx/teams/${team} made (root:${team}, mode 2770)"
  fi
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
  local name uid holder
  while read -r name uid; do
    # A member whose uid is another user's on this node is skipped here, as AWS's add_users.sh skips it ("UID ... is
    # already in use. Skipping adding user", aws-samples/awsome-distributed-training at 7217859,
    # LifecycleScripts/base-config/add_users.sh): a clash with a user of the image must not fail the node, and so the
    # cluster's creation or a node's replacement. The member gets no user, home or team group on this node.
    holder="$(uid_clash "${name}" "${uid}")"
    if [[ -n "${holder}" ]]; then
      warn "team member ${name} skipped on this node: uid ${uid} is already user ${holder}'s here; give ${name} a free uid in teams (no user, home or team group for ${name} on this node)"
      continue
    fi
    ensure_user "${name}" "${uid}"
    ensure_home "${name}" "${uid}"
  done < <(teams_py members)
  local team gid members
  while read -r team gid members; do
    ensure_team "${team}" "${gid}" "${members}"
  done < <(teams_py groups)
  if [[ "${MOE_NODE_ROLE}" == controller ]]; then
    controller
  fi
}

main "$@"
