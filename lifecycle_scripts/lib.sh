#!/usr/bin/env bash
# lib.sh: helpers shared by the lifecycle scripts. Sourced, never executed.
#
#   log MESSAGE...                 timestamped line on stdout, appended to the log file
#   warn MESSAGE...                log "WARNING: ..."
#   die MESSAGE...                 log "ERROR: ...", then fail (the ERR trap reports it)
#   retry ATTEMPTS DELAY cmd...    run cmd until it succeeds; the delay doubles after each failure
#   run_step NAME cmd...           run cmd as the step NAME (used in log lines and the ERR trap), and
#                                  write its step record (below) when it ends
#   install_err_trap               on the first failing command, print diagnostics and exit
#   wait_until SECONDS WHAT cmd... poll cmd every MOE_LC_POLL_S seconds until it succeeds, for SECONDS at most
#   wait_for_slurmctld / wait_for_slurmd NODE
#                                  slurmctld answers (and NODE's slurmd has registered), or die with a hint
#   slurm_user / as_slurm_user cmd...
#                                  the running Slurm's SlurmUser / run cmd as that user (root: directly)
#   load_node_facts / load_params  node_info.py's KEY=value lines into MOE_<KEY> variables
#   replace_if_changed NEW TARGET MODE
#                                  move NEW over TARGET (chmod MODE first) unless they are equal
#   on_nvme DIR / nvme_mounted     DIR is on the instance NVMe / the NVMe is mounted
#   wait_for_nvme                  wait for the DLAMI's dlami-nvme.service to mount the NVMe
#
# Environment (all optional; the tests use them to run in a sandbox):
#   MOE_LC_ROOT                prefix for every system path ("" on a real node)
#   MOE_LC_LOG                 log file (default ${MOE_LC_ROOT}/var/log/provision/moe-cdk-lifecycle.log)
#   MOE_LC_PARAMS              provisioning_parameters.json (default: next to this file)
#   MOE_LC_RESOURCE_CONFIG     HyperPod's resource_config.json
#                              (default ${MOE_LC_ROOT}/opt/ml/config/resource_config.json)
#   MOE_LC_NODE_GROUP          this node's instance group, when its launcher tells it (ParallelCluster:
#                              on_create.sh --group); resource_config.json is then not read
#   MOE_LC_RETRY_DELAY_SCALE   integer multiplier for retry delays (default 1; 0 in tests)
#   MOE_LC_POLL_S              seconds between the polls of wait_until (default 5)
#   MOE_LC_SLURM_WAIT_S        how long wait_for_slurmctld/wait_for_slurmd wait for Slurm to come up (default 600)
#   MOE_LC_NVME_WAIT_S         how long wait_for_nvme waits for the NVMe to be mounted (default 120)
#   MOE_LC_STEP                current step name, exported by run_step to child scripts
#   MOE_LC_NODE_FACTS, MOE_LC_CLUSTER_SETTINGS
#                              what node_info.py printed for load_node_facts and load_params, exported by the first
#                              load, so the steps on_create.sh runs read them there instead of starting Python again
#                              (each step run on its own reads the files itself)
#
# Step records. Each step run by run_step ends with one line, on stdout (which HyperPod sends to
# CloudWatch Logs, log group /aws/sagemaker/Clusters/<cluster>/<cluster-id>, stream
# LifecycleConfig/<group>/<instance-id>) and in the log file:
#   <time> [mount_fsx] moe-cdk-step {"node":"i-0456","group":"gpu","step":"mount_fsx","outcome":"ok","seconds":3}
# and, for the step that failed, "outcome":"failed" and a "hint": what went wrong (the die message,
# or the command that failed) and what to do (step_hint). `moe-cdk status` reads these lines back
# (cli/status.py): the marker and the keys are its contract.
set -euo pipefail

