"""The preflight job: proves the GPUs, the EFA devices and NCCL's network on the nodes and in the image a
training job will use, before it starts. ``moe-cdk verify render`` writes it.

On Slurm it is a batch script (``render_preflight_sbatch``) over the training job's own
``SlurmJobSpec``, so it asks for the same partition, constraint, node count, GPUs and image. Its steps:

1. on the hosts, one task per node: ``dcgmi diag -r LEVEL -j`` into a node-local folder (DCGM is part of
   HyperPod's AMI, not of the image);
2. in the image, one task per node: ``moe-preflight node`` (GPUs and ECC by nvidia-smi, EFA devices by
   ``fi_info -p efa`` against the catalog, the DCGM result, the libfabric version);
3. in the image, one rank per GPU (``srun --mpi=pmix``, as AWS's nccl-tests test case runs it):
   nccl-tests ``all_reduce_perf`` and ``alltoall_perf`` with ``NCCL_DEBUG=INFO``, then
   ``moe-preflight nccl-tests`` on each log: no wrong values, ``NET/OFI`` selected the efa provider,
   and the largest message's bus bandwidth at or above the catalog's floor;
4. in the image, one rank per GPU: ``moe-preflight collectives``, the expert-parallel all-to-all with the
   profile's dispatch shape and an all-reduce, in torch.

Every step runs even when an earlier one failed, so one run reports every problem; the script exits 1
when any failed, 0 when all passed. ``--dependency=afterok:<job>`` on the training job
(``moe-cdk slurm render --after``) then starts training only after a passed preflight.

A ``local`` preflight is the CPU variant for a cluster without GPUs or EFA (the two-node Slurm the tests
start): step 2 checks the interpreter, torch and gloo, steps 1 and 3 are left out, and step 4 runs over
gloo with one rank per node.

On EKS it is two jobs on the training job's pod template:

- a Kubeflow ``PyTorchJob`` (``render_preflight_pytorchjob``): each pod runs ``moe-preflight node``, then
  ``torchrun`` starts ``moe-preflight collectives`` over every pod (after ``--``, or torchrun takes the
  checks' options for its own abbreviated ones);
- an ``MPIJob`` (kubeflow.org/v2beta1, ``render_preflight_mpijob``) for nccl-tests, as AWS runs them on EKS
  (awslabs/awsome-distributed-ai at 95b939c, micro-benchmarks/nccl-tests/kubernetes/nccl-tests.yaml). The MPI
  operator comes with HyperPod's dependencies chart (sagemaker-hyperpod-cli at the commit rules/eks.py pins,
  charts/mpi-operator, v0.5.0, enabled by default). Its launcher runs ``all_reduce_perf`` and
  ``alltoall_perf`` with ``mpirun`` over one rank per GPU of the workers, then ``moe-preflight nccl-tests``
  on each log: the same verdicts as the Slurm step 3. The workers are the training pods without a command,
  so the operator runs ``/usr/sbin/sshd -De`` in them (mpi-operator v0.5.0, pkg/controller/
  mpi_job_controller.go), and on the pod network, since sshd would clash with the host's on port 22.

Standard library only (no CDK), like the training job renderers.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from moe_cdk.core import catalog
from moe_cdk.core.problems import Problem, problem, raise_if_any
from moe_cdk.jobs import eks_job
from moe_cdk.jobs.slurm_job import SlurmJobSpec, batch_header, enroot_image, trainer_config_arg
from moe_cdk.training.fabric.neuron import NCCOM_OPERATIONS, NEURON_BIN

# Built into the training image at a pinned commit (training/Dockerfile).
NCCL_TESTS_DIR = "/opt/nccl-tests/build"
NCCL_TESTS = ("all_reduce_perf", "alltoall_perf")
# nccl-tests' README: -b/-e the smallest and largest message, -f the step factor, -g GPUs per task.
# 16 GiB is where AWS's nccl-tests test case ends its sweep (3.test_cases/micro-benchmarks/nccl-tests).
NCCL_TESTS_ARGS = ("-b", "8", "-e", "16G", "-f", "2", "-g", "1", "-c", "1", "-n", "20")
DEFAULT_TIME_LIMIT = "00:45:00"
# nccom-test's options (aws-neuron-sdk tools/neuron-sys-tools/nccom-test.rst): 8 B to 1 GB doubling, 20 timed and 5
# warm-up iterations, fp32, no progress animation; the operations the preflight runs; the root rank's port.
NCCOM_TEST_ARGS = (
    "--minbytes 8",
    "--maxbytes 1GB",
    "--stepfactor 2",
    "--iters 20",
    "--warmup_iters 5",
    "--datatype fp32",
    "--non-interactive",
)
NCCOM_PORT = 45654


@dataclass(frozen=True, kw_only=True)
class PreflightSpec:
    """A preflight over the nodes and image of one training job."""

    job: SlurmJobSpec
    """The training job it runs ahead of: nodes, partition, constraint, GPUs, image, mounts, or local."""
    instance_type: str
    """The compute group's instance type, whose catalog entry the nodes are checked against."""
    dcgm_level: int = 1
    """DCGM diagnostic level run on each host first (1: seconds, 2: about two minutes); 0 runs none."""
    nccl_tests_dir: str = NCCL_TESTS_DIR
    """Where the image holds the nccl-tests binaries."""

    def problems(self) -> list[Problem]:
        found = list(self.job.problems())
        if catalog.lookup(self.instance_type) is None:
            found.append(catalog.unknown_instance_type(self.instance_type).at("instance_type"))
        if self.dcgm_level not in (0, 1, 2):
            found.append(
                problem("not a DCGM level the preflight runs", got=self.dcgm_level, allowed="0, 1 or 2").at(
                    "dcgm_level"
                )
            )
        return found

    @property
    def gpus(self) -> bool:
        return self._kind is catalog.AcceleratorKind.NVIDIA_GPU

    @property
    def trainium(self) -> bool:
        return self._kind is catalog.AcceleratorKind.TRAINIUM

    @property
    def _kind(self) -> catalog.AcceleratorKind | None:
        spec = catalog.lookup(self.instance_type)
        return None if self.job.local or spec is None else spec.accelerator_kind


