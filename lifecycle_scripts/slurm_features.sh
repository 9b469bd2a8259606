#!/usr/bin/env bash
# slurm_features.sh: give compute nodes their Slurm features, so that jobs can ask for them
# (`#SBATCH --constraint=efa`), and keep them through `scontrol reconfigure`.
#
#   slurm_features.sh            (lifecycle step) compute node: set its features; controller:
#                                register the trigger below; login node: nothing
#   slurm_features.sh --reapply  (the trigger's program, on the controller) set again every
#                                node's features from its Extra field
#
# Source: HyperPod writes slurm.conf from the API's SlurmConfig, which has node types and
# partitions but no features (SageMaker API reference, ClusterSlurmConfig), so features are set
# at run time. The features come from the node's worker group in the parameters (the CDK
# construct lists "efa" only for EFA-capable instance types); "efa" is dropped, with a WARNING,
# when this node shows no EFA device.
#
# Slurm may not be up yet: "OnInitComplete and lifecycle scripts can run before or in parallel with
# Slurm service startup" (AWS's detect-node README, awslabs/awsome-distributed-ai at 95b939c), so
# each role first waits for Slurm (lib.sh: wait_for_slurmctld on the controller; wait_for_slurmd,
# which also waits for this node's slurmd to register, on a compute node), up to
# MOE_LC_SLURM_WAIT_S (600 s), and fails with a hint after that. The retries after it cover a
# controller that is briefly busy.
#
# Features set with `scontrol update` last until slurmctld rereads slurm.conf: on Slurm 22.05
# `scontrol reconfigure` resets them to slurm.conf's (tests/lifecycle_scripts/test_lifecycle_slurm.py shows it),
# and HyperPod reconfigures whenever nodes join or are replaced. A node's Extra field does
# survive, so each compute node records its features there ("moe-cdk-features:a,b"), and the
# controller registers a permanent reconfig trigger (strigger --reconfig --flags=PERM) whose
# program puts them back. Nothing else uses Extra on HyperPod's nodes. Only SlurmUser may set a
# trigger (strigger(1), unless SlurmUser is root), so it is registered as SlurmUser (lib.sh
# as_slurm_user) and its program then runs as that user, which may update nodes too.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly EXTRA_PREFIX="moe-cdk-features:"

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

# set_features NODE FEATURES: available, active and recorded in Extra.
set_features() {
  scontrol update NodeName="$1" AvailableFeatures="$2" ActiveFeatures="$2" Extra="${EXTRA_PREFIX}$2"
}

compute_node() {
  local features=() feature kept=() joined node
  IFS=, read -r -a features <<<"${MOE_FEATURES}"
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
  joined="$(IFS=,; printf '%s' "${kept[*]}")"
  node="$(hostname -s)"
  wait_for_slurmd "${node}"
  retry 6 3 set_features "${node}" "${joined}"
  log "node ${node} (partition ${MOE_PARTITION}): AvailableFeatures=${joined} ActiveFeatures=${joined}"
}

controller_node() {
  # The program runs with slurmctld's environment; MOE_LC_ROOT goes with it (empty on a node).
  local program="/usr/bin/env MOE_LC_ROOT=${MOE_LC_ROOT} /bin/bash ${MOE_LC_DIR}/slurm_features.sh --reapply" triggers
  wait_for_slurmctld
  triggers="$(retry 6 3 strigger --get)"
  if grep -qF -- "${MOE_LC_DIR}/slurm_features.sh" <<<"${triggers}"; then
    log "the reconfig trigger that restores node features is already registered"
  else
    retry 6 3 as_slurm_user strigger --set --reconfig --flags=PERM --program="${program}"
    log "registered a permanent reconfig trigger as SlurmUser $(slurm_user): ${program}"
  fi
  # The compute nodes run their lifecycle at the same time as this one, so a reconfigure before
  # the trigger existed (setup_pyxis's, on this node) may already have reset features they set.
  reapply
}

# reapply: every node whose Extra names its features gets them back where they were reset.
reapply() {
  local line name extra active
  while IFS= read -r line; do
    name="$(field NodeName "${line}")"
    extra="$(field Extra "${line}")"
    active="$(field ActiveFeatures "${line}")"
    [[ "${extra}" == "${EXTRA_PREFIX}"* ]] || continue
    if [[ "${active}" != "${extra#"${EXTRA_PREFIX}"}" ]]; then
      set_features "${name}" "${extra#"${EXTRA_PREFIX}"}"
      log "node ${name}: features ${extra#"${EXTRA_PREFIX}"} restored (were ${active})"
    fi
  done < <(scontrol show node -o)
}

# field KEY LINE: the value of KEY=value in a `scontrol show node -o` line.
field() {
  tr ' ' '\n' <<<"$2" | awk -v key="$1" -F= '$1 == key { sub(/^[^=]*=/, ""); print; exit }'
}

main() {
  install_err_trap
  if [[ "${1:-}" == "--reapply" ]]; then
    reapply
    return 0
  fi
  load_node_facts
  case "${MOE_NODE_ROLE}" in
    compute) compute_node ;;
    controller) controller_node ;;
    *) log "${MOE_NODE_ROLE} node (group ${MOE_NODE_GROUP}): no Slurm features to set" ;;
  esac
}

main "$@"
