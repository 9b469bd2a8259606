"""Parsers for what the fabric preflight's tools print: nccl-tests tables, NCCL's ``NCCL_DEBUG=INFO``
log, ``fi_info``, ``nvidia-smi`` and ``dcgmi diag -j``.

Each parser takes the text a tool printed and returns a frozen dataclass; none runs a command and
none imports torch (standard library only), so the checks in ``training.fabric.preflight`` and their tests
feed them captured text. The formats were learned from the tools' sources and from real logs; the
test fixtures under ``tests/fixtures/fabric/`` are such logs, with their sources in ``SOURCES.md``:

- nccl-tests (NVIDIA/nccl-tests ``src/common.cu`` at v2.13.x to v2.16.x, ``src/util.cu`` at
  a0b82b2): a commented header, then one row per message size: size, count, type, redop, root,
  then time, algbw, busbw and #wrong twice (out-of-place, in-place). Since 2.19.3 ``-I`` (per-iteration
  timing) adds i_min, i_max, i_p99 and i_cv% after each #wrong, and ``-S`` (report timestamps) a
  two-token timestamp; the header names the columns, so the parser reads them from it. alltoall
  prints ``none`` and ``-1`` as redop and root and ``N/A`` as the in-place #wrong; versions before
  2.13 had no root column and a max-error column (``error``) in place of #wrong.
- NCCL's net plugin lines (NVIDIA/nccl ``src/net.cc`` at v2.18.5-1, v2.19.3-1 and v2.21.5-1,
  ``src/plugin/plugin_open.cc`` and ``src/plugin/net.cc`` at 5067397): how a plugin that could not be
  loaded is reported changed with almost every release.
- aws-ofi-nccl (aws/aws-ofi-nccl ``src/nccl_ofi_net.c(pp)``, tags v1.1.0 to v1.18.0): ``Initializing
  aws-ofi-nccl <version>``; ``Selected Provider is efa`` (up to 1.6), ``Selected Provider is efa (found
  4 nics)`` (1.7 to 1.13), ``Selected provider is efa, fabric is efa-direct (found 16 nics)`` (1.14
  on); the plugin's network is ``AWS Libfabric`` up to 1.13 and ``Libfabric`` from 1.14
  (``src/nccl_ofi_interface_nvidia.c(pp)``).

Launchers prefix lines: ``srun -l`` writes the task id (``0: ``) and Open MPI's ``--tag-output``
writes ``[1,0]<stdout>:``; both are removed before a line is read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NamedTuple

NVIDIA_SMI_QUERY: tuple[str, ...] = (
    "nvidia-smi",
    "--query-gpu=index,name,uuid,memory.total,ecc.errors.uncorrected.volatile.total",
    "--format=csv,noheader,nounits",
)
"""The one nvidia-smi command ``parse_nvidia_smi`` reads, as an argv: five fields per GPU, no header,
memory in MiB without its unit."""

# srun -l: "<task id>: "; Open MPI --tag-output: "[<job>,<rank>]<stdout>:".
_LAUNCHER_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:\s)")


def _unprefixed(line: str) -> str:
    return _LAUNCHER_PREFIX.sub("", line, count=1)


def _float(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------------
# nccl-tests
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NcclTestsTiming:
    """One placement (out-of-place or in-place) of one row."""

    time_us: float
    """Mean time of one operation, in microseconds (nccl-tests' ``time`` or ``cputime`` column)."""
    algbw_gb_s: float
    """Algorithm bandwidth, bytes / time, in GB/s (10**9 bytes per second)."""
    busbw_gb_s: float
    """Bus bandwidth in GB/s: algbw scaled by the collective's factor (2(n-1)/n for all-reduce,
    (n-1)/n for alltoall; NVIDIA/nccl-tests ``doc/PERFORMANCE.md``)."""
    wrong: int | None
    """Elements that failed validation; None where nccl-tests prints ``N/A`` (not checked, as alltoall's
    in-place) or, before 2.13, printed a max error instead of a count."""


@dataclass(frozen=True, kw_only=True)
class NcclTestsRow:
    """One message size of a nccl-tests table."""

    size_bytes: int
    """Message size in bytes (the ``size`` column)."""
    count: int
    """Elements per rank (the ``count`` column)."""
    dtype: str
    """Element type as nccl-tests names it: ``float``, ``half``, ``bfloat16``..."""
    redop: str | None
    """Reduction (``sum``; ``none`` for alltoall); None when the table has no such column."""
    root: int | None
    """Root rank (``-1`` where there is none); None when the table has no such column."""
    out_of_place: NcclTestsTiming
    in_place: NcclTestsTiming

    @property
    def best_busbw_gb_s(self) -> float:
        """The better of the two placements' bus bandwidth, in GB/s."""
        return max(self.out_of_place.busbw_gb_s, self.in_place.busbw_gb_s)


class NcclRankDevice(NamedTuple):
    """One ``#  Rank  0 Group  0 Pid ... on <host> device  0 [<pci>] <name>`` line, as a tuple."""

    rank: int
    host: str
    device_index: int
    """The CUDA device index on its host."""
    device_name: str
    """The CUDA device name, e.g. ``NVIDIA H100 80GB HBM3``."""


@dataclass(frozen=True, kw_only=True)
class NcclTestsResult:
    """What one nccl-tests run printed. Empty (no rows) when the text holds no table."""

    rows: tuple[NcclTestsRow, ...]
    """The table, in the order printed (smallest message first)."""
    avg_busbw_gb_s: float | None
    """The ``# Avg bus bandwidth`` footer in GB/s (the mean over all rows); None when absent."""
    out_of_bounds: int | None
    """The ``# Out of bounds values`` footer: rows whose #wrong exceeded the threshold; None when absent."""
    devices: tuple[NcclRankDevice, ...]
    """The ``# Using devices`` lines, one per rank."""
    collective: str | None = None
    """The test, from ``# Collective test starting: alltoall_perf`` (nccl-tests 2.16.7 and later)."""
    nccl_tests_version: str | None = None
    """From ``# nccl-tests version 2.18.3 ...`` (printed since 2.17.5)."""

    @property
    def wrong_total(self) -> int:
        """Every element counted wrong, both placements of every row (``N/A`` counts as none)."""
        return sum(
            timing.wrong for row in self.rows for timing in (row.out_of_place, row.in_place) if timing.wrong is not None
        )

    @property
    def busbw_at_largest_gb_s(self) -> float | None:
        """The largest message's best bus bandwidth in GB/s (over both placements, and over every row
        of that size); None without rows."""
        if not self.rows:
            return None
        largest = max(row.size_bytes for row in self.rows)
        return max(row.best_busbw_gb_s for row in self.rows if row.size_bytes == largest)


@dataclass(frozen=True)
class _Layout:
    lead: tuple[str, ...]
    """Column names before the first time column: size, count, type[, redop][, root]."""
    group: tuple[str, ...]
    """One placement's column names: time, algbw, busbw, #wrong[, i_min, i_max, i_p99, i_cv%]."""


# What nccl-tests 2.13 and later print when there is no header to read.
_DEFAULT_LAYOUT = _Layout(lead=("size", "count", "type", "redop", "root"), group=("time", "algbw", "busbw", "#wrong"))
_TIME_COLUMNS = ("time", "cputime")
_DTYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_RANK_LINE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.*?)\s*$"
)
_AVG_LINE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB_LINE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_COLLECTIVE_LINE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_VERSION_LINE = re.compile(r"^#\s*nccl-tests version\s+(\S+)")