def preflight_job(job: SlurmJobSpec, *, instance_type: str, dcgm_level: int = 1) -> PreflightSpec:
    """The preflight for ``job``: its nodes and image, no requeue, a short time limit."""
    return PreflightSpec(
        job=dataclasses.replace(
            job,
            job_name=f"{job.job_name}-preflight",
            requeue=False,
            time_limit=DEFAULT_TIME_LIMIT,
            signal_lead_seconds=60,
        ),
        instance_type=instance_type,
        dcgm_level=0 if job.local else dcgm_level,
    )


_CHECKS = """\
# Every check runs; a failed one is remembered and the job exits 1 at the end.
failed=()
check() {
    local name="$1"
    shift
    log "check ${name}: $*"
    if "$@"; then
        log "check ${name} passed"
    else
        log "check ${name} FAILED (exit $?)"
        failed+=("$name")
    fi
}
work="/tmp/moe-preflight-${SLURM_JOB_ID}"
mkdir -p "$work"
nodes=(--nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES")
"""

_DCGM = """\
# DCGM runs on the hosts (HyperPod's AMI has it; the image has not). A node whose dcgmi fails or is missing
# writes no result, and its node check fails for it.
# shellcheck disable=SC2016  # the inner bash expands $1 and $2
srun "${nodes[@]}" bash -c 'mkdir -p "$1" && dcgmi diag -r "$2" -j > "$1/dcgm.json" || rm -f "$1/dcgm.json"' \\
    dcgm "$work" __LEVEL__ || log "dcgmi failed on at least one node"
"""

# nccom-test on the hosts (HyperPod's AMI installs the Neuron tools), from the first node over every node, as AWS's
# sbatch runs it (awslabs/awsome-distributed-training, micro-benchmarks/nccom-tests/slurm/nccom-tests.sbatch):
# the root rank's address in NEURON_RT_ROOT_COMM_ID, every host named, and libfabric held to EFA (its line 8:
# FI_PROVIDER=efa), so that a node without EFA fails instead of measuring TCP. One rank per logical NeuronCore.
_NCCOM = """\
export FI_PROVIDER=efa
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
for operation in __OPERATIONS__; do
    NEURON_RT_ROOT_COMM_ID="${MASTER_ADDR}:__PORT__" PATH="__NEURON_BIN__:$PATH" nccom-test \\
        --nworkers "$(( __RANKS__ * SLURM_JOB_NUM_NODES ))" --nnodes "$SLURM_JOB_NUM_NODES" \\
        __ARGS__ "$operation" --hosts "${hosts[@]}" \\
        > "$work/nccom_${operation}.log" 2>&1 || log "nccom-test ${operation} exited $? (its log is checked next)"
    check "nccom_${operation}" __PARSE__
done
"""

