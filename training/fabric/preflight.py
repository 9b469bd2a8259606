"""The preflight's checks: one node's GPUs and EFA devices, nccl-tests runs, and the torch collectives,
each turned into a verdict against the instance catalog.

A verdict is one line, ``preflight <subject>: PASS <what was measured>`` or ``preflight <subject>:
FAIL <problem>; <problem>``, where each problem is the project's one format (``key: what is wrong
(got ...; allowed ...)``). The preflight job prints one verdict per node and one per collective, and
exits 1 when any of them failed (cli/preflight.py).

``check_nccom_test`` reads Neuron's ``nccom-test`` output the same way as nccl-tests'.

The node checks run the node's own tools through ``run_tool`` and parse their output with
``training.fabric.logs``:

- ``nvidia-smi --query-gpu=...``: the GPU count and model against the catalog, and no GPU with
  uncorrected volatile ECC errors;
- ``dcgmi diag -r LEVEL -j``, run on the host (DCGM is not in the training image) and handed over as
  a file: every test passed;
- ``neuron-ls --json-output`` on Trainium (``training.fabric.neuron``): every chip, its logical NeuronCores
  (one rank each), its memory, and no device held by another process;
- ``fi_info -p efa``: the EFA device count against the catalog's ``efa_interfaces``;
- ``fi_info --version``: the libfabric version, reported.

A ``local`` node (a CPU cluster such as the two-node Slurm of the tests) has no GPU or EFA to check:
its verdict reports the interpreter, torch and whether gloo is available.
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from moe_cdk.core import catalog
from moe_cdk.core.problems import Problem, problem
from moe_cdk.training.fabric import logs as fabric_logs, neuron as neuron_fabric
from moe_cdk.training.fabric.bench import CollectiveResult, DispatchShape

FI_INFO_EFA = ("fi_info", "-p", "efa")
FI_INFO_VERSION = ("fi_info", "--version")
# The EFA installer puts fi_info here, outside the default PATH (EFA user guide, "Get started with EFA and
# NCCL": /opt/amazon/efa/bin/fi_info -p efa -t FI_EP_RDM).
EFA_BIN = "/opt/amazon/efa/bin"
TOOL_TIMEOUT_S = 120


@dataclass(frozen=True, kw_only=True)
class ToolOutput:
    """What one command printed, and how it ended."""

    argv: tuple[str, ...]
    returncode: int
    """The exit status; 127 when the command does not exist, 124 when it ran past its timeout."""
    stdout: str = ""
    stderr: str = ""

    def failure(self, key: str) -> Problem | None:
        """A problem naming the command when it did not succeed, else None."""
        if self.returncode == 0:
            return None
        first = (self.stderr.strip() or self.stdout.strip()).splitlines()[:1]
        what = {127: "not installed", 124: f"ran past {TOOL_TIMEOUT_S} s"}.get(self.returncode, "failed")
        return problem(
            f"{' '.join(self.argv)} {what}",
            got=f"exit {self.returncode}" + (f": {first[0]}" if first else ""),
            allowed="exit 0",
        ).at(key)


Runner = Callable[[Sequence[str]], ToolOutput]


def run_tool(argv: Sequence[str], *, timeout_s: float = TOOL_TIMEOUT_S) -> ToolOutput:
    """Run one diagnostic command, never raising: a missing command is exit 127, a hung one 124."""
    command = list(argv)
    for name, folder in (("fi_info", EFA_BIN), ("neuron-ls", neuron_fabric.NEURON_BIN)):
        if command[0] == name and Path(folder, name).exists():
            command[0] = str(Path(folder, name))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return ToolOutput(argv=tuple(argv), returncode=127, stderr=f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return ToolOutput(argv=tuple(argv), returncode=124)
    return ToolOutput(argv=tuple(argv), returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The outcome of one subject's checks."""

    subject: str
    """A node name, or a collective (``all_reduce_perf``, ``ep_all_to_all``)."""
    facts: tuple[str, ...] = ()
    """What was measured, in the order it was checked."""
    problems: tuple[Problem, ...] = ()
    """Every check that failed."""

    @property
    def passed(self) -> bool:
        return not self.problems

    def line(self) -> str:
        """The one-line verdict the job prints."""
        if self.passed:
            return f"preflight {self.subject}: PASS {', '.join(self.facts)}".rstrip()
        return f"preflight {self.subject}: FAIL {'; '.join(str(p) for p in self.problems)}"


@dataclass
class _Findings:
    facts: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def verdict(self, subject: str) -> Verdict:
        return Verdict(subject=subject, facts=tuple(self.facts), problems=tuple(self.problems))