def _header_layout(line: str) -> _Layout | None:
    """The layout a ``#  size  count  type ...`` header names, or None for any other line."""
    if not line.startswith("#"):
        return None
    names = line[1:].split()
    times = [i for i, name in enumerate(names) if name in _TIME_COLUMNS]
    if not {"size", "count", "busbw"} <= set(names) or len(times) < 2:
        return None
    return _Layout(lead=tuple(names[: times[0]]), group=tuple(names[times[0] : times[1]]))


def _timing(tokens: list[str], group: tuple[str, ...]) -> NcclTestsTiming | None:
    values = dict(zip(group, tokens))
    time_us, algbw, busbw = (_float(values.get(name, "")) for name in (group[0], "algbw", "busbw"))
    if time_us is None or algbw is None or busbw is None:
        return None
    wrong_name = next((name for name in group if name in ("#wrong", "error")), None)
    token = values.get(wrong_name, "N/A") if wrong_name else "N/A"
    if wrong_name == "error" or token == "N/A":
        wrong = None
    elif (number := _float(token)) is not None:
        wrong = int(number)  # %g prints large counts as 1e+06
    else:
        return None
    return NcclTestsTiming(time_us=time_us, algbw_gb_s=algbw, busbw_gb_s=busbw, wrong=wrong)


