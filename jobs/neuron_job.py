"""The Trainium training job: NxD Training run from a moe-train profile, as a Slurm batch script and as a Kubeflow
``PyTorchJob`` on HyperPod EKS.

``neuron_run`` renders the profile into NxD Training's configuration (``jobs/nxdt.py``) for a Trainium compute group.
Both orchestrators then run one launcher per node, the same ``node_script``, as AWS's ``examples/train.sh`` does
(rules/neuron.py, [NXDT]):

* ``torchrun`` with one rank per logical NeuronCore (64 on a trn2.48xlarge) starts NxD Training's
  ``training_orchestrator.py`` on the carried configuration;
* before the first training run of a configuration, the same command under ``neuron_parallel_compile`` (with
  ``COMPILE=1``, which makes NxD Training run 10 steps without saving) compiles its graphs into the cache on FSx
  (``compiler_cache_url``); a marker named by the configuration's digest skips that step on a requeue or a restart;
* the variables ``train_setup.sh`` exports (``rules/neuron.LAUNCH_ENV``) are set for it: on Slurm by the batch
  script, on EKS in the container, with the Kubernetes branch's socket interface.

Recovery is NxD Training's own: ``exp_manager.resume_if_exists`` loads the newest checkpoint under
``checkpoint.dir``. NxD Training saves at ``checkpoint.save_interval`` only, not on a signal, so a stopped run
loses the steps since its last save. On Slurm, USR1 (the time limit) and TERM stop the step with TERM; the
script requeues every non-zero exit but 2 (torchrun reports any rank's failure as 1), and on HyperPod the step
runs with ``srun --auto-resume=1``. On EKS the pods restart ``OnFailure``, as AWS's Neuron samples do.

Standard library and the job renderers only (no CDK).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from dataclasses import dataclass

import yaml

from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.jobs import eks_job
from moe_cdk.jobs.nxdt import render_nxdt_config
from moe_cdk.jobs.profile import JobProfile
from moe_cdk.jobs.slurm_job import (
    SlurmJobSpec,
    auto_resume,
    batch_header,
    enroot_image,
    signal_forwarding,
    wait_and_requeue,
)
from moe_cdk.rules import eks as eks_rules, neuron
from moe_cdk.rules.teams import job_team, team_namespace
from moe_cdk.schema.config import Config, InstanceGroupConfig, nodes_of

DEFAULT_COMPILE_CACHE = "/fsx/neuron-compile-cache"
"""Where compiled graphs are kept, on the file system every node shares: NxD Training's ``compiler_cache_url``."""


@dataclass(frozen=True, kw_only=True)
class NeuronRun:
    """One NxD Training run on a Trainium compute group."""

    name: str
    """The job's name, and NxD Training's ``name``."""
    group: InstanceGroupConfig
    spec: catalog.InstanceSpec
    nodes: int
    nxdt_config: dict
    """NxD Training's configuration (``jobs/nxdt.py``)."""
    checkpoint_dir: str
    """The profile's ``checkpoint.dir``: NxD Training's log and checkpoint folder, where the job writes its
    configuration too."""
    compile_cache: str

    @property
    def config_text(self) -> str:
        return yaml.safe_dump(self.nxdt_config, sort_keys=False)

    @property
    def digest(self) -> str:
        """Names the compiled graphs of this configuration (the compile marker)."""
        return hashlib.sha256(self.config_text.encode()).hexdigest()[:16]


def trainium_group(config: Config, group: str | None) -> tuple[InstanceGroupConfig, catalog.InstanceSpec]:
    """The compute group ``group`` (default: the first) and its catalog entry; raises ``ConfigError`` at
    ``--group`` unless it has Trainium chips."""
    chosen = config.cluster.compute_group(group)
    spec = catalog.lookup(chosen.instance_type)
    if spec.accelerator_kind is not catalog.AcceleratorKind.TRAINIUM:
        raise ConfigError(
            [
                problem(
                    f"NxD Training runs on Trainium, and group {chosen.name} has none",
                    got=spec.sagemaker_name,
                    allowed="a Trainium compute group",
                ).at("--group")
            ]
        )
    return chosen, spec


def neuron_run(
    config: Config,
    profile: JobProfile,
    *,
    group: str | None = None,
    nodes: int | None = None,
    name: str | None = None,
    compile_cache: str = DEFAULT_COMPILE_CACHE,
) -> NeuronRun:
    """The NxD Training run of ``profile`` on a Trainium group of ``config``. Raises ``ConfigError`` with every
    profile key NxD Training cannot express, named as ``training.profile: <key>`` (or ``--train-config``)."""
    chosen, spec = trainium_group(config, group)
    count = nodes_of(chosen, nodes)
    name = name or profile.name
    label = "training.profile" if profile.source.resolve() == config.training.path.resolve() else "--train-config"
    try:
        rendered = render_nxdt_config(
            profile.config, name=name, nodes=count, ranks_per_node=spec.ranks_per_node, compile_cache=compile_cache
        )
    except ConfigError as error:
        raise ConfigError([dataclasses.replace(p, key=f"{label}: {p.key}") for p in error.problems]) from None
    return NeuronRun(
        name=name,
        group=chosen,
        spec=spec,
        nodes=count,
        nxdt_config=rendered,
        checkpoint_dir=profile.config.checkpoint.dir,
        compile_cache=compile_cache,
    )


