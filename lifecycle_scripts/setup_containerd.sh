#!/usr/bin/env bash
# setup_containerd.sh: put containerd's data (images, snapshots, container layers) on the
# instance NVMe. EKS clusters only ("workload_manager": "eks"); does nothing on Slurm.
#
# The data root is container_runtime.containerd_data_dir when /opt/dlami/nvme is a mount
# point, otherwise container_runtime.fallback_data_dir (on HyperPod, /opt/sagemaker is the
# instance group's EBS volume), with a WARNING naming both. A containerd_data_dir outside
# /opt/dlami/nvme is used as it is.
#
# Only the top-level `root = "..."` line of /etc/containerd/config.toml is written (a
# top-level key is one before the first [section] header); every other line is kept. When the
# file already names the directory, nothing changes and containerd is not restarted;
# otherwise the file is replaced (temporary file + mv) and containerd restarted.
# Downloads nothing: containerd and its config.toml come with HyperPod's EKS AMI.
#
# Paths on the command line carry ${MOE_LC_ROOT} (so tests can run in a sandbox); the root
# line names the directory as the node sees it (no prefix).
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly CONTAINERD_CONFIG="/etc/containerd/config.toml"

# Set by choose_data_dir and write_config.
DATA_DIR=""
CONFIG_CHANGED=false

choose_data_dir() {
  local wanted="${MOE_CONTAINERD_DATA_DIR}" fallback="${MOE_CONTAINERD_FALLBACK_DIR}"
  if ! on_nvme "${wanted}"; then
    DATA_DIR="${wanted}"
    log "containerd data goes to ${wanted} (container_runtime.containerd_data_dir; not under ${MOE_NVME_MOUNT})"
  elif nvme_mounted; then
    DATA_DIR="${wanted}"
    log "containerd data goes to the instance NVMe: ${wanted}"
  else
    DATA_DIR="${fallback}"
    warn "${MOE_NVME_MOUNT} is not a mount point, so containerd data goes to ${fallback} (container_runtime.fallback_data_dir) instead of ${wanted} (container_runtime.containerd_data_dir)"
  fi
}

# make_data_dir DIR: containerd creates its root with mode 0711; so does this.
make_data_dir() {
  local dir="${MOE_LC_ROOT}$1"
  mkdir -p -- "${dir}"
  chmod 711 -- "${dir}"
}

# desired_config DIR CONF: CONF with its top-level root set to DIR, on stdout. A root line
# that already names DIR (in either quote style) is printed unchanged; a missing one is
# inserted as the first line; a repeated one (which containerd would reject) is dropped.
desired_config() {
  local dir="$1" conf="$2"
  awk -v dir="${dir}" '
    BEGIN { want = "root = \"" dir "\"" }
    FNR == 1 { top = 1 }
    top && /^[ \t]*\[/ { top = 0 }
    # First pass: is there a top-level root key?
    NR == FNR { if (top && /^[ \t]*root[ \t]*=/) found = 1; next }
    FNR == 1 && !found { print want; inserted = 1 }
    top && /^[ \t]*root[ \t]*=/ {
      if (done) next
      done = 1
      value = $0
      sub(/^[ \t]*root[ \t]*=[ \t]*/, "", value)
      sub(/[ \t]*(#[^"\047]*)?\r?$/, "", value)
      if (value == "\"" dir "\"" || value == "\047" dir "\047") print; else print want
      next
    }
    { print }
    END { if (!found && !inserted) print want }
  ' "${conf}" "${conf}"
}

# write_config DIR CONF: sets CONFIG_CHANGED=true when CONF had to be rewritten.
write_config() {
  local dir="$1" conf="$2" tmp
  tmp="$(mktemp "${conf}.moe-cdk.XXXXXX")"
  desired_config "${dir}" "${conf}" >"${tmp}"
  if ! replace_if_changed "${tmp}" "${conf}" --reference="${conf}"; then
    log "${conf} already has root = \"${dir}\"; not restarting containerd"
    return 0
  fi
  CONFIG_CHANGED=true
  log "${conf}: root = \"${dir}\""
}

main() {
  install_err_trap
  load_params
  if [[ "${MOE_WORKLOAD_MANAGER}" != "eks" ]]; then
    log "workload_manager is ${MOE_WORKLOAD_MANAGER}: containerd is only configured on EKS; skipping"
    return 0
  fi
  local conf="${MOE_LC_ROOT}${CONTAINERD_CONFIG}"
  if [[ ! -f "${conf}" ]]; then
    die "${CONTAINERD_CONFIG} does not exist. SageMaker HyperPod's EKS AMI ships containerd with this file; these lifecycle scripts only set its root and download nothing, so use a HyperPod EKS AMI (or an image built from one)"
  fi
  choose_data_dir
  make_data_dir "${DATA_DIR}"
  write_config "${DATA_DIR}" "${conf}"
  if [[ "${CONFIG_CHANGED}" == "true" ]]; then
    retry 5 2 systemctl restart containerd
    log "restarted containerd; its data root is now ${DATA_DIR}"
  fi
}

main "$@"
