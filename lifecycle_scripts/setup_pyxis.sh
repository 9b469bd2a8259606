#!/usr/bin/env bash
# setup_pyxis.sh: make sure pyxis is installed and Slurm loads it, so that `srun --container-image`
# works.
#
# Whether HyperPod's AMI-based configuration installs and registers pyxis is left open by AWS's
# sources (the SageMaker Developer Guide's "Getting started with SageMaker HyperPod using the AWS
# CLI" lists it; AWS's samples install it themselves: aws-samples/awsome-distributed-training at
# 7217859, 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/utils/
# install_enroot_pyxis.sh). So every case is handled:
#   * installed: pyxis's shipped pyxis.conf (`required .../spank_pyxis.so`, which `make install`
#     writes to /usr/local/share/pyxis) exists and names a plugin that exists. Otherwise this node
#     builds it as that script does: pyxis's source at the tag and commit pinned in
#     node_packages.txt (packages.sh), CPPFLAGS="-I /opt/slurm/include", `make install`; adds
#     ConstrainDevices=yes to /opt/slurm/etc/cgroup.conf when it has no such line (the script's
#     fix for GPU ids inside containers, NVIDIA/pyxis#47); and restarts whichever of slurmctld
#     and slurmd runs here, as the script does.
#   * registered: the controller's plugstack.conf names pyxis on a line that is not a comment.
#     Then it is left alone. Otherwise pyxis is registered as that script does: pyxis.conf is
#     linked as /opt/slurm/etc/plugstack.conf.d/pyxis.conf and the controller's plugstack.conf
#     includes that file by its full name.
#
# Slurm is configless on HyperPod: slurmd fetches plugstack.conf from slurmctld, but not the
# files it includes (checked on Slurm 22.05: a configless slurmd's conf-cache holds
# plugstack.conf only). So every node needs the link, and only the controller's plugstack.conf
# (the one slurmctld sends) needs the include line. An explicit name rather than
# plugstack.conf.d/*: configless Slurm takes the * literally (AWS's
# utils/slurm_fix_plugstackconf.sh works around exactly that). After changing it, the controller
# waits for slurmctld (which may start after this script, lib.sh wait_for_slurmctld) and, unless
# slurmctld read its configuration after the change, runs `scontrol reconfigure` so the nodes
# fetch the new file.
#
# The paths Slurm reads carry ${MOE_LC_ROOT}, because in the tests a real slurmctld reads them.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"
# shellcheck source-path=SCRIPTDIR source=packages.sh
source "${MOE_LC_DIR}/packages.sh"

readonly SLURM_ETC="${MOE_LC_ROOT}/opt/slurm/etc"
readonly PLUGSTACK="${SLURM_ETC}/plugstack.conf"
readonly PYXIS_LINK="${SLURM_ETC}/plugstack.conf.d/pyxis.conf"
readonly PYXIS_PREFIX="${MOE_LC_ROOT}/usr/local"
readonly PYXIS_SHIPPED="${PYXIS_PREFIX}/share/pyxis/pyxis.conf"
readonly SLURM_INCLUDE="${MOE_LC_ROOT}/opt/slurm/include"
readonly CGROUP_CONF="${SLURM_ETC}/cgroup.conf"
# Set when this run installed pyxis or changed cgroup.conf: the daemons then restart.
RESTART_SLURM=false

# registered: plugstack.conf (of this node) already names pyxis on a line that is not a comment.
registered() {
  [[ -f "${PLUGSTACK}" ]] && grep -Eq '^[[:space:]]*[^#[:space:]].*pyxis' "${PLUGSTACK}"
}

link_pyxis_conf() {
  if [[ -e "${PYXIS_LINK}" ]]; then
    log "${PYXIS_LINK} exists"
    return 0
  fi
  mkdir -p -- "$(dirname -- "${PYXIS_LINK}")"
  ln -sfn -- "${PYXIS_SHIPPED}" "${PYXIS_LINK}"
  log "linked ${PYXIS_LINK} -> ${PYXIS_SHIPPED}"
}

# installed: pyxis.conf exists and the plugin on its `required` line exists.
installed() {
  local plugin
  [[ -f "${PYXIS_SHIPPED}" ]] || return 1
  plugin="$(awk '$1 == "required" || $1 == "optional" { print $2; exit }' "${PYXIS_SHIPPED}")"
  [[ -n "${plugin}" && -e "${plugin}" ]]
}

