#!/usr/bin/env bash
# slurm_features.sh: give this compute node its Slurm features, so that jobs can ask for
# them (`#SBATCH --constraint=efa`).
#
# The features come from the node's worker group in provisioning_parameters.json (the CDK
# construct lists "efa" only for EFA-capable instance types). "efa" is dropped, with a
# WARNING, when this node shows no EFA device. HyperPod owns slurm.conf, so the features are
# set at runtime with scontrol; slurmctld may not be up yet, hence the retries.
# Does nothing on controller and login nodes.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

# efa_visible: true when an EFA device is visible (and libfabric sees the efa provider,
# where fi_info is installed).
efa_visible() {
  local devices=("${MOE_LC_ROOT}"/sys/class/infiniband/*)
  if [[ ! -e "${devices[0]}" ]]; then
    warn "no EFA device under ${MOE_LC_ROOT}/sys/class/infiniband"
    return 1
  fi
  if command -v fi_info >/dev/null 2>&1 && ! fi_info -p efa >/dev/null 2>&1; then
    warn "fi_info -p efa failed: libfabric does not see the efa provider"
    return 1
  fi
  return 0
}

main() {
  install_err_trap
  load_node_facts
  if [[ "${MOE_NODE_ROLE}" != "compute" ]]; then
    log "${MOE_NODE_ROLE} node (group ${MOE_NODE_GROUP}); Slurm features are only set on compute nodes"
    return 0
  fi

  local features=() feature
  IFS=, read -r -a features <<<"${MOE_FEATURES}"
  local kept=()
  for feature in "${features[@]}"; do
    if [[ "${feature}" == "efa" ]] && ! efa_visible; then
      warn "dropping the efa feature on this ${MOE_INSTANCE_TYPE} node: jobs with --constraint=efa will not run here"
      continue
    fi
    kept+=("${feature}")
  done
  if ((${#kept[@]} == 0)); then
    log "worker group ${MOE_NODE_GROUP} has no Slurm features to set"
    return 0
  fi

  local joined node
  joined="$(IFS=,; printf '%s' "${kept[*]}")"
  node="$(hostname -s)"
  retry 10 3 scontrol update NodeName="${node}" AvailableFeatures="${joined}" ActiveFeatures="${joined}"
  log "node ${node} (partition ${MOE_PARTITION}): AvailableFeatures=${joined} ActiveFeatures=${joined}"
}

main "$@"
