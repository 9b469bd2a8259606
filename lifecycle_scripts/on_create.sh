#!/usr/bin/env bash
# on_create.sh: the lifecycle entry point, run as root on every node when the cluster (or a
# replacement node) is created, from the folder the generated entry script unpacked.
#
# Slurm: HyperPod runs it as LifeCycleConfig.OnInitComplete, after its AMI-based configuration
# has written slurm.conf and set up accounting (SageMaker Developer Guide, "Getting started with
# SageMaker HyperPod using the AWS CLI": with OnCreate instead, "HyperPod does not run AMI-based
# configuration and does not start Slurm"). What AWS's sources leave open (whether Slurm is up
# yet, as which user it runs, whether enroot and pyxis are there) is handled in each step
# (README.md, "What AWS's sources leave open"). These steps do the rest.
# EKS: HyperPod requires OnCreate there, and runs it before the node joins the cluster.
# ParallelCluster: parallelcluster_entry.sh runs it as `on_create.sh --group NAME` from each node's
# OnNodeConfigured action (and the head node's OnNodeUpdated), telling it the node's instance group
# (there is no resource_config.json); ParallelCluster has mounted the file system by then.
#
# Steps, in order (README.md has the details and each step's source):
#   validate         node_info.py --check provisioning_parameters.json
#   node_info        which instance group this node is in, its role, the cluster-wide settings
#   efa_env          install efa_env.sh as /etc/profile.d/moe-cdk-efa.sh   (all nodes)
# then, with "workload_manager": "slurm":
#   mount_fsx        mount_fsx.sh                 (all nodes; not on ParallelCluster, whose
#                                                 SharedStorage mounts the file system)
#   setup_enroot     setup_enroot.sh                                       (login and compute)
#   setup_pyxis      setup_pyxis.sh                                        (all nodes)
#   slurm_features   slurm_features.sh           (compute: set; controller: the trigger; not on
#                                                 ParallelCluster, which gives each node its features
#                                                 itself and starts a compute node's slurmd only after
#                                                 OnNodeConfigured)
#   teams            slurm_teams.sh              (all nodes: team members' users and homes; controller:
#                                                 accounts, QoS, fair share, priority and preemption;
#                                                 skipped when teams is null)
#   imds_access      imds_access.sh              (all nodes, when teams is set: instance metadata, and so the
#                                                 node role's credentials, for root and the node's services
#                                                 only; members pull from ECR through moe-ecr-password)
#   observability    setup_observability.sh      (all nodes: exporters; controller: the agent;
#                                                 skipped when observability is null)
# or, with "workload_manager": "eks" (no Slurm, enroot or pyxis; the FSx CSI driver mounts
# FSx into pods):
#   setup_containerd setup_containerd.sh                                   (all nodes)
# Each step ends with a step record (lib.sh), which `moe-cdk status` reads back from CloudWatch.
# The first failing command stops the run with diagnostics and a record with a hint (see lib.sh)
# and a non-zero exit.
set -euo pipefail

main() {
  # S3 does not keep file modes, so the scripts are run with bash rather than executed.
  cd -- "$(dirname -- "$0")"
  # shellcheck source-path=SCRIPTDIR source=lib.sh
  source ./lib.sh
  install_err_trap
  local started="${SECONDS}"
  case "$#:${1:-}" in
    0:) ;;
    # Every step that asks node_info.py for the node's facts (lib.sh load_node_facts) is told the group.
    2:--group) export MOE_LC_NODE_GROUP="$2" ;;
    *) die "usage: on_create.sh [--group INSTANCE_GROUP] (got: $*)" ;;
  esac
  log "on_create.sh started in $(pwd) (log file ${MOE_LC_LOG})"

  run_step validate python3 ./node_info.py --check "${MOE_LC_PARAMS}"
  run_step node_info load_node
  log "instance ${MOE_INSTANCE_ID:-unknown} (${MOE_INSTANCE_TYPE}) in group ${MOE_NODE_GROUP}: role ${MOE_NODE_ROLE}"

  run_step efa_env install_efa_env
  case "${MOE_WORKLOAD_MANAGER}" in
    eks) eks_steps ;;
    *) slurm_steps ;;
  esac

  log "on_create.sh finished in $((SECONDS - started))s"
}

# The node_info step: this node's facts (MOE_NODE_*) and the cluster-wide settings, which the steps below then read
# from the environment instead of starting Python again (lib.sh, MOE_LC_NODE_FACTS).
load_node() {
  load_node_facts
  load_params
}

slurm_steps() {
  local teams
  if [[ "${MOE_CLUSTER_MANAGER}" == parallelcluster ]]; then
    log "skipping mount_fsx on ParallelCluster: its SharedStorage has mounted the file system"
  else
    run_step mount_fsx bash ./mount_fsx.sh
  fi
  case "${MOE_NODE_ROLE}" in
    login | compute) run_step setup_enroot bash ./setup_enroot.sh ;;
    *) log "skipping setup_enroot on a ${MOE_NODE_ROLE} node" ;;
  esac
  run_step setup_pyxis bash ./setup_pyxis.sh
  # ParallelCluster writes each node's features into slurm.conf (static or dynamic, the instance type, the
  # compute resource, efa where EFA is on, gpu: the cookbook's templates/common/slurm_parallelcluster_utils.conf),
  # and starts a compute node's slurmd in its finalize phase, after OnNodeConfigured (compute_node/user_data.sh;
  # recipes/finalize/finalize_compute.rb): slurm_features.sh would wait for a slurmd that cannot start before it.
  if [[ "${MOE_CLUSTER_MANAGER}" == parallelcluster ]]; then
    log "skipping slurm_features on ParallelCluster: it sets the nodes' features itself"
  else
    case "${MOE_NODE_ROLE}" in
      compute | controller) run_step slurm_features bash ./slurm_features.sh ;;
      *) log "skipping slurm_features on a ${MOE_NODE_ROLE} node" ;;
    esac
  fi
  run_step teams bash ./slurm_teams.sh
  # After the teams step, so the members' users exist; before observability, whose agent must then still reach
  # IMDS (imds_access.sh allows it). The names are read on a line of their own: a failure there stops the run
  # rather than skipping the step.
  teams="$(python3 ./slurm_teams.py names "${MOE_LC_PARAMS}")"
  if [[ -n "${teams}" ]]; then
    run_step imds_access bash ./imds_access.sh
  else
    log "skipping imds_access: no teams, so every user of the node may read its metadata as before"
  fi
  run_step observability bash ./setup_observability.sh
}

eks_steps() {
  log "skipping mount_fsx on EKS: the FSx CSI driver mounts FSx for Lustre into pods"
  log "skipping setup_enroot on EKS: pods run under containerd; there is no enroot or pyxis"
  log "skipping setup_pyxis and slurm_features on EKS: there is no Slurm; Kubernetes schedules the pods"
  log "skipping observability on EKS: setup_observability.sh scrapes Slurm nodes (observability must be null)"
  run_step setup_containerd bash ./setup_containerd.sh
}

# Copies efa_env.sh to /etc/profile.d, replacing the copy only when it differs.
install_efa_env() {
  local target="${MOE_LC_ROOT}/etc/profile.d/moe-cdk-efa.sh" tmp
  mkdir -p -- "$(dirname -- "${target}")"
  tmp="$(mktemp "${target}.moe-cdk.XXXXXX")"
  cp -- ./efa_env.sh "${tmp}"
  if ! replace_if_changed "${tmp}" "${target}" 644; then
    log "${target} is already up to date"
    return 0
  fi
  log "installed ${target}"
}

main "$@"
