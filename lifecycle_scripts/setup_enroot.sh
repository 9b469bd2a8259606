#!/usr/bin/env bash
# setup_enroot.sh: point enroot at the instance NVMe and register pyxis with Slurm.
#
# Downloads nothing: enroot and pyxis come with HyperPod's AMI, and a node without them fails
# here rather than fetching software at boot.
#
# enroot.conf: enroot keeps the FIRST definition of a key it reads (an ENROOT_* variable in
# the environment beats both), so the block this script owns, between "# BEGIN moe-cdk" and
# "# END moe-cdk", goes at the top of the file. Lines outside the block are never touched.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly BEGIN_MARK="# BEGIN moe-cdk"
readonly END_MARK="# END moe-cdk"

require_enroot() {
  if ! command -v enroot >/dev/null 2>&1; then
    die "enroot is not installed. SageMaker HyperPod's AMI provides enroot and pyxis; these lifecycle scripts download nothing at boot, so use a HyperPod AMI (or an image built from one) that has them"
  fi
  log "enroot $(enroot version 2>/dev/null || echo '(version unknown)') at $(command -v enroot)"
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
  log "wrote ENROOT_RUNTIME_PATH, ENROOT_CACHE_PATH, ENROOT_DATA_PATH and ENROOT_TEMP_PATH under ${dir} to ${conf}"
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

setup_pyxis() {
  local plugstack_dir="${MOE_LC_ROOT}/etc/slurm/plugstack.conf.d"
  local link="${plugstack_dir}/pyxis.conf" shipped="${MOE_LC_ROOT}/usr/local/share/pyxis/pyxis.conf"
  if [[ "${MOE_PYXIS}" != "true" ]]; then
    log "container_runtime.pyxis is false; not registering pyxis with Slurm"
    return 0
  fi
  if [[ -e "${link}" ]]; then
    log "pyxis is already registered: ${link}"
  elif [[ -e "${shipped}" ]]; then
    mkdir -p -- "${plugstack_dir}"
    ln -sfn -- "${shipped}" "${link}"
    log "registered pyxis: ${link} -> ${shipped}"
  else
    warn "pyxis is not installed (neither ${link} nor ${shipped} exists); srun --container-image will not work"
    return 0
  fi
  local plugstack="${MOE_LC_ROOT}/etc/slurm/plugstack.conf"
  if [[ -f "${plugstack}" ]] && ! grep -q 'plugstack\.conf\.d' "${plugstack}"; then
    warn "${plugstack} does not include plugstack.conf.d/*; Slurm will not load pyxis"
  fi
}

main() {
  install_err_trap
  load_params
  if [[ "${MOE_WORKLOAD_MANAGER}" == "eks" ]]; then
    log "workload_manager is eks: pods run under containerd and there is no enroot or pyxis; skipping"
    return 0
  fi
  require_enroot
  local dir="${MOE_ENROOT_DATA_DIR}"
  check_data_dir "${dir}"
  make_data_dirs "${dir}"
  write_enroot_conf "${dir}"
  setup_pyxis
}

main "$@"
