#!/usr/bin/env bash
# setup_enroot.sh: make sure enroot is installed, point it at the instance NVMe, and fix where it
# keeps credentials.
#
# Whether enroot is already there is left open by AWS's sources: the SageMaker Developer Guide's
# "Getting started with SageMaker HyperPod using the AWS CLI" lists Enroot among what the AMI-based
# configuration sets up before OnInitComplete, while the observability extension's README says
# HyperPod sets up "Slurm and Docker", and AWS's samples install it themselves
# (aws-samples/awsome-distributed-training at 7217859, 1.architectures/5.sagemaker-hyperpod/
# LifecycleScripts/base-config/utils/install_enroot_pyxis.sh). So both cases are handled: a node
# with enroot keeps it; a node without installs what that script installs, the way it does
# (squashfs-tools, parallel, fuse-overlayfs and squashfuse from Ubuntu's archive, then NVIDIA's
# enroot and enroot+caps packages), at the versions pinned and checked in node_packages.txt
# (packages.sh). A failed install stops the node with a hint.
#
# Like AWS's reference, runtime, cache, data and temporary files go to the NVMe at /opt/dlami/nvme;
# first this waits (lib.sh wait_for_nvme, up to 120 s as that script does) for the DLAMI's
# dlami-nvme.service to mount it, since the lifecycle can run before it has. Unlike it, the cache
# stays on the node rather than on /fsx: a shared cache needs locking that enroot does not do.
#
# ENROOT_CONFIG_PATH is pinned to ${HOME}/.config/enroot (enroot's default when XDG_CONFIG_HOME
# is unset): AWS's sample enroot.conf moves it to ~/enroot, and the batch script writes each
# job's ECR credentials (.credentials) there, so the place must not depend on the AMI's file.
#
# enroot.conf: enroot keeps the FIRST definition of a key it reads (an ENROOT_* variable in
# the environment beats both), so the block this script owns, between "# BEGIN moe-cdk" and
# "# END moe-cdk", goes at the top of the file. Lines outside the block are never touched.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"
# shellcheck source-path=SCRIPTDIR source=packages.sh
source "${MOE_LC_DIR}/packages.sh"

readonly BEGIN_MARK="# BEGIN moe-cdk"
readonly END_MARK="# END moe-cdk"

# The Ubuntu packages AWS's install_enroot_pyxis.sh installs before enroot's own.
readonly ENROOT_DEPENDENCIES=(squashfs-tools parallel fuse-overlayfs squashfuse)

ensure_enroot() {
  if command -v enroot >/dev/null 2>&1; then
    log "enroot $(enroot version 2>/dev/null || echo '(version unknown)') at $(command -v enroot)"
    return 0
  fi
  log "enroot is not installed; installing enroot $(package_version enroot) (node_packages.txt)"
  local dir main caps
  dir="$(mktemp -d "${TMPDIR:-/tmp}/moe-cdk-enroot.XXXXXX")"
  apt_install "${ENROOT_DEPENDENCIES[@]}"
  fetch_package_file enroot "${dir}" main
  fetch_package_file enroot+caps "${dir}" caps
  apt_install "${main}" "${caps}"
  rm -rf -- "${dir}"
  if ! command -v enroot >/dev/null 2>&1; then
    die "enroot is still not on PATH after installing ${main##*/} and ${caps##*/}: check apt's output above"
  fi
  log "installed enroot $(enroot version 2>/dev/null || echo '(version unknown)') at $(command -v enroot)"
}

# check_data_dir DIR: warn when DIR is meant for the NVMe but the NVMe is not mounted.
check_data_dir() {
  local dir="$1"
  if on_nvme "${dir}"; then
    if nvme_mounted; then
      log "enroot data goes to the instance NVMe: ${dir}"
    else
      warn "${MOE_NVME_MOUNT} is not a mount point, so ${dir} is on the ROOT VOLUME; container images may fill it"
    fi
  else
    log "enroot data goes to ${dir} (container_runtime.enroot_data_dir; not under ${MOE_NVME_MOUNT})"
  fi
}

# managed_block DIR: the enroot.conf lines this script owns.
managed_block() {
  local dir="$1"
  printf '%s\n' "${BEGIN_MARK} (written by lifecycle_scripts/setup_enroot.sh; edits here are overwritten)"
  # enroot evaluates these values, so $(id -u) gives every user a private directory.
  printf 'ENROOT_RUNTIME_PATH %s\n' "${dir}/runtime/user-\$(id -u)"
  printf 'ENROOT_CACHE_PATH %s\n' "${dir}/cache/user-\$(id -u)"
  printf 'ENROOT_DATA_PATH %s\n' "${dir}/data/user-\$(id -u)"
  printf 'ENROOT_TEMP_PATH %s\n' "${dir}/tmp"
  printf 'ENROOT_CONFIG_PATH %s\n' "\${HOME}/.config/enroot"
  printf '%s\n' "${END_MARK}"
}

# write_enroot_conf DIR: our block first, then every line of the old file outside our block.
write_enroot_conf() {
  local dir="$1" conf="${MOE_LC_ROOT}/etc/enroot/enroot.conf" tmp
  mkdir -p -- "$(dirname -- "${conf}")"
  tmp="$(mktemp "${conf}.moe-cdk.XXXXXX")"
  managed_block "${dir}" >"${tmp}"
  if [[ -f "${conf}" ]]; then
    awk -v begin="${BEGIN_MARK}" -v end="${END_MARK}" '
      index($0, begin) == 1 { inside = 1; next }
      inside && $0 == end { inside = 0; next }
      !inside { print }
    ' "${conf}" >>"${tmp}"
  fi
  if ! replace_if_changed "${tmp}" "${conf}" 644; then
    log "${conf} is already up to date"
    return 0
  fi
  log "wrote ENROOT_RUNTIME_PATH, ENROOT_CACHE_PATH, ENROOT_DATA_PATH and ENROOT_TEMP_PATH under ${dir}, and ENROOT_CONFIG_PATH, to ${conf}"
}

# The shared parents are world-writable with the sticky bit, like /tmp; enroot creates each
# user's own directory below them (mode 0700).
make_data_dirs() {
  local dir="$1" sub
  for sub in runtime cache data tmp; do
    mkdir -p -- "${MOE_LC_ROOT}${dir}/${sub}"
    chmod 1777 -- "${MOE_LC_ROOT}${dir}/${sub}"
  done
}

main() {
  install_err_trap
  load_params
  if [[ "${MOE_WORKLOAD_MANAGER}" == "eks" ]]; then
    log "workload_manager is eks: pods run under containerd and there is no enroot or pyxis; skipping"
    return 0
  fi
  ensure_enroot
  local dir="${MOE_ENROOT_DATA_DIR}"
  if on_nvme "${dir}"; then
    wait_for_nvme
  fi
  check_data_dir "${dir}"
  make_data_dirs "${dir}"
  write_enroot_conf "${dir}"
}

main "$@"