MOE_LC_ROOT="${MOE_LC_ROOT:-}"
MOE_LC_LIB_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
MOE_LC_LOG="${MOE_LC_LOG:-${MOE_LC_ROOT}/var/log/provision/moe-cdk-lifecycle.log}"
MOE_LC_PARAMS="${MOE_LC_PARAMS:-${MOE_LC_LIB_DIR}/provisioning_parameters.json}"
MOE_LC_RESOURCE_CONFIG="${MOE_LC_RESOURCE_CONFIG:-${MOE_LC_ROOT}/opt/ml/config/resource_config.json}"
MOE_LC_RETRY_DELAY_SCALE="${MOE_LC_RETRY_DELAY_SCALE:-1}"
MOE_LC_POLL_S="${MOE_LC_POLL_S:-5}"
MOE_LC_SLURM_WAIT_S="${MOE_LC_SLURM_WAIT_S:-600}"
# The step of a script run on its own is the script's name (mount_fsx.sh -> mount_fsx).
MOE_LC_STEP="${MOE_LC_STEP:-$(basename -- "$0" .sh)}"
export MOE_LC_ROOT MOE_LC_LOG MOE_LC_PARAMS MOE_LC_RESOURCE_CONFIG MOE_LC_RETRY_DELAY_SCALE MOE_LC_POLL_S \
  MOE_LC_SLURM_WAIT_S MOE_LC_STEP
# The command that made retry or die fail, shown by the ERR trap instead of "return 1".
MOE_LC_FAILED_CMD=""
# The command run_step is running, shown by the ERR trap instead of "$@", and when it started.
MOE_LC_STEP_CMD=""
MOE_LC_STEP_STARTED=""
readonly MOE_LC_RECORD_MARK="moe-cdk-step"

mkdir -p -- "$(dirname -- "${MOE_LC_LOG}")" 2>/dev/null || true

log() {
  local ts line
  TZ=UTC printf -v ts '%(%Y-%m-%dT%H:%M:%SZ)T' -1
  line="${ts} [${MOE_LC_STEP}] $*"
  printf '%s\n' "${line}"
  { printf '%s\n' "${line}" >>"${MOE_LC_LOG}"; } 2>/dev/null || true
}

warn() {
  log "WARNING: $*"
}

die() {
  log "ERROR: $*"
  MOE_LC_FAILED_CMD="die $*"
  return 1
}

# retry ATTEMPTS DELAY_SECONDS cmd args...
# Runs "$@" up to ATTEMPTS times. After failure n it sleeps DELAY * 2^(n-1) seconds, times
# MOE_LC_RETRY_DELAY_SCALE. Returns the last exit status when every attempt failed.
retry() {
  local attempts="$1" delay="$2" attempt=1 rc=0
  shift 2
  if [[ ! "${attempts}" =~ ^[1-9][0-9]*$ || ! "${delay}" =~ ^[0-9]+$ ]]; then
    die "retry: ATTEMPTS must be >= 1 and DELAY_SECONDS >= 0 (got '${attempts}' '${delay}')"
  fi
  if [[ ! "${MOE_LC_RETRY_DELAY_SCALE}" =~ ^[0-9]+$ ]]; then
    die "MOE_LC_RETRY_DELAY_SCALE: not a non-negative integer (got '${MOE_LC_RETRY_DELAY_SCALE}'; allowed 0, 1, 2, ...)"
  fi
  while true; do
    if "$@"; then
      return 0
    else
      rc=$?
    fi
    if ((attempt >= attempts)); then
      log "attempt ${attempt}/${attempts} failed (exit ${rc}): $*; giving up"
      MOE_LC_FAILED_CMD="$*"
      return "${rc}"
    fi
    log "attempt ${attempt}/${attempts} failed (exit ${rc}): $*; retrying in $((delay * MOE_LC_RETRY_DELAY_SCALE))s"
    sleep "$((delay * MOE_LC_RETRY_DELAY_SCALE))"
    attempt=$((attempt + 1))
    delay=$((delay * 2))
  done
}

# wait_until SECONDS WHAT cmd args...
# Runs "$@" (output discarded) every MOE_LC_POLL_S seconds until it succeeds; returns 1 once
# SECONDS have passed without success. Logs when it starts waiting, every 30 s, and at the end.
wait_until() {
  local limit="$1" what="$2" started="${SECONDS}" next_log=0
  shift 2
  while ! "$@" >/dev/null 2>&1; do
    if ((SECONDS - started >= limit)); then
      log "gave up waiting for ${what} after $((SECONDS - started))s"
      return 1
    fi
    if ((SECONDS - started >= next_log)); then
      log "waiting for ${what} (at most ${limit}s)"
      next_log=$((next_log + 30))
    fi
    sleep "${MOE_LC_POLL_S}"
  done
  if ((SECONDS > started)); then
    log "${what} after $((SECONDS - started))s"
  fi
}