def _row(line: str, layout: _Layout) -> NcclTestsRow | None:
    """A table row, or None for any other line (a log line, a header, a note)."""
    tokens = line.split()
    if len(tokens) < 3 or not (tokens[0].isdigit() and tokens[1].isdigit() and _DTYPE.fullmatch(tokens[2])):
        return None
    redop: str | None = None
    root: int | None = None
    position = 3
    for name in layout.lead[3:]:
        token = tokens[position] if position < len(tokens) else ""
        if name == "redop":
            # Before 2.13 alltoall left its redop blank; a number here is already the time.
            if token and _float(token) is None:
                redop, position = token, position + 1
        elif name == "root":
            if re.fullmatch(r"-?\d+", token):
                root, position = int(token), position + 1
        else:
            position += 1
    width = len(layout.group)
    out_of_place = _timing(tokens[position : position + width], layout.group)
    in_place = _timing(tokens[position + width : position + 2 * width], layout.group)
    if out_of_place is None or in_place is None:
        return None
    return NcclTestsRow(
        size_bytes=int(tokens[0]),
        count=int(tokens[1]),
        dtype=tokens[2],
        redop=redop,
        root=root,
        out_of_place=out_of_place,
        in_place=in_place,
    )


def parse_nccl_tests(text: str) -> NcclTestsResult:
    """The table, footers and devices of one nccl-tests run (``all_reduce_perf``, ``alltoall_perf``,
    2.13 or later, and the older layouts seen in AWS's samples), from its stdout.

    NCCL's own log lines may be interleaved anywhere, including between the header and the rows, and
    each line may carry a launcher prefix; neither breaks the table. Text without a table gives a
    result without rows.
    """
    layout = _DEFAULT_LAYOUT
    rows: list[NcclTestsRow] = []
    devices: list[NcclRankDevice] = []
    avg: float | None = None
    out_of_bounds: int | None = None
    collective: str | None = None
    version: str | None = None
    for raw in text.splitlines():
        line = _unprefixed(raw).strip()
        if not line:
            continue
        if line.startswith("#"):
            if (header := _header_layout(line)) is not None:
                layout = header
            elif match := _RANK_LINE.match(line):
                devices.append(NcclRankDevice(int(match[1]), match[2], int(match[3]), match[4]))
            elif match := _AVG_LINE.match(line):
                avg = _float(match[1])
            elif match := _OOB_LINE.match(line):
                out_of_bounds = int(match[1])
            elif match := _COLLECTIVE_LINE.match(line):
                collective = match[1]
            elif match := _VERSION_LINE.match(line):
                version = match[1]
        elif (row := _row(line, layout)) is not None:
            rows.append(row)
    return NcclTestsResult(
        rows=tuple(rows),
        avg_busbw_gb_s=avg,
        out_of_bounds=out_of_bounds,
        devices=tuple(devices),
        collective=collective,
        nccl_tests_version=version,
    )


# ----------------------------------------------------------------------------------------------
# NCCL_DEBUG=INFO
# ----------------------------------------------------------------------------------------------