def _gpus(found: _Findings, spec: catalog.InstanceSpec, output: ToolOutput) -> None:
    if (failed := output.failure("gpus")) is not None:
        found.problems.append(failed)
        return
    try:
        gpus = fabric_logs.parse_nvidia_smi(output.stdout)
    except ValueError as error:
        unreadable = problem("unreadable nvidia-smi output", got=str(error), allowed="its CSV rows")
        found.problems.append(unreadable.at("gpus"))
        return
    if len(gpus) != spec.accelerator_count:
        found.problems.append(
            problem(
                f"not every GPU of a {spec.ec2_name} is visible",
                got=len(gpus),
                allowed=str(spec.accelerator_count),
            ).at("gpus")
        )
    wrong = sorted({g.name for g in gpus if spec.accelerator_model not in g.name})
    if wrong:
        found.problems.append(
            problem("not the catalog's GPU model", got=", ".join(wrong), allowed=spec.accelerator_model).at("gpus")
        )
    ecc = [f"GPU {g.index}: {g.ecc_uncorrected}" for g in gpus if g.ecc_uncorrected]
    if ecc:
        found.problems.append(problem("uncorrected ECC errors", got="; ".join(ecc), allowed="0").at("gpus.ecc"))
    found.facts.append(f"{len(gpus)}/{spec.accelerator_count} {spec.accelerator_model} GPUs")


def _neuron(found: _Findings, spec: catalog.InstanceSpec, output: ToolOutput) -> None:
    if (failed := output.failure("neuron")) is not None:
        found.problems.append(failed)
        return
    try:
        devices = neuron_fabric.parse_neuron_ls(output.stdout)
    except ValueError as error:
        found.problems.append(
            problem("unreadable neuron-ls output", got=str(error), allowed="neuron-ls -j's JSON").at("neuron")
        )
        return
    fact, problems = neuron_fabric.device_findings(spec, devices)
    found.facts.append(fact)
    found.problems.extend(problems)


def _dcgm(found: _Findings, level: int, dcgm_json: Path | None) -> None:
    if level == 0:
        return
    if dcgm_json is None or not dcgm_json.is_file():
        found.problems.append(
            problem(f"no DCGM level {level} result", got=str(dcgm_json), allowed="dcgmi diag -j output").at("dcgm")
        )
        return
    try:
        diag = fabric_logs.parse_dcgm_diag(dcgm_json.read_text())
    except ValueError as error:
        found.problems.append(
            problem("unreadable DCGM result", got=str(error), allowed="dcgmi diag -j output").at("dcgm")
        )
        return
    if diag.passed:
        found.facts.append(f"DCGM level {level} passed")
    else:
        found.problems.append(
            problem(
                f"DCGM level {level} diagnostics failed", got="; ".join(diag.failures), allowed="every test passing"
            ).at("dcgm")
        )


def _efa(found: _Findings, spec: catalog.InstanceSpec, devices: ToolOutput, version: ToolOutput) -> None:
    if not spec.supports_efa:
        return
    if (failed := devices.failure("efa")) is not None:
        found.problems.append(failed)
    else:
        count = fabric_logs.parse_fi_info(devices.stdout).device_count
        if count != spec.efa_interfaces:
            found.problems.append(
                problem(
                    f"not every EFA device of a {spec.ec2_name} is visible",
                    got=count,
                    allowed=str(spec.efa_interfaces),
                ).at("efa")
            )
        found.facts.append(f"{count}/{spec.efa_interfaces} EFA devices")
    if version.returncode == 0 and (libfabric := fabric_logs.parse_fi_info_version(version.stdout)):
        found.facts.append(f"libfabric {libfabric}")


def check_node(
    node: str,
    *,
    instance_type: str | None,
    local: bool = False,
    dcgm_level: int = 0,
    dcgm_json: Path | None = None,
    run: Runner = run_tool,
) -> Verdict:
    """Check this node against the catalog's ``instance_type`` (or, ``local``, only the CPU stack)."""
    found = _Findings()
    if local:
        import torch
        import torch.distributed as dist

        found.facts += [f"python {platform.python_version()}", f"torch {torch.__version__}"]
        if not dist.is_gloo_available():
            found.problems.append(problem("torch was built without gloo", got="no gloo", allowed="gloo").at("gloo"))
        return found.verdict(node)
    spec = catalog.lookup(instance_type or "")
    if spec is None:
        return Verdict(subject=node, problems=(catalog.unknown_instance_type(instance_type or "").at("instance_type"),))
    if spec.accelerator_kind is catalog.AcceleratorKind.NVIDIA_GPU:
        _gpus(found, spec, run(fabric_logs.NVIDIA_SMI_QUERY))
        _dcgm(found, dcgm_level, dcgm_json)
    elif spec.accelerator_kind is catalog.AcceleratorKind.TRAINIUM:
        _neuron(found, spec, run(neuron_fabric.NEURON_LS))
    _efa(found, spec, run(FI_INFO_EFA), run(FI_INFO_VERSION))
    return found.verdict(node)


