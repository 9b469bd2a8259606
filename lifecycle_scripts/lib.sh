#!/usr/bin/env bash
# lib.sh: helpers shared by the lifecycle scripts. Sourced, never executed.
#
#   log MESSAGE...                 timestamped line on stdout, appended to the log file
#   warn MESSAGE...                log "WARNING: ..."
#   die MESSAGE...                 log "ERROR: ...", then fail (the ERR trap reports it)
#   retry ATTEMPTS DELAY cmd...    run cmd until it succeeds; the delay doubles after each failure
#   run_step NAME cmd...           run cmd as the step NAME (used in log lines and the ERR trap)
#   install_err_trap               on the first failing command, print diagnostics and exit
#   load_node_facts / load_params  node_info.py's KEY=value lines into MOE_<KEY> variables
#   replace_if_changed NEW TARGET MODE
#                                  move NEW over TARGET (chmod MODE first) unless they are equal
#   on_nvme DIR / nvme_mounted     DIR is on the instance NVMe / the NVMe is mounted
#
# Environment (all optional; the tests use them to run in a sandbox):
#   MOE_LC_ROOT                prefix for every system path ("" on a real node)
#   MOE_LC_LOG                 log file (default ${MOE_LC_ROOT}/var/log/provision/moe-cdk-lifecycle.log)
#   MOE_LC_PARAMS              provisioning_parameters.json (default: next to this file)
#   MOE_LC_RESOURCE_CONFIG     HyperPod's resource_config.json
#                              (default ${MOE_LC_ROOT}/opt/ml/config/resource_config.json)
#   MOE_LC_RETRY_DELAY_SCALE   integer multiplier for retry delays (default 1; 0 in tests)
#   MOE_LC_STEP                current step name, exported by run_step to child scripts
set -euo pipefail

MOE_LC_ROOT="${MOE_LC_ROOT:-}"
MOE_LC_LIB_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
MOE_LC_LOG="${MOE_LC_LOG:-${MOE_LC_ROOT}/var/log/provision/moe-cdk-lifecycle.log}"
MOE_LC_PARAMS="${MOE_LC_PARAMS:-${MOE_LC_LIB_DIR}/provisioning_parameters.json}"
MOE_LC_RESOURCE_CONFIG="${MOE_LC_RESOURCE_CONFIG:-${MOE_LC_ROOT}/opt/ml/config/resource_config.json}"
MOE_LC_RETRY_DELAY_SCALE="${MOE_LC_RETRY_DELAY_SCALE:-1}"
# The step of a script run on its own is the script's name (mount_fsx.sh -> mount_fsx).
MOE_LC_STEP="${MOE_LC_STEP:-$(basename -- "$0" .sh)}"
export MOE_LC_ROOT MOE_LC_LOG MOE_LC_PARAMS MOE_LC_RESOURCE_CONFIG MOE_LC_RETRY_DELAY_SCALE MOE_LC_STEP
# The command that made retry or die fail, shown by the ERR trap instead of "return 1".
MOE_LC_FAILED_CMD=""
# The command run_step is running, shown by the ERR trap instead of "$@".
MOE_LC_STEP_CMD=""

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