LIBFABRIC_NETWORKS = frozenset({"AWS Libfabric", "Libfabric"})
"""The names aws-ofi-nccl's NCCL net plugin reports: ``AWS Libfabric`` up to 1.13, ``Libfabric`` from
1.14 (aws/aws-ofi-nccl ``src/nccl_ofi_interface_nvidia.c``, tags v1.13.2-aws and v1.14.0)."""


@dataclass(frozen=True, kw_only=True)
class NcclNetReport:
    """What an ``NCCL_DEBUG=INFO`` log says about the network NCCL chose. Logs of several ranks may be
    concatenated; the first value printed wins, and every network chosen is kept."""

    nccl_version: str | None
    """From ``NCCL version 2.21.5+cuda12.4``: ``2.21.5+cuda12.4``."""
    ofi_plugin_version: str | None
    """From ``NET/OFI Initializing aws-ofi-nccl 1.9.1-aws``: ``1.9.1-aws`` (``1.14.0``, ``git-6e504db``)."""
    provider: str | None
    """The libfabric provider aws-ofi-nccl selected (``efa``); None when it never printed one."""
    fabric: str | None
    """The libfabric fabric (``efa`` or ``efa-direct``), printed by aws-ofi-nccl 1.14 and later."""
    nic_count: int | None
    """From ``(found 16 nics)`` (aws-ofi-nccl 1.7 and later); None when not printed."""
    networks: tuple[str, ...]
    """Every network NCCL said it used (``Using network Libfabric``), distinct, in order."""
    plugin_failures: tuple[str, ...]
    """NCCL's messages saying a net plugin could not be found, loaded or initialized, distinct."""

    @property
    def network(self) -> str | None:
        """The network NCCL chose (the first, when ranks disagree): ``Libfabric``, ``AWS Libfabric``,
        ``Socket``, ``IB``; None when the log never says."""
        return self.networks[0] if self.networks else None

    @property
    def uses_efa(self) -> bool:
        """True only when aws-ofi-nccl selected the efa provider and every communicator used its
        Libfabric network: a rank that fell back to Socket makes this False."""
        return (
            self.provider == "efa" and bool(self.networks) and all(net in LIBFABRIC_NETWORKS for net in self.networks)
        )