# Slurm's commands on HyperPod's nodes (the trigger program runs with slurmctld's PATH).
PATH="${PATH}:/opt/slurm/bin"

# The answers are read whole and then matched: under pipefail, "cmd | grep -q" fails with 141 when grep
# stops at its match while cmd is still writing (scontrol ping prints a line per controller).
slurmctld_answers() {
  local answer
  answer="$(scontrol ping 2>/dev/null)" || return 1
  [[ "${answer}" == *"is UP"* ]]
}

# slurmd_registered NODE: slurmctld knows NODE and its slurmd answers (State has no "*", not UNKNOWN).
slurmd_registered() {
  local state
  state="$(scontrol show node -o "$1" 2>/dev/null)" || return 1
  state="$(tr ' ' '\n' <<<"${state}" | awk -F= '$1 == "State" { print $2 }')"
  [[ -n "${state}" && "${state}" != *"*"* && "${state}" != UNKNOWN* ]]
}

# wait_for_slurmctld / wait_for_slurmd NODE: wait (MOE_LC_SLURM_WAIT_S) for slurmctld to answer and,
# for a node, for its slurmd to register too. AWS's detect-node README (awslabs/awsome-distributed-ai
# at 95b939c, 1.architectures/5.sagemaker-hyperpod/Extensions/detect-node): "OnInitComplete and
# lifecycle scripts can run before or in parallel with Slurm service startup". AWS's extension
# scripts wait about 120 s and then go on with a warning; a node whose features or trigger were
# never set would come up unable to run the jobs that ask for them, so this waits longer and then
# fails with a hint.
wait_for_slurmctld() {
  if ! wait_until "${MOE_LC_SLURM_WAIT_S}" "slurmctld to answer (scontrol ping)" slurmctld_answers; then
    die "slurmctld did not answer 'scontrol ping' within ${MOE_LC_SLURM_WAIT_S}s: check that it runs on the controller (systemctl status slurmctld) and that HyperPod's AMI-based configuration ran (the group's LifeCycleConfig is OnInitComplete)"
  fi
}

wait_for_slurmd() {
  local node="$1"
  wait_for_slurmctld
  if ! wait_until "${MOE_LC_SLURM_WAIT_S}" "node ${node} to register with slurmctld" slurmd_registered "${node}"; then
    die "node ${node} did not register with slurmctld within ${MOE_LC_SLURM_WAIT_S}s (its State stays UNKNOWN or not responding): check this node's slurmd (systemctl status slurmd) and that its Slurm node name is its short host name"
  fi
}

# slurm_user: the SlurmUser of the running Slurm, from `scontrol show config` ("SlurmUser = slurm(64030)").
# AWS's sources leave it open: its HyperPod accounting scripts write SlurmUser=slurm and chown Slurm's
# files to slurm:slurm (awslabs/awsome-distributed-ai at 95b939c, 1.architectures/5.sagemaker-hyperpod/
# LifecycleScripts/base-config/setup_rds_accounting.sh and setup_mariadb_accounting.sh); nothing says the
# AMI's own slurm.conf does. So both are handled, and the tests run both.
slurm_user() {
  # awk reads to the end: an early exit would kill scontrol with SIGPIPE, and pipefail fail the step.
  scontrol show config 2>/dev/null | awk '$1 == "SlurmUser" && !found { sub(/\(.*/, "", $3); print $3; found = 1 }'
}

# as_slurm_user cmd args...: run "$@" as SlurmUser, for what Slurm allows SlurmUser (or root, when
# SlurmUser is root) alone: `strigger --set` (strigger(1): triggers "can only be set by SlurmUser,
# unless SlurmUser is configured as user root"; measured on Slurm 22.05, root gets "Access/permission
# denied" under SlurmUser=slurm). runuser keeps the environment (SLURM_CONF, PATH).
as_slurm_user() {
  local user
  user="$(slurm_user)"
  if [[ -z "${user}" || "${user}" == "root" || "$(id -un)" == "${user}" ]]; then
    "$@"
  else
    runuser -u "${user}" -- "$@"
  fi
}