_RESULT = """\
if (( ${#failed[@]} )); then
    log "preflight FAILED: ${failed[*]}"
    exit 1
fi
log "preflight passed: every node and collective"
exit 0
"""


def _in_image(spec: PreflightSpec, srun_args: list[str], command: list[str]) -> str:
    """One ``check`` line: ``srun`` of ``command`` in the image (or, local, with the host's Python)."""
    job = spec.job
    srun = ["srun", "--kill-on-bad-exit=1", *srun_args]
    if job.local:
        command = [shlex.quote(job.python), "-m", "moe_cdk.cli.preflight", *command[1:]]
    else:
        mounts = ",".join(m for m in (job.container_mounts and shlex.quote(job.container_mounts), '"$work:$work"') if m)
        srun += [f"--container-image={shlex.quote(enroot_image(job.container_image))}", f"--container-mounts={mounts}"]
    return " \\\n    ".join([*srun, " ".join(command)])


def render_preflight_sbatch(spec: PreflightSpec) -> str:
    """The preflight batch script; raises ``ConfigError`` listing every problem with ``spec``."""
    raise_if_any(spec.problems(), subject="preflight spec")
    job = spec.job
    itype = shlex.quote(spec.instance_type)
    config = trainer_config_arg(job)
    kind = "local (CPU, gloo)" if job.local else f"container {job.container_image}"
    parts = batch_header(
        job,
        f"# moe-cdk preflight {job.job_name}: {job.nodes} node(s) of {spec.instance_type}, {kind}.\n"
        "# Rendered by moe_cdk.jobs.preflight_job.render_preflight_sbatch; submit with sbatch, then the\n"
        "# training job with --dependency=afterok:<this job's id> (moe-cdk slurm render --after ID).",
    )
    parts.append(_CHECKS)
    dcgm_level = spec.dcgm_level if spec.gpus else 0  # DCGM diagnoses NVIDIA GPUs only
    if dcgm_level:
        parts.append(_DCGM.replace("__LEVEL__", str(dcgm_level)))
    node = ["moe-preflight", "node"]
    node += ["--local"] if job.local else ["--instance-type", itype, "--dcgm-level", str(dcgm_level)]
    if dcgm_level:
        node += ["--dcgm-json", '"$work/dcgm.json"']
    parts.append("check nodes " + _in_image(spec, ['"${nodes[@]}"'], node) + "\n")
    if spec.gpus:
        ranks = [f"--ntasks-per-node={job.tasks_per_node}", "--mpi=pmix"]
        for test in NCCL_TESTS:
            binary = shlex.quote(f"{spec.nccl_tests_dir}/{test}")
            run = _in_image(spec, ranks, [binary, *NCCL_TESTS_ARGS])
            parse = _in_image(
                spec,
                ["--nodes=1", "--ntasks=1", '--nodelist="$first_node"'],
                [
                    "moe-preflight",
                    "nccl-tests",
                    "--log",
                    f'"$work/{test}.log"',
                    "--instance-type",
                    itype,
                    "--nodes",
                    '"$SLURM_JOB_NUM_NODES"',
                ],
            )
            parts.append(
                f"NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET {run} \\\n"
                f'    > "$work/{test}.log" 2>&1 || log "{test} exited $? (its log is checked next)"\n'
                f"check {test} {parse}\n"
            )
    if spec.trainium:
        parts.append(_nccom(spec))
        parts.append(_RESULT)
        return "\n".join(parts)  # the torch collectives run on CUDA or gloo, not on Neuron
    collectives = ["moe-preflight", "collectives", "--config", config]
    collectives += ["--local"] if job.local else ["--instance-type", itype]
    ranks = ['"${nodes[@]}"'] if job.local else [f"--ntasks-per-node={job.tasks_per_node}"]
    parts.append("check collectives " + _in_image(spec, ranks, collectives) + "\n")
    parts.append(_RESULT)
    return "\n".join(parts)