_NCCL_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+\S*)")
_OFI_VERSION = re.compile(r"NET/OFI Initializing aws-ofi-nccl\s+(\S+)")
_OFI_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is ([^\s,(]+)(?:,\s*fabric is ([^\s,(]+))?(?:\s*\(found (\d+) nics?\))?"
)
# A CloudWatch export joins two copies of a line with " | "; the network name stops there.
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*(?:\||$)")
# NCCL 2.18: "NET/Plugin : Plugin load (libnccl-net.so) returned 2 : ..." and "No plugin found, using
# internal implementation"; 2.19: "NET/Plugin : dlerror=... No plugin found (libnccl-net.so)"; 2.21:
# "NET/Plugin: No plugin found (libnccl-net.so)", "Plugin load returned 2 : ..."; 2.25 and later:
# "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin." and "Failed to
# initialize NET plugin <name>" / WARN "Failed to initialize any NET plugin"; aws-ofi-nccl: WARN
# "NET/OFI Initializing plugin failed". Not failures: "Failed to find ncclCollNetPlugin_vN symbol"
# (no CollNet in the plugin) and "Failed to find ncclNetPlugin_vN symbol" (probing for an older
# interface version), which precede a successful load.
_PLUGIN_FAILURE = re.compile(
    r"NET/Plugin\s*:\s*(?:Could not find|No plugin found|Plugin load|dlerror=)"
    r"|Failed to initialize (?:any )?NET plugin"
    r"|NET/OFI Initializing plugin failed"
)
_NCCL_TAG = re.compile(r"NCCL (?:INFO|WARN) ")


def parse_nccl_debug(text: str) -> NcclNetReport:
    """The NCCL version, the aws-ofi-nccl version and provider, the network chosen and any net plugin
    failures, from ``NCCL_DEBUG=INFO`` output (of any rank, with or without launcher prefixes)."""
    nccl_version = ofi_version = provider = fabric = None
    nic_count: int | None = None
    networks: list[str] = []
    failures: list[str] = []
    for line in text.splitlines():
        if nccl_version is None and (match := _NCCL_VERSION.search(line)):
            nccl_version = match[1]
        if ofi_version is None and (match := _OFI_VERSION.search(line)):
            ofi_version = match[1]
        if provider is None and (match := _OFI_PROVIDER.search(line)):
            provider, fabric = match[1], match[2]
            nic_count = int(match[3]) if match[3] else None
        if (match := _NETWORK.search(line)) and match[1] not in networks:
            networks.append(match[1])
        if _PLUGIN_FAILURE.search(line):
            tag = _NCCL_TAG.search(line)
            message = line[tag.end() :].strip() if tag else _unprefixed(line).strip()
            if message not in failures:
                failures.append(message)
    return NcclNetReport(
        nccl_version=nccl_version,
        ofi_plugin_version=ofi_version,
        provider=provider,
        fabric=fabric,
        nic_count=nic_count,
        networks=tuple(networks),
        plugin_failures=tuple(failures),
    )


# ----------------------------------------------------------------------------------------------
# fi_info
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FiInfoEntry:
    """One ``provider: ...`` block of ``fi_info`` (default, not ``-v``, output)."""

    provider: str
    fabric: str | None
    """``efa``, ``efa-direct`` (libfabric 2.x), or ``EFA-fe80::...`` (libfabric before 1.16)."""
    domain: str | None
    """The device's domain: ``rdmap79s0-rdm`` (reliable datagram) or ``rdmap79s0-dgrm``."""
    version: str | None
    endpoint_type: str | None
    """``FI_EP_RDM`` or ``FI_EP_DGRAM``."""
    protocol: str | None


@dataclass(frozen=True, kw_only=True)
class FiInfo:
    """What ``fi_info -p efa`` listed."""

    entries: tuple[FiInfoEntry, ...]

    @property
    def domains(self) -> tuple[str, ...]:
        """The distinct EFA domains, in order: ``rdmap79s0-rdm``, ``rdmap79s0-dgrm``..."""
        return tuple(dict.fromkeys(e.domain for e in self.entries if e.provider == "efa" and e.domain))

    @property
    def device_count(self) -> int:
        """EFA devices, each counted once: the distinct reliable-datagram (RDM) domains. libfabric 2.x
        lists each device's RDM domain twice, under the ``efa`` and the ``efa-direct`` fabric, and its
        datagram domain once more (``-dgrm``)."""
        return len({e.domain for e in self.entries if e.provider == "efa" and e.endpoint_type == "FI_EP_RDM"})


_FI_INFO_FIELDS = {"fabric", "domain", "version", "type", "protocol"}


def parse_fi_info(text: str) -> FiInfo:
    """The entries of ``fi_info -p efa`` output. An instance without EFA (fi_info prints ``-61``, no
    data) gives no entries."""
    blocks: list[dict[str, str]] = []
    for raw in text.splitlines():
        key, sep, value = _unprefixed(raw).strip().partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "provider":
            blocks.append({"provider": value})
        elif key in _FI_INFO_FIELDS and blocks and key not in blocks[-1]:
            blocks[-1][key] = value
    return FiInfo(
        entries=tuple(
            FiInfoEntry(
                provider=block["provider"],
                fabric=block.get("fabric"),
                domain=block.get("domain"),
                version=block.get("version"),
                endpoint_type=block.get("type"),
                protocol=block.get("protocol"),
            )
            for block in blocks
        )
    )


@dataclass(frozen=True, kw_only=True)
class FiInfoVersion:
    """``fi_info --version``: ``fi_info: 1.22.0amzn4.0``, ``libfabric: 1.22.0amzn4.0``, ``libfabric api:
    1.22``. Its text is the libfabric version."""

    fi_info: str | None
    """The fi_info tool's version."""
    libfabric: str | None
    """The loaded library's version; ``amzn`` in it marks the EFA installer's build."""
    api: str | None
    """The libfabric API version, ``major.minor``."""

    def __str__(self) -> str:
        return self.libfabric or self.fi_info or ""


_FI_INFO_TOOL = re.compile(r"^(?:\S*/)?fi_info:\s*(\S+)")  # also when run by its path, /opt/amazon/efa/bin
_LIBFABRIC = re.compile(r"^libfabric:\s*(\S+)")
_LIBFABRIC_API = re.compile(r"^libfabric api:\s*(\S+)")


def parse_fi_info_version(text: str) -> FiInfoVersion | None:
    """The versions ``fi_info --version`` printed; None when the text holds none of them."""
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = _unprefixed(raw).strip()
        for name, pattern in (("fi_info", _FI_INFO_TOOL), ("libfabric", _LIBFABRIC), ("api", _LIBFABRIC_API)):
            if name not in found and (match := pattern.match(line)):
                found[name] = match[1]
    if not found:
        return None
    return FiInfoVersion(fi_info=found.get("fi_info"), libfabric=found.get("libfabric"), api=found.get("api"))


# ----------------------------------------------------------------------------------------------
# nvidia-smi
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One GPU, as ``NVIDIA_SMI_QUERY`` reports it."""

    index: int
    """nvidia-smi's index (the NVML order, not necessarily the CUDA order)."""
    name: str
    """e.g. ``NVIDIA H100 80GB HBM3``."""
    uuid: str
    """e.g. ``GPU-3c2e38d1-6a2c-4a31-b44b-9d82a8c80735``."""
    memory_total_mib: int | None
    """Framebuffer memory in MiB; None when not reported."""
    ecc_uncorrected: int | None
    """Uncorrected ECC errors since the driver loaded (``ecc.errors.uncorrected.volatile.total``);
    None where ECC is off or not supported (``[N/A]``)."""


def _optional_int(value: str, what: str, line_number: int) -> int | None:
    # nvidia-smi prints "[N/A]" (or "N/A", "[Not Supported]") for a field the GPU does not report.
    if value in ("N/A", "") or (value.startswith("[") and value.endswith("]")):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"nvidia-smi line {line_number}: {what} is not a number or [N/A] (got {value!r})") from None


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """One ``Gpu`` per line of ``NVIDIA_SMI_QUERY`` output. Raises ValueError, naming the line, for a
    line that is not five comma-separated fields with a numeric index (such as nvidia-smi's own
    ``NVIDIA-SMI has failed ...`` message)."""
    gpus: list[Gpu] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 5 or not fields[0].isdigit():
            raise ValueError(
                f"nvidia-smi line {number}: expected index, name, uuid, memory.total, "
                f"ecc.errors.uncorrected.volatile.total (got {line!r})"
            )
        index, name, uuid, memory, ecc = fields
        gpus.append(
            Gpu(
                index=int(index),
                name=name,
                uuid=uuid,
                memory_total_mib=_optional_int(memory, "memory.total", number),
                ecc_uncorrected=_optional_int(ecc, "ecc.errors.uncorrected.volatile.total", number),
            )
        )
    return tuple(gpus)