# run_step NAME cmd args...
# Runs "$@" with MOE_LC_STEP=NAME (exported, so a child script logs under the same step) and
# logs how long it took. A failure is not caught here: the ERR trap reports it and exits.
run_step() {
  local name="$1" previous="${MOE_LC_STEP}"
  shift
  MOE_LC_STEP="${name}"
  MOE_LC_STEP_CMD="$*"
  MOE_LC_STEP_STARTED="${SECONDS}"
  log "step started: $*"
  "$@"
  log "step finished in $((SECONDS - MOE_LC_STEP_STARTED))s"
  step_record ok
  MOE_LC_STEP="${previous}"
  MOE_LC_STEP_CMD=""
  MOE_LC_STEP_STARTED=""
}

# json_string TEXT: TEXT as a JSON string (quotes, backslashes and control characters escaped).
json_string() {
  local text="$1"
  text="${text//\\/\\\\}"
  text="${text//\"/\\\"}"
  text="${text//$'\n'/\\n}"
  text="${text//$'\r'/\\r}"
  text="${text//$'\t'/\\t}"
  printf '"%s"' "${text}"
}

# step_node: this node's name in step records: its instance id once node_info is known, before
# that the DMI asset tag HyperPod sets (what node_info.py reads), else the host name.
step_node() {
  local tag="${MOE_LC_ROOT}/sys/devices/virtual/dmi/id/board_asset_tag" id=""
  if [[ -n "${MOE_INSTANCE_ID:-}" ]]; then
    id="${MOE_INSTANCE_ID}"
  elif [[ -r "${tag}" ]]; then
    id="$(tr -d '[:space:]' <"${tag}")"
  fi
  printf '%s' "${id:-$(hostname -s 2>/dev/null || echo unknown)}"
}

# step_record OUTCOME [HINT]: the step record of the current step (see the header).
step_record() {
  local outcome="$1" hint="${2:-}" record
  record="{\"node\":$(json_string "$(step_node)"),\"group\":$(json_string "${MOE_NODE_GROUP:-}"),"
  record+="\"step\":$(json_string "${MOE_LC_STEP}"),\"outcome\":\"${outcome}\","
  record+="\"seconds\":$((SECONDS - ${MOE_LC_STEP_STARTED:-${SECONDS}}))"
  if [[ -n "${hint}" ]]; then
    record+=",\"hint\":$(json_string "${hint}")"
  fi
  log "${MOE_LC_RECORD_MARK} ${record}}"
}