# run_step NAME cmd args...
# Runs "$@" with MOE_LC_STEP=NAME (exported, so a child script logs under the same step) and
# logs how long it took. A failure is not caught here: the ERR trap reports it and exits.
run_step() {
  local name="$1" previous="${MOE_LC_STEP}" started="${SECONDS}"
  shift
  MOE_LC_STEP="${name}"
  MOE_LC_STEP_CMD="$*"
  log "step started: $*"
  "$@"
  log "step finished in $((SECONDS - started))s"
  MOE_LC_STEP="${previous}"
  MOE_LC_STEP_CMD=""
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
  local rc="$1" line="$2" command="$3"
  trap - ERR
  set +e
  if [[ "${command}" == return* && -n "${MOE_LC_FAILED_CMD}" ]]; then
    command="${MOE_LC_FAILED_CMD}"
  elif [[ "${command}" == '"$@"' && -n "${MOE_LC_STEP_CMD}" ]]; then
    command="${MOE_LC_STEP_CMD}"
  fi
  if [[ -n "${MOE_LC_DIAG_MARK:-}" && -s "${MOE_LC_DIAG_MARK}" ]]; then
    log "ERROR: step ${MOE_LC_STEP} failed with exit status ${rc} (diagnostics above)" >&2
  else
    log "ERROR: step ${MOE_LC_STEP} failed: '${command}' (${MOE_LC_FAILED_SOURCE:-$0} line ${line}) exited with ${rc}" >&2
    moe_lc_diagnostics "${rc}" "${line}" "${command}" >&2
    if [[ -n "${MOE_LC_DIAG_MARK:-}" ]]; then
      printf '%s\n' "${MOE_LC_STEP}" >"${MOE_LC_DIAG_MARK}" 2>/dev/null
    fi
  fi
  exit "${rc}"
}

install_err_trap() {
  set -Eeuo pipefail
  shopt -s inherit_errexit
  if [[ -z "${MOE_LC_DIAG_MARK:-}" ]]; then
    # The outermost script owns the mark file that tells parents "diagnostics already printed".
    MOE_LC_DIAG_MARK="$(mktemp "${TMPDIR:-/tmp}/moe-cdk-lifecycle-diag.XXXXXX")"
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
}

# Sets MOE_NODE_GROUP, MOE_NODE_ROLE, MOE_PARTITION, MOE_FEATURES, MOE_INSTANCE_TYPE, MOE_INSTANCE_ID,
# MOE_LUSTRE_EFA_INTERFACES.
# shellcheck disable=SC2034 # read by the scripts that source this file
MOE_NODE_GROUP="" MOE_NODE_ROLE="" MOE_PARTITION="" MOE_FEATURES="" MOE_INSTANCE_TYPE="" MOE_INSTANCE_ID=""
# shellcheck disable=SC2034
MOE_LUSTRE_EFA_INTERFACES=0
load_node_facts() {
  load_kv python3 "${MOE_LC_LIB_DIR}/node_info.py" "${MOE_LC_RESOURCE_CONFIG}" "${MOE_LC_PARAMS}"
}

# Sets MOE_WORKLOAD_MANAGER (slurm or eks), MOE_REGION, MOE_FSX_ENABLED,
# MOE_FSX_DNS_NAME_PARAMETER, MOE_FSX_MOUNT_NAME_PARAMETER, MOE_FSX_MOUNT_POINT, and
# MOE_ENROOT_DATA_DIR, MOE_PYXIS (Slurm) or MOE_CONTAINERD_DATA_DIR, MOE_CONTAINERD_FALLBACK_DIR (EKS),
# and MOE_OBSERVABILITY_ENABLED (true or false), MOE_OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER,
# MOE_OBSERVABILITY_SCRAPE_INTERVAL_S, MOE_OBSERVABILITY_TRAINER_METRICS_PORT (empty: no trainer target).
# shellcheck disable=SC2034 # read by the scripts that source this file
MOE_REGION="" MOE_FSX_ENABLED="" MOE_FSX_DNS_NAME_PARAMETER="" MOE_FSX_MOUNT_NAME_PARAMETER=""
# shellcheck disable=SC2034
MOE_FSX_MOUNT_POINT="" MOE_ENROOT_DATA_DIR="" MOE_PYXIS=""
# shellcheck disable=SC2034
MOE_WORKLOAD_MANAGER="" MOE_CONTAINERD_DATA_DIR="" MOE_CONTAINERD_FALLBACK_DIR=""
# shellcheck disable=SC2034
MOE_OBSERVABILITY_ENABLED="" MOE_OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER=""
# shellcheck disable=SC2034
MOE_OBSERVABILITY_SCRAPE_INTERVAL_S="" MOE_OBSERVABILITY_TRAINER_METRICS_PORT=""
load_params() {
  load_kv python3 "${MOE_LC_LIB_DIR}/node_info.py" --params "${MOE_LC_PARAMS}"
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