# ----------------------------------------------------------------------------------------------
# dcgmi diag -j
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DcgmDiag:
    """The outcome of ``dcgmi diag -r LEVEL -j``."""

    passed: bool
    """True when no test failed, none hit a runtime error, and at least one test reported a result."""
    failures: tuple[str, ...]
    """One entry per failed test and entity: ``Memory (GPU 1): <DCGM's message>``."""
    warnings: tuple[str, ...] = ()
    """Tests that returned Warn (not a failure), in the same form."""
    dcgm_version: str | None = None
    """The DCGM version the output names, when it does."""


def _json_object(text: str) -> dict:
    start = text.find("{")
    if start < 0:
        raise ValueError("dcgmi diag output holds no JSON object")
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as error:
        raise ValueError(f"dcgmi diag output is not valid JSON: {error}") from None
    return value


def _entity(result: dict) -> str:
    # DCGM 4.x: entity_group ("GPU") and entity_id (dcgmi/Diag.cpp HelperJsonAddResult, v4.2.3);
    # DCGM 3.x: dcgmi's "gpu_id" (a string for plugin tests), nvvs's "gpu_ids" (dcgmi/Diag.cpp, v3.3.9).
    if "entity_id" in result:
        return f"{result.get('entity_group', 'GPU')} {result['entity_id']}"
    for key in ("gpu_id", "gpu_ids"):
        if key in result and str(result[key]) != "":
            return f"GPU {result[key]}"
    return ""


