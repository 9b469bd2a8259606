#!/usr/bin/env bash
# setup_containerd.sh: put containerd's data (images, snapshots, container layers) and the
# kubelet's folder (pod volumes, logs) on the instance NVMe. EKS clusters only
# ("workload_manager": "eks"); does nothing on Slurm.
#
# The data root is container_runtime.containerd_data_dir when /opt/dlami/nvme is a mount
# point, otherwise container_runtime.fallback_data_dir (on HyperPod, /opt/sagemaker is the
# instance group's EBS volume), with a WARNING naming both. A containerd_data_dir outside
# /opt/dlami/nvme is used as it is. The kubelet's folder goes beside it (<parent>/kubelet).
#
# Source: AWS's EKS lifecycle sample (aws-samples/awsome-distributed-training,
# 1.architectures/7.sagemaker-hyperpod-eks/LifecycleScripts/base-config/on_create_main.sh at
# 7217859) tells the EKS AMIs apart by /etc/os-release's VERSION_ID:
#   Amazon Linux 2     bootstrap.sh installs /etc/eks/containerd/containerd-config.toml as
#                      /etc/containerd/config.toml when the node joins, so the template's
#                      top-level root is what counts (the sample edits it too); the live file
#                      is set as well when it already exists.
#   Amazon Linux 2023  nodeadm generates /etc/containerd/config.toml and overwrites edits. The
#                      sample replaces nodeadm's whole configuration with a static one through
#                      a systemd override; this keeps nodeadm's file and only overrides the
#                      root, with containerd's own --root flag in a drop-in.
#   anything else      the top-level root of /etc/containerd/config.toml.
# and, on both, moves /var/lib/kubelet to the data disk behind a symlink, as the sample does.
# containerd is restarted only when something changed (and, on AL2023, only if it runs).
# Downloads nothing.
#
# The images already in containerd's old root (/var/lib/containerd) are copied into an empty new
# root before containerd starts on it, with containerd stopped while they are copied: the AL2023
# AMI's pause image (the sandbox image, localhost/kubernetes/pause) lives there and cannot be
# pulled, so a new root without it leaves every pod unable to start (AWS's EKS sample, commit
# 6ed2802f, "Update containerd config for local pause image and data migration", runs
# `cp -a /var/lib/containerd` into its new root). The sample copies on AL2023 only; this copies on
# every AMI, since an image that is there need not be pulled again.
#
# The disk is waited for first (lib.sh wait_for_nvme): the sample waits up to 60 s for it.
#
# Only the top-level `root = "..."` line of a config.toml is written (a top-level key is one
# before the first [section] header); every other line is kept. Paths on the command line
# carry ${MOE_LC_ROOT} (so tests can run in a sandbox); the files name the directory as the node
# sees it (no prefix).
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly CONTAINERD_CONFIG="/etc/containerd/config.toml"
readonly AL2_TEMPLATE="/etc/eks/containerd/containerd-config.toml"
readonly AL2023_DROP_IN="/etc/systemd/system/containerd.service.d/10-moe-cdk-root.conf"
readonly KUBELET_DIR="/var/lib/kubelet"
readonly OLD_ROOT="/var/lib/containerd"

# Set by choose_data_dir, write_config and copy_old_root.
DATA_DIR=""
CONFIG_CHANGED=false
STOPPED_CONTAINERD=false

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
    log "${conf} already has root = \"${dir}\""
    return 0
  fi
  CONFIG_CHANGED=true
  log "${conf}: root = \"${dir}\""
}

# amazon_linux: "2", "2023", or "" for another OS (from /etc/os-release).
amazon_linux() {
  local release="${MOE_LC_ROOT}/etc/os-release" id="" version=""
  if [[ -f "${release}" ]]; then
    id="$(awk -F= '$1 == "ID" { gsub(/"/, "", $2); print $2 }' "${release}")"
    version="$(awk -F= '$1 == "VERSION_ID" { gsub(/"/, "", $2); print $2 }' "${release}")"
  fi
  if [[ "${id}" == "amzn" && ("${version}" == "2" || "${version}" == "2023") ]]; then
    printf '%s' "${version}"
  fi
}

# set_root_in FILE: FILE's top-level root becomes DATA_DIR (CONFIG_CHANGED=true when rewritten).
set_root_in() {
  local conf="${MOE_LC_ROOT}$1"
  if [[ ! -f "${conf}" ]]; then
    die "$1 does not exist. SageMaker HyperPod's EKS AMI ships containerd with this file; these lifecycle scripts only set its root and download nothing, so use a HyperPod EKS AMI (or an image built from one)"
  fi
  write_config "${DATA_DIR}" "${conf}"
}

