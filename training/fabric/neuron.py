"""Trainium's preflight checks: a node's Neuron devices by ``neuron-ls --json-output``, and an ``nccom-test`` run
(Neuron's collective benchmark) across nodes, each turned into a verdict against the instance catalog.

Formats, from AWS Neuron's documentation (aws-neuron/aws-neuron-sdk, ``tools/neuron-sys-tools/neuron-ls.rst`` and
``nccom-test.rst``):

- ``neuron-ls -j`` prints a JSON array, one object per Neuron device (chip): ``neuron_device``, ``nc_count`` (its
  logical NeuronCores: 4 on a Trainium2 at LNC 2), ``logical_neuroncore_config``, ``memory_size`` (bytes),
  ``neuroncore_ids``, ``neuron_processes`` (the processes holding it), ``connected_to`` and the PCI and NUMA
  fields, which are not checked.
- ``nccom-test`` prints a table headed ``size(B) count(elems) type time(us) algbw(GB/s) busbw(GB/s)`` (newer
  releases: ``time:avg(us)``), then ``Avg bus bandwidth: <x>GB/s``; a failed size prints ``Failure running
  neuron-bench`` and the run ends with ``<n> errors found - test failed``. Its "GB/s" are gibibytes per second
  (``nccom-test.rst``, "algbw(GB/s)": "in gibibytes (1GiB = 1,073,741,824 bytes) per second"; its 2-rank example
  agrees: 1073741824 B in 18930 us is 52.83 GiB/s), and busbw does not depend on the number of ranks (same
  table; awsome-distributed-training ``micro-benchmarks/nccom-tests/README.md`` says the same).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from moe_cdk.core import catalog
from moe_cdk.core.problems import Problem, problem

NEURON_LS = ("neuron-ls", "--json-output")
# The Neuron tools' folder (the Neuron training container puts it on PATH; a host install may not).
NEURON_BIN = "/opt/aws/neuron/bin"
NCCOM_OPERATIONS = ("all_reduce", "alltoall")
"""nccom-test's names for the two collectives the preflight runs."""


@dataclass(frozen=True, kw_only=True)
class NeuronDevice:
    """One chip as ``neuron-ls -j`` lists it."""

    index: int
    cores: int
    """Logical NeuronCores (``nc_count``)."""
    memory_bytes: int
    logical_nc_config: int | None
    processes: tuple[str, ...]
    """Commands of the processes that hold the device."""