def _message(result: dict) -> str:
    for warning in result.get("warnings") or ():
        if isinstance(warning, str) and warning:
            return warning
        if isinstance(warning, dict):
            # 3.x dcgmi puts a Deployment test's message under "warnings" inside the warning entry.
            text = warning.get("warning") or warning.get("warnings")
            if text:
                return str(text)
    return ""


def _describe(test: str, entity: str, message: str) -> str:
    return f"{test}{f' ({entity})' if entity else ''}{f': {message}' if message else ''}"


def parse_dcgm_diag(text: str) -> DcgmDiag:
    """The failures in ``dcgmi diag -j`` output, DCGM 3.x (``"DCGM GPU Diagnostic"``, one result per
    GPU under ``gpu_id``) or 4.x (``"DCGM Diagnostic"``, results per entity and a ``test_summary``).
    Text before the JSON object is skipped. Raises ValueError when there is no valid JSON or it is not
    dcgmi diag's document.

    Shapes from NVIDIA/DCGM: ``dcgmi/Diag.cpp`` (v3.3.9, v4.2.3), ``nvvs/include/NvvsJsonStrings.h``,
    and ``testing/python3/dcgm_diag_schema.json`` (v4.2.3). Status strings are Pass, Fail, Warn, Skip.
    """
    document = _json_object(text)
    root = document.get("DCGM Diagnostic", document.get("DCGM GPU Diagnostic")) if isinstance(document, dict) else None
    if not isinstance(root, dict):
        raise ValueError("not dcgmi diag output: no 'DCGM Diagnostic' (4.x) or 'DCGM GPU Diagnostic' (3.x) object")
    categories = root.get("test_categories") or []
    if not isinstance(categories, list):
        raise ValueError("dcgmi diag output: 'test_categories' is not a list")
    failures: list[str] = []
    warnings: list[str] = []
    if root.get("runtime_error"):
        failures.append(f"runtime error: {root['runtime_error']}")
    reported = 0
    # jsoncpp fills the holes of index-assigned arrays with null (DCGM's JsonResultTests "real output").
    for category in (c for c in categories if isinstance(c, dict)):
        for test in (t for t in category.get("tests") or () if isinstance(t, dict)):
            name = str(test.get("name", "unnamed test"))
            failed_before = len(failures)
            for result in (r for r in test.get("results") or () if isinstance(r, dict)):
                status = str(result.get("status", "")).strip().lower()
                reported += bool(status)
                line = _describe(name, _entity(result), _message(result))
                if status == "fail":
                    failures.append(line)
                elif status == "warn":
                    warnings.append(line)
            summary = test.get("test_summary")
            if isinstance(summary, dict):
                status = str(summary.get("status", "")).strip().lower()
                reported += bool(status)
                if status == "fail" and len(failures) == failed_before:
                    failures.append(_describe(name, "", _message(summary)))
    if not reported and not failures:
        failures.append("no test results in the dcgmi diag output")
    metadata = document.get("metadata")
    version = (metadata.get("version") if isinstance(metadata, dict) else None) or document.get("version")
    version = version or root.get("version")
    return DcgmDiag(
        passed=not failures,
        failures=tuple(failures),
        warnings=tuple(warnings),
        dcgm_version=str(version) if version else None,
    )
