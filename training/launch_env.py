"""Where this training process sits in the job: the distributed launch environment.

``detect()`` reads the process environment that a launcher left behind and returns a
``LaunchEnv``: this process's rank, the world size, its place on its node, the number of
nodes, and the rendezvous address that ``torch.distributed``'s ``env://`` init needs.
The launchers are checked in this order, the first that matches wins:

1. ``torchrun`` (``TORCHELASTIC_RUN_ID``, or ``LOCAL_RANK``, ``RANK`` and ``WORLD_SIZE``):
   one process per rank, everything read from torchrun's variables.
2. Slurm (``SLURM_PROCID``): ``srun`` starts every rank itself, one task per process; the
   rendezvous host is ``MASTER_ADDR`` or the first host of the job's node list.
3. SageMaker Training Jobs (the resource config file, or ``SM_HOSTS`` and
   ``SM_CURRENT_HOST``): SageMaker starts ONE process per host, so this process is the
   per-node launcher. Its ``LaunchEnv`` describes local rank 0 of its node; the trainer
   then starts ``local_world_size`` ranks with torchrun's variables (``node_launcher``),
   and the ranks it starts see case 1.
4. Kubeflow PyTorchJob with ``nprocPerNode`` (``PET_NPROC_PER_NODE``): the training operator
   starts one process per pod and describes the node with ``PET_NNODES``, ``PET_NODE_RANK``,
   ``PET_NPROC_PER_NODE`` and ``PET_MASTER_ADDR``/``PET_MASTER_PORT``. As on SageMaker, this
   process is the node's launcher (``node_launcher``), standing for its local rank 0.
   Without ``nprocPerNode`` (``MASTER_ADDR``, ``WORLD_SIZE`` and ``RANK`` but no
   ``LOCAL_RANK``): one process per pod, with ``RANK`` and ``WORLD_SIZE`` per pod.
5. Anything else is a single process: rank 0 of a world of 1, which meets in-process (``solo_store``).

Values that cannot be used raise ``ConfigError`` carrying every problem found, one
``<VARIABLE>: <what is wrong> (got <value>; allowed <what is allowed>)`` line each, the
project's error format. Standard library and python-hostlist (pure Python) only: this runs
before torch is imported (``solo_store`` imports it when called).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import hostlist

from moe_cdk.core.problems import ConfigError, Problem, problem

DEFAULT_MASTER_PORT = 29500
"""The rendezvous port when the launcher names none (torchrun's own default)."""

KUBEFLOW_MASTER_PORT = 23456
"""The Kubeflow training operator's default ``MASTER_PORT``."""

SAGEMAKER_RESOURCE_CONFIG = "/opt/ml/input/config/resourceconfig.json"
"""Where a SageMaker Training Job describes its hosts."""

_PORT_ALLOWED = "1 to 65535"
_HOST_ALLOWED = "a host name or IP address"
_HOSTLIST_ALLOWED = "a Slurm hostlist such as node[01-04],gpu-7"
_INTEGER = re.compile(r"[+-]?\d+")
# An empty (or blank) pattern: at the start, between two commas, or at the end. Inside brackets the
# same text is an empty range, which python-hostlist refuses anyway.
_EMPTY_PATTERN = re.compile(r"(?:^|,)\s*(?:,|$)")


@dataclass(frozen=True, kw_only=True)
class LaunchEnv:
    """This process's place in a distributed training job."""

    launcher: str
    """What started this process: ``torchrun``, ``slurm``, ``kubeflow``, ``sagemaker`` or ``single``; ``local``
    for ``moe-train --nproc-per-node N``, whose process launches this machine's ranks."""

    rank: int
    """Global rank of this process, 0 to ``world_size - 1``."""

    world_size: int
    """Number of processes in the job, all nodes together."""

    local_rank: int
    """Rank of this process on its node, 0 to ``local_world_size - 1``; picks its accelerator."""

    local_world_size: int
    """Number of processes on this node."""

    node_rank: int
    """Index of this node, 0 to ``num_nodes - 1``."""

    num_nodes: int
    """Number of nodes in the job."""

    master_addr: str
    """Host of the rank 0 process, where every rank meets."""

    master_port: int
    """TCP port on ``master_addr`` where every rank meets."""

    def torch_env(self) -> dict[str, str]:
        """The variables ``torch.distributed``'s ``env://`` init reads, as strings."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def solo_store(self):
        """For ``init_process_group``: an in-process store when the world is this one process, which
        has nobody to meet, else None (torch's ``env://`` rendezvous on ``master_addr:master_port``).
        A world of one binds no port: one free when the run started may be taken by the time the
        slow imports are done (CI, stop 49: EADDRINUSE)."""
        if self.world_size > 1:
            return None
        import torch.distributed as dist  # after the caller set CUDA's variables, as the module asks

        return dist.HashStore()


def detect(
    environ: Mapping[str, str] | None = None,
    *,
    sagemaker_resource_config: str | Path = SAGEMAKER_RESOURCE_CONFIG,
) -> LaunchEnv:
    """Work out the launch environment from ``environ`` (``os.environ`` when None).

    ``sagemaker_resource_config`` is the SageMaker host description; it only counts when
    the file exists. See the module docstring for the launchers and their order.
    Raises ``ConfigError`` with every problem when a value cannot be used.
    """
    env = os.environ if environ is None else environ
    config = Path(sagemaker_resource_config)
    if "TORCHELASTIC_RUN_ID" in env or all(name in env for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE")):
        return _torchrun(_Reader(env))
    if "SLURM_PROCID" in env:
        return _slurm(_Reader(env))
    if config.is_file() or ("SM_HOSTS" in env and "SM_CURRENT_HOST" in env):
        return _sagemaker(_Reader(env), config if config.is_file() else None)
    if "PET_NPROC_PER_NODE" in env:
        return _kubeflow_node(_Reader(env))
    if all(name in env for name in ("MASTER_ADDR", "WORLD_SIZE", "RANK")):
        return _kubeflow(_Reader(env))
    return _single(_Reader(env))


def expand_hostlist(spec: str) -> list[str]:
    """Expand Slurm's compressed hostlist syntax into host names, in order (python-hostlist's
    ``expand_hostlist``).

    ``"node[01-03,7],gpu-5"`` gives ``node01, node02, node03, node7, gpu-5``: commas outside
    brackets separate patterns, a bracket holds numbers and ``lo-hi`` ranges, and a range
    keeps the zero padding of its lower bound (``node[08-10]`` gives ``node08`` to
    ``node10``). Several bracket groups in one pattern expand to every combination.
    Raises ``ValueError`` for an empty or malformed list: python-hostlist skips empty patterns
    (``"a,,b"``, ``""``), which Slurm never writes, so they are refused here before it runs.
    """
    if _EMPTY_PATTERN.search(spec):
        raise ValueError(f"empty host pattern in Slurm hostlist {spec!r}")
    try:
        # Every host as the list names it, repeats included (python-hostlist drops them by default).
        hosts = hostlist.expand_hostlist(spec, allow_duplicates=True)
    except hostlist.BadHostlist as error:
        raise ValueError(f"{error} in Slurm hostlist {spec!r}") from error
    return [host.strip() for host in hosts]  # blanks around a pattern ("a, b") are not part of its name


class _Reader:
    """Reads variables from one environment and collects every problem instead of stopping at the first."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ
        self.problems: list[Problem] = []

    def add(self, key: str, what: str, *, got: object, allowed: str) -> None:
        self.problems.append(problem(what, got=got, allowed=allowed).at(key))

    def integer(
        self,
        name: str,
        *,
        allowed: str,
        minimum: int = 0,
        maximum: int | None = None,
        required: bool = True,
        default: int | None = None,
    ) -> int | None:
        """The integer in ``name``; ``default`` when unset and not ``required``; None after a problem."""
        raw = self.environ.get(name)
        if raw is None:
            if required:
                self.add(name, "not set", got=None, allowed=allowed)
            return default
        if not _INTEGER.fullmatch(raw.strip()):
            self.add(name, "not an integer", got=raw, allowed=allowed)
            return None
        value = int(raw)
        if value < 0 <= minimum:
            self.add(name, "must not be negative", got=raw, allowed=allowed)
        elif value < minimum:
            self.add(name, f"must be at least {minimum}", got=raw, allowed=allowed)
        elif maximum is not None and value > maximum:
            self.add(name, f"must be at most {maximum}", got=raw, allowed=allowed)
        else:
            return value
        return None

    def host(self, name: str, *, default: str | None = None) -> str | None:
        """The host name in ``name``; ``default`` when unset (a problem when that is None too)."""
        raw = self.environ.get(name)
        if raw is None:
            if default is None:
                self.add(name, "not set", got=None, allowed=_HOST_ALLOWED)
            return default
        if not raw.strip():
            self.add(name, "empty", got=raw, allowed=_HOST_ALLOWED)
            return None
        return raw.strip()

    def port(self, default: int, *, variable: str = "MASTER_PORT") -> int | None:
        return self.integer(variable, allowed=_PORT_ALLOWED, minimum=1, maximum=65535, required=False, default=default)

    def below(self, name: str, value: int | None, limit_name: str, limit: int | None) -> None:
        """A problem when ``value`` is not below ``limit`` (skipped when either could not be read)."""
        if value is not None and limit is not None and value >= limit:
            self.add(name, f"must be less than {limit_name}", got=value, allowed=f"0 to {limit - 1}")

    def build(self, **fields: object) -> LaunchEnv:
        if self.problems:
            raise ConfigError(self.problems)
        return LaunchEnv(**fields)  # type: ignore[arg-type]


def _torchrun(r: _Reader) -> LaunchEnv:
    rank = r.integer("RANK", allowed="0 to WORLD_SIZE-1")
    world_size = r.integer("WORLD_SIZE", allowed="1 or more", minimum=1)
    local_rank = r.integer("LOCAL_RANK", allowed="0 to LOCAL_WORLD_SIZE-1")
    local_world_size = r.integer("LOCAL_WORLD_SIZE", allowed="1 to WORLD_SIZE", minimum=1, required=False, default=1)
    group_rank = r.integer("GROUP_RANK", allowed="0 to the number of nodes - 1", required=False)
    r.below("RANK", rank, "WORLD_SIZE", world_size)
    r.below("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world_size)
    num_nodes = node_rank = None
    if world_size is not None and local_world_size is not None:
        if local_world_size > world_size:
            r.add("LOCAL_WORLD_SIZE", "must not exceed WORLD_SIZE", got=local_world_size, allowed=f"1 to {world_size}")
        elif world_size % local_world_size:
            r.add(
                "WORLD_SIZE",
                "not a multiple of LOCAL_WORLD_SIZE",
                got=world_size,
                allowed=f"a multiple of {local_world_size}",
            )
        else:
            num_nodes = world_size // local_world_size
    if group_rank is not None:
        node_rank = group_rank
        r.below("GROUP_RANK", group_rank, "WORLD_SIZE / LOCAL_WORLD_SIZE", num_nodes)
    elif rank is not None and local_world_size is not None:
        node_rank = rank // local_world_size
    # A single-node run may leave the rendezvous host out; several nodes must name it.
    master_addr = r.host("MASTER_ADDR", default="127.0.0.1" if num_nodes == 1 else None)
    master_port = r.port(DEFAULT_MASTER_PORT)
    return r.build(
        launcher="torchrun",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
    )


def _slurm(r: _Reader) -> LaunchEnv:
    env = r.environ
    rank = r.integer("SLURM_PROCID", allowed="0 to SLURM_NTASKS-1")
    world_size = r.integer("SLURM_NTASKS", allowed="1 or more", minimum=1)
    local_rank = r.integer("SLURM_LOCALID", allowed="0 to the tasks per node - 1")
    node_rank = r.integer("SLURM_NODEID", allowed="0 to SLURM_NNODES-1")
    nodes_name = "SLURM_JOB_NUM_NODES" if "SLURM_NNODES" not in env and "SLURM_JOB_NUM_NODES" in env else "SLURM_NNODES"
    num_nodes = r.integer(nodes_name, allowed="1 to SLURM_NTASKS", minimum=1)
    r.below("SLURM_PROCID", rank, "SLURM_NTASKS", world_size)
    r.below("SLURM_NODEID", node_rank, nodes_name, num_nodes)

    local_world_size = None
    per_node = env.get("SLURM_NTASKS_PER_NODE", "").strip()
    if per_node.isdigit() and int(per_node) > 0:
        local_world_size = int(per_node)
    elif world_size is not None and num_nodes is not None:
        # Without a plain per-node count, every node must run the same number of tasks.
        if num_nodes > world_size:
            r.add(nodes_name, "more nodes than tasks", got=num_nodes, allowed=f"1 to {world_size}")
        elif world_size % num_nodes:
            r.add(
                "SLURM_NTASKS", f"not a multiple of {nodes_name}", got=world_size, allowed=f"a multiple of {num_nodes}"
            )
        else:
            local_world_size = world_size // num_nodes
    r.below("SLURM_LOCALID", local_rank, "the tasks per node", local_world_size)

    master_addr = r.host("MASTER_ADDR") if "MASTER_ADDR" in env else _first_slurm_host(r)
    master_port = r.port(DEFAULT_MASTER_PORT)
    return r.build(
        launcher="slurm",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
    )


def _first_slurm_host(r: _Reader) -> str | None:
    name = (
        "SLURM_NODELIST"
        if "SLURM_JOB_NODELIST" not in r.environ and "SLURM_NODELIST" in r.environ
        else "SLURM_JOB_NODELIST"
    )
    spec = r.environ.get(name)
    if spec is None:
        r.add(name, "not set and MASTER_ADDR not set either", got=None, allowed=_HOSTLIST_ALLOWED)
        return None
    if not spec.strip():
        r.add(name, "empty node list", got=spec, allowed=_HOSTLIST_ALLOWED)
        return None
    try:
        return expand_hostlist(spec)[0]
    except ValueError:
        r.add(name, "not a valid Slurm hostlist", got=spec, allowed=_HOSTLIST_ALLOWED)
        return None


def _sagemaker(r: _Reader, config: Path | None) -> LaunchEnv:
    if config is not None:
        hosts_key, current_key = f"{config}:hosts", f"{config}:current_host"
        try:
            document = json.loads(config.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            r.add(str(config), "not readable JSON", got=str(error), allowed="a SageMaker resource config")
            document = None
        if document is not None and not isinstance(document, dict):
            r.add(str(config), "not a JSON object", got=document, allowed="a SageMaker resource config")
            document = None
        if document is None:  # already reported; nothing further to check
            return r.build()
        hosts, current_host = document.get("hosts"), document.get("current_host")
    else:
        hosts_key, current_key = "SM_HOSTS", "SM_CURRENT_HOST"
        current_host = r.environ["SM_CURRENT_HOST"]
        try:
            hosts = json.loads(r.environ["SM_HOSTS"])
        except json.JSONDecodeError:
            r.add(hosts_key, "not a JSON list", got=r.environ["SM_HOSTS"], allowed='a JSON list such as ["algo-1"]')
            hosts = None

    if hosts is None and config is None:
        hosts = []  # SM_HOSTS is not JSON, already reported
    elif not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        r.add(hosts_key, "not a list of host names", got=hosts, allowed='a JSON list such as ["algo-1"]')
        hosts = []
    elif not hosts:
        r.add(hosts_key, "empty host list", got=hosts, allowed="one or more host names")
    hosts = sorted(hosts)
    node_rank = None
    if not isinstance(current_host, str):
        r.add(current_key, "not a host name", got=current_host, allowed=_HOST_ALLOWED)
    elif hosts and current_host not in hosts:
        r.add(current_key, "not one of the hosts", got=current_host, allowed=", ".join(hosts))
    elif hosts:
        node_rank = hosts.index(current_host)

    gpus = r.integer("SM_NUM_GPUS", allowed="0 or more", required=False, default=0)
    neurons = r.integer("SM_NUM_NEURONS", allowed="0 or more", required=False, default=0)
    local_world_size = gpus if gpus else neurons if neurons else 1
    num_nodes = len(hosts)
    master_port = r.port(DEFAULT_MASTER_PORT)
    # This process is the per-node launcher, so it stands for local rank 0 of its node.
    return r.build(
        launcher="sagemaker",
        rank=None if node_rank is None else node_rank * local_world_size,
        world_size=num_nodes * local_world_size,
        local_rank=0,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=hosts[0] if hosts else None,
        master_port=master_port,
    )


def _kubeflow(r: _Reader) -> LaunchEnv:
    rank = r.integer("RANK", allowed="0 to WORLD_SIZE-1")
    world_size = r.integer("WORLD_SIZE", allowed="1 or more", minimum=1)
    r.below("RANK", rank, "WORLD_SIZE", world_size)
    master_addr = r.host("MASTER_ADDR")
    master_port = r.port(KUBEFLOW_MASTER_PORT)
    return r.build(
        launcher="kubeflow",
        rank=rank,
        world_size=world_size,
        local_rank=0,
        local_world_size=1,
        node_rank=rank,
        num_nodes=world_size,
        master_addr=master_addr,
        master_port=master_port,
    )


def _kubeflow_node(r: _Reader) -> LaunchEnv:
    # kubeflow/training-operator, pkg/controller.v1/pytorch/envvar.go: PET_NPROC_PER_NODE,
    # PET_NNODES and PET_NODE_RANK describe the node; MASTER_ADDR/MASTER_PORT the rendezvous.
    local_world_size = r.integer("PET_NPROC_PER_NODE", allowed="1 or more", minimum=1)
    num_nodes = r.integer("PET_NNODES", allowed="1 or more", minimum=1)
    node_rank = r.integer("PET_NODE_RANK", allowed="0 to PET_NNODES-1")
    r.below("PET_NODE_RANK", node_rank, "PET_NNODES", num_nodes)
    address_variable = "PET_MASTER_ADDR" if "PET_MASTER_ADDR" in r.environ else "MASTER_ADDR"
    master_addr = r.host(address_variable)
    port_variable = "PET_MASTER_PORT" if "PET_MASTER_PORT" in r.environ else "MASTER_PORT"
    master_port = r.port(KUBEFLOW_MASTER_PORT, variable=port_variable)
    rank = None if node_rank is None or local_world_size is None else node_rank * local_world_size
    world_size = None if num_nodes is None or local_world_size is None else num_nodes * local_world_size
    # This process is the node's launcher, so it stands for local rank 0 of its node.
    return r.build(
        launcher="kubeflow",
        rank=rank,
        world_size=world_size,
        local_rank=0,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
    )


def _single(r: _Reader) -> LaunchEnv:
    # Nobody else joins a single-process group, which meets in-process (solo_store): the port is
    # only what the environment says, never bound.
    master_port = r.port(DEFAULT_MASTER_PORT)
    return r.build(
        launcher="single",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=master_port,
    )