install_pyxis() {
  local tool src
  for tool in git make gcc; do
    if ! command -v "${tool}" >/dev/null 2>&1; then
      die "pyxis is not installed and cannot be built here: ${tool} is missing (HyperPod's AMIs ship git, make and gcc; install build-essential and git, or use an AMI with pyxis)"
    fi
  done
  if [[ ! -f "${SLURM_INCLUDE}/slurm/spank.h" ]]; then
    die "pyxis is not installed and cannot be built here: ${SLURM_INCLUDE}/slurm/spank.h is missing (pyxis builds against the running Slurm's headers, which HyperPod installs under /opt/slurm/include)"
  fi
  log "pyxis is not installed; building pyxis $(package_version pyxis) (node_packages.txt) against ${SLURM_INCLUDE}"
  src="$(mktemp -d "${TMPDIR:-/tmp}/moe-cdk-pyxis.XXXXXX")"
  fetch_package_git pyxis "${src}/pyxis"
  CPPFLAGS="-I ${SLURM_INCLUDE}" make -C "${src}/pyxis" -j "$(nproc)" prefix="${PYXIS_PREFIX}" install
  rm -rf -- "${src}"
  if ! installed; then
    die "pyxis's make install did not leave ${PYXIS_SHIPPED} naming an existing plugin: check the build output above"
  fi
  log "installed pyxis: ${PYXIS_SHIPPED} ($(cat -- "${PYXIS_SHIPPED}"))"
  RESTART_SLURM=true
}

# constrain_devices: ConstrainDevices=yes in cgroup.conf, where there is one without the key.
constrain_devices() {
  if [[ ! -f "${CGROUP_CONF}" ]] || grep -q '^ConstrainDevices' "${CGROUP_CONF}"; then
    return 0
  fi
  printf 'ConstrainDevices=yes\n' >>"${CGROUP_CONF}"
  log "${CGROUP_CONF}: ConstrainDevices=yes (GPU ids inside pyxis containers, NVIDIA/pyxis#47)"
  RESTART_SLURM=true
}

# restart_slurm: restart the Slurm daemons that run on this node, so they load what changed.
restart_slurm() {
  local daemon
  for daemon in slurmctld slurmd; do
    if systemctl is-active --quiet "${daemon}"; then
      retry 5 5 systemctl restart "${daemon}"
      log "restarted ${daemon}"
    fi
  done
}

# include_pyxis: append the include line to the controller's plugstack.conf, in one rename.
include_pyxis() {
  local tmp changed_at booted_at
  tmp="$(mktemp "${PLUGSTACK}.moe-cdk.XXXXXX")"
  if [[ -f "${PLUGSTACK}" ]]; then
    cat -- "${PLUGSTACK}" >"${tmp}"
  fi
  printf 'include %s\n' "${PYXIS_LINK}" >>"${tmp}"
  replace_if_changed "${tmp}" "${PLUGSTACK}" 644  # always changed: a line was added
  changed_at="$(date +%s)"
  log "${PLUGSTACK}: include ${PYXIS_LINK}"
  wait_for_slurmctld
  booted_at="$(slurmctld_booted_at)"
  if [[ -n "${booted_at}" ]] && ((booted_at > changed_at)); then
    log "slurmctld started at $(date -u -d "@${booted_at}" +%FT%TZ), after plugstack.conf changed: the nodes fetch the new file from it; no reconfigure"
    return 0
  fi
  retry 5 2 scontrol reconfigure
  log "scontrol reconfigure: the nodes fetch the new plugstack.conf"
}

# slurmctld_booted_at: when the running slurmctld started, in seconds since the epoch, from
# `scontrol show config` ("BOOT_TIME = 2026-12-03T07:08:07", local time); empty when it says nothing
# parseable. Its "Configuration data as of" line is no such time: Slurm 22.05 prints the moment of the
# query there (measured here: it moves with every call and with no reconfigure in between).
#
# A slurmctld that started after plugstack.conf changed already serves the new file, and a
# reconfigure then only reaches slurmd daemons that are starting at that moment, which is when
# Slurm 22.05's configless slurmd can crash on it: reproduced here with a reconfigure arriving as
# slurmd starts (SIGSEGV in write_configs_to_conf_cache; 300 reconfigures of a running cluster
# crashed nothing). So the reconfigure is sent only when slurmctld started before the change, or
# in the same second.
slurmctld_booted_at() {
  local stamp
  # awk reads to the end, as in slurm_user (lib.sh): no SIGPIPE for scontrol.
  stamp="$(scontrol show config 2>/dev/null | awk '$1 == "BOOT_TIME" && !found { print $3; found = 1 }')"
  if [[ -n "${stamp}" ]]; then
    date -d "${stamp}" +%s 2>/dev/null || true
  fi
}

main() {
  install_err_trap
  load_node_facts
  load_params
  if [[ "${MOE_WORKLOAD_MANAGER}" == "eks" ]]; then
    log "workload_manager is eks: no Slurm, so no pyxis; skipping"
    return 0
  fi
  if [[ "${MOE_PYXIS}" != "true" ]]; then
    log "container_runtime.pyxis is false; not registering pyxis with Slurm"
    return 0
  fi
  if installed; then
    log "pyxis is installed: ${PYXIS_SHIPPED} ($(cat -- "${PYXIS_SHIPPED}"))"
  else
    install_pyxis
    constrain_devices
  fi
  if [[ "${MOE_NODE_ROLE}" == "controller" ]] && registered; then
    log "pyxis is already registered in ${PLUGSTACK} (HyperPod's AMI-based configuration)"
  else
    link_pyxis_conf
    if [[ "${MOE_NODE_ROLE}" == "controller" ]]; then
      include_pyxis
    fi
  fi
  if [[ "${RESTART_SLURM}" == "true" ]]; then
    restart_slurm
  fi
}

main "$@"