# step_hint STEP: what to do when STEP failed, for the step record.
step_hint() {
  case "$1" in
    validate) echo "provisioning_parameters.json is generated by the CDK construct: fix the configuration and redeploy the cluster stack instead of editing the file (each wrong key is listed above)" ;;
    node_info) echo "this instance is not in /opt/ml/config/resource_config.json, or its instance group is not in provisioning_parameters.json: the cluster's instance groups and the configuration must have the same names (redeploy the cluster stack)" ;;
    efa_env) echo "could not write /etc/profile.d/moe-cdk-efa.sh: check that the root volume is writable and not full" ;;
    mount_fsx) echo "check that the file system is AVAILABLE, that the SSM parameters it names exist, and that the node and file-system security groups allow TCP 988 and 1018-1023 both ways (docs/operations.md)" ;;
    setup_enroot) echo "enroot could not be found or installed: the node needs it for srun --container-image (check the node's internet route through the NAT gateway for the pinned download, or use an AMI that ships enroot)" ;;
    setup_pyxis) echo "pyxis could not be registered with Slurm: check /opt/slurm/etc/plugstack.conf on the controller and that Slurm's headers are under /opt/slurm/include" ;;
    slurm_features) echo "the node's Slurm features could not be set: check that slurmctld runs on the controller (systemctl status slurmctld) and this node's slurmd (systemctl status slurmd)" ;;
    teams) echo "the teams could not be set up: check slurmdbd on the controller (systemctl status slurmdbd; sacctmgr show cluster), that /fsx is mounted, and the teams section of the configuration" ;;
    observability) echo "the exporters or the metrics agent could not start: check Docker (systemctl status docker), the node role's ECR and SSM permissions, and the remote-write parameter; or set observability.enabled: false" ;;
    setup_containerd) echo "containerd's data could not be moved to the data disk: check containerd's configuration and that the disk is mounted" ;;
    *) echo "see the diagnostics above" ;;
  esac
}
# The diagnostics printed once per failure. A child script (run by run_step) prints them and
# leaves a mark; the parent's trap then prints one line instead of repeating them.
moe_lc_diagnostics() {
  local rc="$1" line="$2" command="$3"
  printf '\n===== moe-cdk lifecycle: FAILED =====\n'
  printf 'step:        %s\n' "${MOE_LC_STEP}"
  printf 'command:     %s\n' "${command}"
  printf 'location:    %s line %s\n' "${MOE_LC_FAILED_SOURCE:-$0}" "${line}"
  printf 'exit status: %s\n' "${rc}"
  printf '\n----- mount table (lustre, nvme) -----\n'
  mount 2>&1 | grep -E 'lustre|nvme' || true
  if command -v findmnt >/dev/null 2>&1; then
    printf '\n----- findmnt -----\n'
    findmnt 2>&1 || true
  fi
  if command -v lctl >/dev/null 2>&1; then
    printf '\n----- lctl list_nids -----\n'
    lctl list_nids 2>&1 || true
  fi
  printf '\n----- last 50 lines of %s -----\n' "${MOE_LC_LOG}"
  tail -n 50 -- "${MOE_LC_LOG}" 2>&1 || true
  printf '===== end of diagnostics =====\n'
}

moe_lc_on_err() {
  local rc="$1" line="$2" command="$3" what
  trap - ERR
  set +e
  if [[ "${command}" == return* && -n "${MOE_LC_FAILED_CMD}" ]]; then
    command="${MOE_LC_FAILED_CMD}"
  elif [[ "${command}" == '"$@"' && -n "${MOE_LC_STEP_CMD}" ]]; then
    command="${MOE_LC_STEP_CMD}"
  fi
  if [[ -n "${MOE_LC_DIAG_MARK:-}" && -s "${MOE_LC_DIAG_MARK}" ]]; then
    log "ERROR: step ${MOE_LC_STEP} failed with exit status ${rc} (diagnostics above)" >&2
    what="$(sed -n 2p -- "${MOE_LC_DIAG_MARK}" 2>/dev/null)"
  else
    log "ERROR: step ${MOE_LC_STEP} failed: '${command}' (${MOE_LC_FAILED_SOURCE:-$0} line ${line}) exited with ${rc}" >&2
    moe_lc_diagnostics "${rc}" "${line}" "${command}" >&2
    # A die message says what was wrong and what to do; any other failure names its command.
    if [[ "${command}" == "die "* ]]; then
      what="${command#die }"
    else
      what="'${command}' exited with ${rc}; $(step_hint "${MOE_LC_STEP}")"
    fi
    if [[ -n "${MOE_LC_DIAG_MARK:-}" ]]; then
      printf '%s\n%s\n' "${MOE_LC_STEP}" "${what//$'\n'/ }" >"${MOE_LC_DIAG_MARK}" 2>/dev/null
    fi
  fi
  # The outermost script (on_create.sh) writes the failed step's record, once.
  if [[ -n "${MOE_LC_OUTERMOST:-}" && -n "${MOE_LC_STEP_STARTED}" ]]; then
    step_record failed "${what}" >&2
  fi
  exit "${rc}"
}