_NODE_SCRIPT = """\
set -euo pipefail
log() { printf '%s neuron_job[node %s]: %s\\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "${node_rank:-?}" "$*" >&2; }

# This node's place: Slurm's variables, or those the Kubeflow training operator sets (PET_*).
node_rank="${SLURM_NODEID:-${PET_NODE_RANK:-}}"
nnodes="${SLURM_JOB_NUM_NODES:-${PET_NNODES:-}}"
nnodes="${nnodes##*:}"
if [[ -z "$node_rank" || -z "$nnodes" || -z "${MASTER_ADDR:-}" || -z "${TRAIN_CONFIG:-}" ]]; then
    log "needs SLURM_NODEID or PET_NODE_RANK, the node count, MASTER_ADDR and TRAIN_CONFIG"
    exit 2
fi
ulimit -n 65535 || log "open files stay at $(ulimit -n): the hard limit is $(ulimit -Hn)"

# NxD Training's train.sh: torchrun over the logical NeuronCores, on its entry point and configuration.
cd __EXAMPLES__
launch=(torchrun --nproc_per_node=__RANKS__ --nnodes="$nnodes" --node_rank="$node_rank"
    --master_addr="$MASTER_ADDR" --master_port="${MASTER_PORT:-__PORT__}"
    training_orchestrator.py --config-path="$(dirname "$TRAIN_CONFIG")"
    --config-name="$(basename "$TRAIN_CONFIG" .yaml)")

# Compile once per configuration: the graphs stay in the cache on FSx, which the training run reads.
mkdir -p __CACHE__
marker=__CACHE__/moe-cdk-compiled-__DIGEST__
if [[ ! -e "$marker" ]]; then
    log "compiling the training graphs into __CACHE__ (neuron_parallel_compile, 10 steps)"
    COMPILE=1 neuron_parallel_compile "${launch[@]}"
    if (( node_rank == 0 )); then
        touch "$marker"
    fi
    log "compiled"
fi
log "training: node ${node_rank} of ${nnodes}, __RANKS__ ranks, ${TRAIN_CONFIG}"
COMPILE=0 exec "${launch[@]}"
"""


def node_script(run: NeuronRun) -> str:
    """The launcher every node runs in the Neuron image: compile if needed, then train."""
    return (
        _NODE_SCRIPT.replace("__EXAMPLES__", f"{neuron.NXDT_DIR}/examples")
        .replace("__RANKS__", str(run.spec.ranks_per_node))
        .replace("__PORT__", str(neuron.MASTER_PORT))
        .replace("__CACHE__", shlex.quote(run.compile_cache))
        .replace("__DIGEST__", run.digest)
    )


# ---------------------------------------------------------------------------------------------------- Slurm


def slurm_spec(
    config: Config,
    run: NeuronRun,
    *,
    image: str,
    time_limit: str = "48:00:00",
    signal_lead_seconds: int = 300,
    qos: str | None = None,
    account: str | None = None,
    nice: int | None = None,
    max_requeues: int = 10,
    after: str | None = None,
) -> SlurmJobSpec:
    """The batch job's resources for ``run``: one launcher task per node, every node whole, the configuration
    written beside the checkpoints."""
    return SlurmJobSpec(
        job_name=run.name,
        nodes=run.nodes,
        tasks_per_node=1,
        partition=run.group.to_props().partition_name,
        constraint="efa" if run.spec.supports_efa and config.cluster.require_efa else None,
        exclusive=True,
        time_limit=time_limit,
        signal_lead_seconds=signal_lead_seconds,
        qos=qos,
        account=account,
        nice=nice,
        container_image=image,
        container_mounts="/fsx:/fsx",
        train_profile=run.config_text,
        profile_dir=run.checkpoint_dir,
        master_port=neuron.MASTER_PORT,
        efa_env_file="",  # the GPU nodes' NCCL settings; the Neuron job sets AWS's Neuron ones instead
        max_requeues=max_requeues,
        after=after,
    )