# write_drop_in: the AL2023 systemd drop-in that starts containerd with --root DATA_DIR.
write_drop_in() {
  local target="${MOE_LC_ROOT}${AL2023_DROP_IN}" tmp
  mkdir -p -- "$(dirname -- "${target}")"
  tmp="$(mktemp "${target}.moe-cdk.XXXXXX")"
  printf '%s\n' "# Written by lifecycle_scripts/setup_containerd.sh: containerd's data on ${DATA_DIR}." \
    "[Service]" "ExecStart=" "ExecStart=/usr/bin/containerd --root ${DATA_DIR}" >"${tmp}"
  if ! replace_if_changed "${tmp}" "${target}" 644; then
    log "${AL2023_DROP_IN} already starts containerd with --root ${DATA_DIR}"
    return 0
  fi
  CONFIG_CHANGED=true
  log "${AL2023_DROP_IN}: containerd --root ${DATA_DIR}"
  retry 5 2 systemctl daemon-reload
}

# copy_old_root: the old root's content into DATA_DIR when DATA_DIR is empty and the old root is not.
copy_old_root() {
  local old="${MOE_LC_ROOT}${OLD_ROOT}" new="${MOE_LC_ROOT}${DATA_DIR}"
  if [[ "${DATA_DIR}" == "${OLD_ROOT}" || ! -d "${old}" || -z "$(ls -A -- "${old}")" ]]; then
    return 0
  fi
  if [[ -n "$(ls -A -- "${new}")" ]]; then
    log "${DATA_DIR} already holds containerd data; ${OLD_ROOT} is not copied again"
    return 0
  fi
  if systemctl is-active --quiet containerd; then
    retry 5 2 systemctl stop containerd
    STOPPED_CONTAINERD=true
  fi
  cp -a -- "${old}/." "${new}/"
  log "copied ${OLD_ROOT} (the AMI's images, the pause image among them) into ${DATA_DIR}"
}

# move_kubelet_dir: /var/lib/kubelet becomes a symlink to <parent of DATA_DIR>/kubelet.
move_kubelet_dir() {
  local link="${MOE_LC_ROOT}${KUBELET_DIR}" target
  target="$(dirname -- "${DATA_DIR}")/kubelet"
  if [[ -L "${link}" && "$(readlink -- "${link}")" == "${target}" ]]; then
    log "${KUBELET_DIR} already points to ${target}"
    return 0
  fi
  if systemctl is-active --quiet kubelet; then
    warn "kubelet is running, so ${KUBELET_DIR} stays where it is (moving it would break running pods)"
    return 0
  fi
  mkdir -p -- "${MOE_LC_ROOT}${target}" "$(dirname -- "${link}")"
  if [[ -d "${link}" && ! -L "${link}" ]]; then
    # Dotfiles too; then the empty folder makes way for the link.
    find "${link}" -mindepth 1 -maxdepth 1 -exec mv -t "${MOE_LC_ROOT}${target}" -- {} +
    rmdir -- "${link}"
  fi
  ln -sfn -- "${target}" "${link}"
  log "${KUBELET_DIR} -> ${target}"
}

main() {
  install_err_trap
  load_params
  if [[ "${MOE_WORKLOAD_MANAGER}" != "eks" ]]; then
    log "workload_manager is ${MOE_WORKLOAD_MANAGER}: containerd is only configured on EKS; skipping"
    return 0
  fi
  local os
  os="$(amazon_linux)"
  if on_nvme "${MOE_CONTAINERD_DATA_DIR}"; then
    wait_for_nvme
  fi
  choose_data_dir
  case "${os}" in
    2)
      log "Amazon Linux 2: bootstrap.sh installs ${AL2_TEMPLATE} as ${CONTAINERD_CONFIG}"
      set_root_in "${AL2_TEMPLATE}"
      if [[ -f "${MOE_LC_ROOT}${CONTAINERD_CONFIG}" ]]; then
        set_root_in "${CONTAINERD_CONFIG}"
      fi
      ;;
    2023)
      log "Amazon Linux 2023: nodeadm writes ${CONTAINERD_CONFIG}, so the root goes on containerd's command line"
      write_drop_in
      ;;
    *) set_root_in "${CONTAINERD_CONFIG}" ;;
  esac
  make_data_dir "${DATA_DIR}"
  copy_old_root
  move_kubelet_dir
  if [[ "${STOPPED_CONTAINERD}" == "true" ]]; then
    retry 5 2 systemctl start containerd
    log "started containerd again; its data root is now ${DATA_DIR}"
  elif [[ "${CONFIG_CHANGED}" != "true" ]]; then
    log "containerd's data root is already ${DATA_DIR}; not restarting containerd"
  elif [[ "${os}" == "2023" ]] && ! systemctl is-active --quiet containerd; then
    log "containerd is not running; it starts with its data root at ${DATA_DIR}"
  else
    retry 5 2 systemctl restart containerd
    log "restarted containerd; its data root is now ${DATA_DIR}"
  fi
}

main "$@"