install_err_trap() {
  set -Eeuo pipefail
  shopt -s inherit_errexit
  if [[ -z "${MOE_LC_DIAG_MARK:-}" ]]; then
    # The outermost script owns the mark file that tells parents "diagnostics already printed"
    # (line 1: the step, line 2: what failed, for the step record).
    MOE_LC_DIAG_MARK="$(mktemp "${TMPDIR:-/tmp}/moe-cdk-lifecycle-diag.XXXXXX")"
    MOE_LC_OUTERMOST=1
    export MOE_LC_DIAG_MARK
    trap 'rm -f -- "${MOE_LC_DIAG_MARK}"' EXIT
  fi
  trap 'MOE_LC_FAILED_SOURCE="${BASH_SOURCE[0]:-$0}" moe_lc_on_err "$?" "${LINENO}" "${BASH_COMMAND}"' ERR
}

# load_kv cmd args...: read KEY=value lines printed by cmd into variables MOE_<KEY>.
# node_info.py only prints values from a safe character set, so a line is taken literally:
# no eval, no sourcing.
load_kv() {
  local output line key value rc=0
  output="$("$@")" || rc=$?
  if ((rc != 0)); then
    MOE_LC_FAILED_CMD="$*"
    log "ERROR: '$*' exited with ${rc}"
    return "${rc}"
  fi
  while IFS= read -r line; do
    [[ -n "${line}" ]] || continue
    key="${line%%=*}"
    value="${line#*=}"
    if [[ "${line}" != *=* || ! "${key}" =~ ^[A-Z][A-Z0-9_]*$ || ! "${value}" =~ ^[A-Za-z0-9_.,:/@%+=-]*$ ]]; then
      die "unexpected line from $*: '${line}'"
    fi
    printf -v "MOE_${key}" '%s' "${value}"
  done <<<"${output}"
  MOE_LC_KV_OUTPUT="${output}"
}

# Sets MOE_NODE_GROUP, MOE_NODE_ROLE, MOE_PARTITION, MOE_FEATURES, MOE_INSTANCE_TYPE, MOE_INSTANCE_ID,
# MOE_LUSTRE_EFA_INTERFACES.
# shellcheck disable=SC2034 # read by the scripts that source this file
MOE_NODE_GROUP="" MOE_NODE_ROLE="" MOE_PARTITION="" MOE_FEATURES="" MOE_INSTANCE_TYPE="" MOE_INSTANCE_ID=""
# shellcheck disable=SC2034
MOE_LUSTRE_EFA_INTERFACES=0
load_node_facts() {
  if [[ -n "${MOE_LC_NODE_FACTS:-}" ]]; then
    load_kv printf '%s\n' "${MOE_LC_NODE_FACTS}"
    return
  fi
  if [[ -n "${MOE_LC_NODE_GROUP:-}" ]]; then
    load_kv python3 "${MOE_LC_LIB_DIR}/node_info.py" --group "${MOE_LC_NODE_GROUP}" "${MOE_LC_PARAMS}"
  else
    load_kv python3 "${MOE_LC_LIB_DIR}/node_info.py" "${MOE_LC_RESOURCE_CONFIG}" "${MOE_LC_PARAMS}"
  fi
  export MOE_LC_NODE_FACTS="${MOE_LC_KV_OUTPUT}"
}

# Sets MOE_CLUSTER_MANAGER (hyperpod or parallelcluster), MOE_WORKLOAD_MANAGER (slurm or eks),
# MOE_REGION, MOE_FSX_ENABLED,
# MOE_FSX_DNS_NAME_PARAMETER, MOE_FSX_MOUNT_NAME_PARAMETER, MOE_FSX_MOUNT_POINT, and
# MOE_ENROOT_DATA_DIR, MOE_PYXIS (Slurm) or MOE_CONTAINERD_DATA_DIR, MOE_CONTAINERD_FALLBACK_DIR (EKS),
# and MOE_OBSERVABILITY_ENABLED (true or false), MOE_OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER,
# MOE_OBSERVABILITY_SCRAPE_INTERVAL_S, MOE_OBSERVABILITY_TRAINER_METRICS_PORT (empty: no trainer target).
# shellcheck disable=SC2034 # read by the scripts that source this file
MOE_CLUSTER_MANAGER="" MOE_REGION="" MOE_FSX_ENABLED=""
# shellcheck disable=SC2034
MOE_FSX_DNS_NAME_PARAMETER="" MOE_FSX_MOUNT_NAME_PARAMETER=""
# shellcheck disable=SC2034
MOE_FSX_MOUNT_POINT="" MOE_ENROOT_DATA_DIR="" MOE_PYXIS=""
# shellcheck disable=SC2034
MOE_WORKLOAD_MANAGER="" MOE_CONTAINERD_DATA_DIR="" MOE_CONTAINERD_FALLBACK_DIR=""
# shellcheck disable=SC2034
MOE_OBSERVABILITY_ENABLED="" MOE_OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER=""
# shellcheck disable=SC2034
MOE_OBSERVABILITY_SCRAPE_INTERVAL_S="" MOE_OBSERVABILITY_TRAINER_METRICS_PORT=""
load_params() {
  if [[ -n "${MOE_LC_CLUSTER_SETTINGS:-}" ]]; then
    load_kv printf '%s\n' "${MOE_LC_CLUSTER_SETTINGS}"
  else
    load_kv python3 "${MOE_LC_LIB_DIR}/node_info.py" --params "${MOE_LC_PARAMS}"
    export MOE_LC_CLUSTER_SETTINGS="${MOE_LC_KV_OUTPUT}"
  fi
}