def check_nccl_tests(
    text: str, *, collective: str, instance_type: str | None, nodes: int, local: bool = False
) -> Verdict:
    """One nccl-tests run (``all_reduce_perf`` or ``alltoall_perf``) with ``NCCL_DEBUG=INFO``: no
    wrong values, EFA selected where the instance has it, and, across nodes, the largest message's
    bus bandwidth at or above the catalog's floor."""
    found = _Findings()
    result = fabric_logs.parse_nccl_tests(text)
    if not result.rows:
        return Verdict(
            subject=collective,
            problems=(
                problem("no result table in the output", got="no rows", allowed="nccl-tests output").at(collective),
            ),
        )
    if result.wrong_total:
        found.problems.append(problem("wrong values", got=result.wrong_total, allowed="0").at(f"{collective}.wrong"))
    busbw = result.busbw_at_largest_gb_s or 0.0
    found.facts.append(f"busbw {busbw:.1f} GB/s at {max(r.size_bytes for r in result.rows)} B")
    spec = None if local else catalog.lookup(instance_type or "")
    floor = catalog.fabric_floor(spec.ec2_name) if spec is not None else None
    key = "all_reduce_busbw_gb_s" if collective.startswith("all_reduce") else "alltoall_busbw_gb_s"
    if floor is not None and nodes >= 2 and busbw < getattr(floor, key):
        found.problems.append(
            problem(
                f"bus bandwidth below the {spec.ec2_name} floor",
                got=f"{busbw:.1f} GB/s",
                allowed=f"{getattr(floor, key):g} GB/s or more ({floor.source})",
            ).at(f"{collective}.busbw")
        )
    _network(found, fabric_logs.parse_nccl_debug(text), spec, collective)
    return found.verdict(collective)


def check_nccom_test(text: str, *, operation: str, instance_type: str, nodes: int) -> Verdict:
    """One ``nccom-test`` run on Trainium: a result table, no failed size, and across nodes the largest message's
    bus bandwidth at or above ``neuron.nccom_floor_gib_s`` for ``operation``. Bandwidths are in GiB/s, the unit
    nccom-test prints under "GB/s"."""
    subject = f"nccom_{operation}"
    result = neuron_fabric.parse_nccom_test(text)
    found = _Findings()
    if result.failures:
        failed = problem("nccom-test failed", got=" | ".join(result.failures[:3]), allowed="no failure")
        found.problems.append(failed.at(subject))
    if not result.rows:
        found.problems.append(problem("no result table", got="no rows", allowed="nccom-test output").at(subject))
        return found.verdict(subject)
    busbw = result.busbw_at_largest_gib_s
    found.facts.append(f"busbw {busbw:.2f} GiB/s at {max(r.size_bytes for r in result.rows)} B")
    if result.average_busbw_gib_s is not None:
        found.facts.append(f"average busbw {result.average_busbw_gib_s:.2f} GiB/s")
    spec = catalog.lookup(instance_type)
    if spec is None:
        found.problems.append(catalog.unknown_instance_type(instance_type).at("instance_type"))
    elif nodes >= 2 and busbw < (floor := neuron_fabric.nccom_floor_gib_s(spec, operation)):
        line = neuron_fabric.node_efa_gib_s(spec)
        share = (
            f"half the node's EFA line rate, {spec.network_gbps} Gbps = {line:.2f} GiB/s"
            if operation == "all_reduce"
            else f"half the EFA line rate per rank, {line:.2f} GiB/s / {spec.ranks_per_node} ranks"
        )
        found.problems.append(
            problem(
                f"bus bandwidth below the {spec.ec2_name} floor",
                got=f"{busbw:.2f} GiB/s",
                allowed=f"{floor:.2f} GiB/s or more ({share})",
            ).at(f"{subject}.busbw")
        )
    return found.verdict(subject)


def _network(found: _Findings, report: fabric_logs.NcclNetReport, spec: catalog.InstanceSpec | None, key: str) -> None:
    for name, value in (
        ("NCCL", report.nccl_version),
        ("aws-ofi-nccl", report.ofi_plugin_version),
        ("provider", report.provider),
    ):
        if value:
            found.facts.append(f"{name} {value}")
    if spec is not None and spec.supports_efa and not report.uses_efa:
        found.problems.append(
            problem(
                "NCCL is not using EFA",
                got=f"network {report.network or 'unknown'}, provider {report.provider or 'none'}",
                allowed="NET/OFI selected provider efa",
            ).at(f"{key}.network")
        )


def check_nccl_network(subject: str, nccl_log: str, *, instance_type: str | None) -> Verdict:
    """What one process's NCCL log (``NCCL_DEBUG=INFO``) says it chose: on an EFA instance, the
    libfabric network with the efa provider."""
    found = _Findings()
    _network(found, fabric_logs.parse_nccl_debug(nccl_log), catalog.lookup(instance_type or ""), "nccl")
    return found.verdict(subject)


def check_collective(result: CollectiveResult, *, shape: DispatchShape | None = None) -> Verdict:
    """A torch collective's figure. A collective that moved wrong data or failed never gets here: it raises."""
    facts = [
        f"busbw {result.busbw_gb_s:.2f} GB/s, algbw {result.algbw_gb_s:.2f} GB/s, {result.time_us:.1f} us "
        f"for {result.bytes_per_rank} B per rank over {result.ranks} ranks"
    ]
    if shape is not None:
        facts.append(shape.describe())
    return Verdict(
        subject="ep_all_to_all" if result.collective == "all_to_all" else result.collective, facts=tuple(facts)
    )
