#!/usr/bin/env bash
# setup_pyxis.sh: make sure Slurm loads pyxis, so that `srun --container-image` works.
#
# Source: HyperPod's AMI-based configuration installs enroot and pyxis itself when the
# lifecycle script runs as OnInitComplete, as these scripts do (SageMaker Developer Guide,
# "Getting started with SageMaker HyperPod using the AWS CLI": "HyperPod runs the full
# AMI-based configuration first, then executes your script"; its table lists Enroot and Pyxis).
# So normally this finds pyxis registered and changes nothing. Where it is not, it registers
# pyxis the way AWS's reference scripts do (aws-samples/awsome-distributed-training,
# 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/utils/
# install_enroot_pyxis.sh at 7217859): Slurm lives under /opt/slurm, pyxis's own pyxis.conf
# (`required .../spank_pyxis.so`, which `make install` writes to /usr/local/share/pyxis) is
# linked as /opt/slurm/etc/plugstack.conf.d/pyxis.conf, and the controller's plugstack.conf
# includes that file by its full name.
#
# Slurm is configless on HyperPod: slurmd fetches plugstack.conf from slurmctld, but not the
# files it includes (checked on Slurm 22.05: a configless slurmd's conf-cache holds
# plugstack.conf only). So every node needs the link, and only the controller's plugstack.conf
# (the one slurmctld sends) needs the include line. An explicit name rather than
# plugstack.conf.d/*: configless Slurm takes the * literally (AWS's
# utils/slurm_fix_plugstackconf.sh works around exactly that). After changing it, the controller
# runs `scontrol reconfigure` so the nodes fetch the new file.
#
# Nothing is downloaded or built. Without pyxis (no registration, no pyxis.conf) this only
# warns: the node still runs jobs without containers.
#
# The paths Slurm reads carry ${MOE_LC_ROOT}, because in the tests a real slurmctld reads them.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly SLURM_ETC="${MOE_LC_ROOT}/opt/slurm/etc"
readonly PLUGSTACK="${SLURM_ETC}/plugstack.conf"
readonly PYXIS_LINK="${SLURM_ETC}/plugstack.conf.d/pyxis.conf"
readonly PYXIS_SHIPPED="${MOE_LC_ROOT}/usr/local/share/pyxis/pyxis.conf"

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

# include_pyxis: append the include line to the controller's plugstack.conf, in one rename.
include_pyxis() {
  local tmp
  tmp="$(mktemp "${PLUGSTACK}.moe-cdk.XXXXXX")"
  if [[ -f "${PLUGSTACK}" ]]; then
    cat -- "${PLUGSTACK}" >"${tmp}"
  fi
  printf 'include %s\n' "${PYXIS_LINK}" >>"${tmp}"
  replace_if_changed "${tmp}" "${PLUGSTACK}" 644  # always changed: a line was added
  log "${PLUGSTACK}: include ${PYXIS_LINK}"
  retry 5 2 scontrol reconfigure
  log "scontrol reconfigure: the nodes fetch the new plugstack.conf"
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
  if [[ "${MOE_NODE_ROLE}" == "controller" ]] && registered; then
    log "pyxis is already registered in ${PLUGSTACK} (HyperPod's AMI-based configuration)"
    return 0
  fi
  if [[ ! -e "${PYXIS_SHIPPED}" && ! -e "${PYXIS_LINK}" ]]; then
    warn "pyxis is not installed (neither ${PYXIS_LINK} nor ${PYXIS_SHIPPED} exists); srun --container-image will not work"
    return 0
  fi
  link_pyxis_conf
  if [[ "${MOE_NODE_ROLE}" == "controller" ]]; then
    include_pyxis
  fi
}

main "$@"