# replace_if_changed NEW TARGET MODE: when NEW (a file written beside TARGET) equals TARGET,
# remove NEW and return 1; otherwise chmod NEW to MODE (an octal mode, or
# --reference=FILE) and move it over TARGET in one rename, returning 0.
replace_if_changed() {
  local new="$1" target="$2" mode="$3"
  if [[ -f "${target}" ]] && cmp -s -- "${new}" "${target}"; then
    rm -f -- "${new}"
    return 1
  fi
  chmod "${mode}" -- "${new}"
  mv -f -- "${new}" "${target}"
}

# The instance-store NVMe of GPU and Trainium instances on HyperPod's AMIs.
MOE_NVME_MOUNT="/opt/dlami/nvme"

# on_nvme DIR: DIR is the NVMe mount point or below it.
on_nvme() {
  [[ "$1" == "${MOE_NVME_MOUNT}" || "$1" == "${MOE_NVME_MOUNT}/"* ]]
}

# nvme_mounted: the NVMe is mounted (so data under it does not land on the root volume).
nvme_mounted() {
  mountpoint -q "${MOE_LC_ROOT}${MOE_NVME_MOUNT}"
}

# The DLAMI's unit that formats and mounts the NVMe, and how long to wait for it: AWS's reference
# waits up to 120 s for it "to combat race condition" before pointing enroot at the NVMe
# (aws-samples/awsome-distributed-training at 7217859, base-config/utils/install_enroot_pyxis.sh),
# and its EKS sample 60 s for the disk (7.sagemaker-hyperpod-eks/.../on_create_main.sh).
readonly MOE_NVME_UNIT="dlami-nvme"
MOE_LC_NVME_WAIT_S="${MOE_LC_NVME_WAIT_S:-120}"

nvme_unit_exists() {
  local state
  state="$(systemctl show "${MOE_NVME_UNIT}" -p LoadState 2>/dev/null)" || return 1
  grep -qx 'LoadState=loaded' <<<"${state}"
}

# nvme_unit_done: the unit ran to the end (ActiveState=active, ExecMainStatus=0), mounted or not.
nvme_unit_done() {
  local state
  state="$(systemctl show "${MOE_NVME_UNIT}" -p ActiveState -p ExecMainStatus 2>/dev/null)"
  [[ "${state}" == *"ActiveState=active"* && "${state}" == *"ExecMainStatus=0"* ]]
}

nvme_settled() {
  nvme_mounted || nvme_unit_done
}

# wait_for_nvme: when the NVMe is not mounted yet and the DLAMI's unit exists, wait (MOE_LC_NVME_WAIT_S)
# until it is mounted or the unit has finished. Returns 0 either way: the callers decide what an
# unmounted NVMe means (a warning and another folder), from nvme_mounted.
wait_for_nvme() {
  if nvme_mounted || ! nvme_unit_exists; then
    return 0
  fi
  wait_until "${MOE_LC_NVME_WAIT_S}" "${MOE_NVME_UNIT}.service to mount ${MOE_NVME_MOUNT}" nvme_settled || true
}