_HOST_SETUP = """\
# train_setup.sh's host settings, best effort (they need root on the host): keep the rendezvous port out of the
# ephemeral range, and Lustre's dirty-page limit per OST at 64 MB.
# shellcheck disable=SC2016  # the inner bash expands them
srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" bash -c '
    sudo -n sysctl -q -w net.ipv4.ip_local_reserved_ports="$1" || echo "$(hostname): could not reserve port $1" >&2
    if command -v lctl >/dev/null; then
        sudo -n lctl set_param "osc.*.max_dirty_mb=64" >/dev/null || echo "$(hostname): lctl set_param failed" >&2
    fi' host-setup __PORT__ || log "host settings failed on at least one node"
"""


def render_neuron_sbatch(spec: SlurmJobSpec, run: NeuronRun) -> str:
    """The batch script for ``run`` on ``spec``'s nodes; raises ``ConfigError`` listing every problem with it."""
    spec.validate()
    parts = batch_header(
        spec,
        f"# moe-cdk NxD Training job {spec.job_name}: {spec.nodes} node(s) of {run.spec.sagemaker_name}, "
        f"{run.spec.ranks_per_node} ranks each, container {spec.container_image}.\n"
        "# Rendered by moe_cdk.jobs.neuron_job.render_neuron_sbatch; submit with sbatch.",
    )
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in neuron.LAUNCH_ENV.items())
    parts.append(
        "# The environment AWS's train_setup.sh exports for NxD Training; srun passes it into the container.\n"
        f'{exports}\nexport TRAIN_CONFIG="$train_config"\n'
    )
    parts.append(_HOST_SETUP.replace("__PORT__", str(spec.master_port)))
    parts.append(auto_resume(spec.hyperpod_marker))
    parts.append(f"node_step=$(cat <<'MOE_CDK_NODE_STEP'\n{node_script(run)}MOE_CDK_NODE_STEP\n)\n")
    srun = [
        "srun",
        '"${auto_resume[@]}"',
        "--kill-on-bad-exit=1",
        "--ntasks-per-node=1",
        f"--container-image={shlex.quote(enroot_image(spec.container_image))}",
        f"--container-mounts={shlex.quote(spec.container_mounts)}",
        'bash -c "$node_step" &',
    ]
    max_requeues = spec.max_requeues if spec.requeue else 0
    parts.append(
        signal_forwarding(step_signal="TERM", ask="stopping NxD Training; a requeued run resumes from its last save")
        + " \\\n    ".join(srun)
        + "\n"
        + wait_and_requeue(max_requeues=max_requeues, permanent="rc == 2")
    )
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------- EKS


def eks_spec(
    config: Config,
    run: NeuronRun,
    *,
    image: str,
    backoff_limit: int = 10,
    preflight: bool = False,
    team: str | None = None,
    qos: str | None = None,
) -> eks_job.EksJobSpec:
    """The pods of ``run``: one per node, with every Neuron chip and EFA device of it; with ``team``, in its
    namespace and queue. On a cluster with teams the chips are asked for by the name task governance's queues count,
    which the cluster's device plugin then registers (rules/eks.py, [NEURON-TEAMS])."""
    team, qos = job_team(config.teams, team, qos)
    return eks_job.EksJobSpec(
        name=run.name,
        namespace=team_namespace(team) if team else config.eks.namespace,
        image=image,
        nodes=run.nodes,
        instance_type=run.spec.sagemaker_name,
        devices_per_node=run.spec.accelerator_count,
        device_resource=eks_rules.device_resource(run.spec, teams=config.teams is not None),
        efa_per_node=run.spec.efa_interfaces,
        train_profile=run.config_text,
        profile_config_map=eks_job.suffixed_name(run.name, "profile"),
        node_labels=dict(run.group.labels),
        tolerations=tuple(t.toleration() for t in run.group.taints),
        backoff_limit=backoff_limit,
        preflight=preflight,
        team=team,
        qos=qos,
    )


def render_neuron_pytorchjob(spec: eks_job.EksJobSpec, run: NeuronRun) -> dict:
    """A Kubeflow ``PyTorchJob`` (kubeflow.org/v1) whose pods each run ``node_script``. The pods stay on the pod
    network with the collectives' socket on its interface, as train_setup.sh's Kubernetes branch and AWS's
    Neuron samples run them, and they request whole nodes' chips, which needs no Neuron scheduler extension
    (rules/neuron.py, [NEURON-K8S])."""
    env = {**neuron.LAUNCH_ENV, **neuron.KUBERNETES_ENV, "TRAIN_CONFIG": eks_job.PROFILE_PATH}
    template = eks_job.pod_template(
        spec, ["bash", "-c", node_script(run)], [], probes=False, host_network=False, env=env
    )
    return eks_job.pytorchjob(spec, template, restart_policy="OnFailure", nproc_per_node=run.spec.ranks_per_node)


__all__ = [
    "DEFAULT_COMPILE_CACHE",
    "NeuronRun",
    "eks_spec",
    "neuron_run",
    "node_script",
    "render_neuron_pytorchjob",
    "render_neuron_sbatch",
    "slurm_spec",
    "trainium_group",
]