def _nccom(spec: PreflightSpec) -> str:
    ranks = catalog.lookup(spec.instance_type).ranks_per_node
    parse = _in_image(
        spec,
        ["--nodes=1", "--ntasks=1", '--nodelist="$first_node"'],
        [
            "moe-preflight",
            "nccom-test",
            "--log",
            '"$work/nccom_${operation}.log"',
            "--operation",
            '"$operation"',
            "--instance-type",
            shlex.quote(spec.instance_type),
            "--nodes",
            '"$SLURM_JOB_NUM_NODES"',
        ],
    )
    return (
        _NCCOM.replace("__OPERATIONS__", " ".join(NCCOM_OPERATIONS))
        .replace("__PORT__", str(NCCOM_PORT))
        .replace("__NEURON_BIN__", NEURON_BIN)
        .replace("__RANKS__", str(ranks))
        .replace("__ARGS__", " ".join(NCCOM_TEST_ARGS))
        .replace("__PARSE__", parse.replace("\n", "\n    "))
    )


def render_preflight_pytorchjob(spec: eks_job.EksJobSpec) -> dict:
    """The EKS preflight: a ``PyTorchJob`` named ``<job>-preflight`` on the training job's pod template,
    run once (no restarts: a failed preflight is a result)."""
    name = eks_job.suffixed_name(spec.name, "preflight")
    spec = dataclasses.replace(spec, name=name, metrics_port=None)
    itype = shlex.quote(spec.instance_type)
    script = f"moe-preflight node --instance-type {itype} --dcgm-level 0"
    trainium = catalog.lookup(spec.instance_type).accelerator_kind is catalog.AcceleratorKind.TRAINIUM
    if not trainium:  # the torch collectives run on CUDA; a Trainium preflight checks each node's devices only
        script += (
            f" && exec torchrun -m moe_cdk.cli.preflight -- collectives --config {eks_job.PROFILE_PATH} "
            f"--instance-type {itype}"
        )
    template = eks_job.pod_template(spec, ["bash", "-c", script], [], probes=False, host_network=not trainium)
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if spec.nodes > 1:
        replicas["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": "Never", "template": template}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": eks_job.labels(spec)},
        "spec": {
            "nprocPerNode": str(spec.devices_per_node),
            "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }


# The DLC's Open MPI, where the image's nccl-tests were built against it (training/Dockerfile).
MPIRUN = "/opt/amazon/openmpi/bin/mpirun"
MPIJOB_API = "kubeflow.org/v2beta1"


def render_preflight_mpijob(spec: eks_job.EksJobSpec, *, nccl_tests_dir: str = NCCL_TESTS_DIR) -> dict:
    """The EKS nccl-tests preflight: an ``MPIJob`` named ``<job>-nccl-tests`` whose workers are the training
    pods and whose launcher runs each test and checks its log; run once, exit 1 when any check failed."""
    name = eks_job.suffixed_name(spec.name, "nccl-tests")
    spec = dataclasses.replace(spec, name=name, metrics_port=None, preflight=False)
    itype = shlex.quote(spec.instance_type)
    ranks = spec.nodes * spec.devices_per_node
    lines = ["failed=0"]
    for test in NCCL_TESTS:
        mpirun = [
            MPIRUN, "--allow-run-as-root", "--tag-output", "-np", str(ranks), "-N", str(spec.devices_per_node),
            "--bind-to", "none", "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "NCCL_DEBUG=INFO",
            "-x", "NCCL_DEBUG_SUBSYS=INIT,NET", "-x", "FI_EFA_USE_HUGE_PAGE=0",
            shlex.quote(f"{nccl_tests_dir}/{test}"), *NCCL_TESTS_ARGS,
        ]  # fmt: skip
        lines += [
            f'{" ".join(mpirun)} > /tmp/{test}.log 2>&1 || echo "{test} exited $? (its log is checked next)"',
            f"moe-preflight nccl-tests --log /tmp/{test}.log --instance-type {itype} --nodes {spec.nodes} || failed=1",
        ]
    lines.append('exit "$failed"')
    worker = eks_job.pod_template(spec, [], [])
    container = worker["spec"]["containers"][0]
    for key in ("command", "args", "startupProbe", "readinessProbe", "livenessProbe"):
        container.pop(key)
    for key in ("hostNetwork", "dnsPolicy"):
        worker["spec"].pop(key)
    launcher = {
        "metadata": {"labels": eks_job.labels(spec)},
        "spec": {
            "containers": [
                {
                    "name": "launcher",
                    "image": spec.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["bash", "-c", "\n".join(lines)],
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
                }
            ],
        },
    }
    return {
        "apiVersion": MPIJOB_API,
        "kind": "MPIJob",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": eks_job.labels(spec)},
        "spec": {
            "slotsPerWorker": spec.devices_per_node,
            "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": launcher},
                "Worker": {"replicas": spec.nodes, "template": worker},
            },
        },
    }