def parse_neuron_ls(text: str) -> tuple[NeuronDevice, ...]:
    """The devices in ``neuron-ls --json-output``. Raises ``ValueError`` naming what is unreadable."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error.msg} at line {error.lineno}") from None
    if not isinstance(data, list):
        raise ValueError(f"not a JSON array of devices but a {type(data).__name__}")
    devices = []
    for i, entry in enumerate(data):
        try:
            devices.append(
                NeuronDevice(
                    index=int(entry["neuron_device"]),
                    cores=int(entry["nc_count"]),
                    memory_bytes=int(entry["memory_size"]),
                    logical_nc_config=(
                        int(entry["logical_neuroncore_config"]) if "logical_neuroncore_config" in entry else None
                    ),
                    processes=tuple(
                        str(p.get("command", p.get("pid", "?"))) for p in entry.get("neuron_processes", [])
                    ),
                )
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"device entry {i}: {error!r}") from None
    return tuple(devices)


def device_findings(spec: catalog.InstanceSpec, devices: tuple[NeuronDevice, ...]) -> tuple[str, list[Problem]]:
    """What one node's devices show against the catalog: every chip, its logical NeuronCores (one rank each), its
    memory, and no other process holding a device. Returns the fact to report and the problems."""
    found: list[Problem] = []
    if len(devices) != spec.accelerator_count:
        found.append(
            problem(
                f"not every Neuron device of a {spec.ec2_name} is visible",
                got=len(devices),
                allowed=str(spec.accelerator_count),
            ).at("neuron")
        )
    cores = sum(d.cores for d in devices)
    if cores != spec.ranks_per_node:
        configs = sorted({d.logical_nc_config for d in devices if d.logical_nc_config is not None})
        found.append(
            problem(
                "not the logical NeuronCores the job runs one rank on each of",
                got=f"{cores} (logical NeuronCore config {configs or 'unknown'})",
                allowed=f"{spec.ranks_per_node}: {spec.ranks_per_accelerator} per device, the default LNC 2",
            ).at("neuron.cores")
        )
    expected = round(spec.accelerator_memory_gib * 2**30)
    if small := [f"device {d.index}: {d.memory_bytes}" for d in devices if d.memory_bytes < expected]:
        found.append(
            problem("less device memory than the catalog's", got="; ".join(small), allowed=f"{expected} B").at(
                "neuron.memory"
            )
        )
    if busy := [f"device {d.index}: {', '.join(d.processes)}" for d in devices if d.processes]:
        found.append(problem("devices held by another process", got="; ".join(busy), allowed="none").at("neuron"))
    return f"{len(devices)}/{spec.accelerator_count} {spec.accelerator_model} devices, {cores} NeuronCores", found


@dataclass(frozen=True, kw_only=True)
class NccomRow:
    """One size of an ``nccom-test`` run; bandwidths in GiB/s, as it prints them under "GB/s"."""

    size_bytes: int
    algbw_gib_s: float
    busbw_gib_s: float


@dataclass(frozen=True, kw_only=True)
class NccomResult:
    rows: tuple[NccomRow, ...]
    average_busbw_gib_s: float | None
    failures: tuple[str, ...]
    """The lines that report a failed size or a failed run."""

    @property
    def busbw_at_largest_gib_s(self) -> float | None:
        return max(self.rows, key=lambda r: r.size_bytes).busbw_gib_s if self.rows else None


_AVERAGE = re.compile(r"Avg bus bandwidth:\s*([0-9.]+)\s*GB/s")
_FAILURE = re.compile(r"Failure running|errors? found|test failed|Driver is not running", re.IGNORECASE)


def parse_nccom_test(text: str) -> NccomResult:
    """The result table, average and failure lines of one ``nccom-test`` run."""
    columns: list[str] | None = None
    rows, failures = [], []
    average = None
    for line in text.splitlines():
        if _FAILURE.search(line):
            failures.append(line.strip())
            continue
        if match := _AVERAGE.search(line):
            average = float(match.group(1))
            continue
        tokens = line.split()
        if "size(B)" in tokens and "busbw(GB/s)" in tokens:
            columns = tokens
            continue
        if columns is None or len(tokens) != len(columns) or not tokens[0].isdigit():
            continue
        try:
            rows.append(
                NccomRow(
                    size_bytes=int(tokens[0]),
                    algbw_gib_s=float(tokens[columns.index("algbw(GB/s)")]),
                    busbw_gib_s=float(tokens[columns.index("busbw(GB/s)")]),
                )
            )
        except ValueError:
            continue
    return NccomResult(rows=tuple(rows), average_busbw_gib_s=average, failures=tuple(failures))


GIB = 1 << 30
NCCOM_FLOOR_FRACTION = 0.5
"""The share of the EFA line rate a run across nodes must reach: AWS publishes no nccom-test result for trn2,
so the floors are derived, with the half the GPUs' all-to-all floor allows for SRD and multi-rail overheads
(core/catalog.py). A fallback to TCP sockets lands far below either floor."""


def node_efa_gib_s(spec: catalog.InstanceSpec) -> float:
    """A node's EFA line rate in GiB/s (network_gbps, 10**9 bits per second)."""
    return spec.network_gbps * 1e9 / 8 / GIB


def nccom_floor_gib_s(spec: catalog.InstanceSpec, operation: str) -> float:
    """The least bus bandwidth, in nccom-test's GiB/s, accepted at the largest message of a run across nodes.

    - ``all_reduce``: half the node's EFA line rate. A ring all-reduce over node-contiguous ranks sends
      2(r-1)/r of the data out of each node, the bus-bandwidth factor itself, so its busbw across nodes follows
      the node's network bandwidth, whatever the ranks per node.
    - ``alltoall``: half the line rate per rank. Every rank sends its own share across the nodes, so the node's
      bandwidth is divided among its ranks (the N/(N-1) x per-rank bound of the GPUs' floor, core/catalog.py).
    """
    node = NCCOM_FLOOR_FRACTION * node_efa_gib_s(spec)
    return node if operation == "all_reduce" else node / spec.ranks_per_node
