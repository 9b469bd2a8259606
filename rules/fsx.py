"""FSx for Lustre: which clients an EFA-enabled file system serves over EFA, and how many."""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from moe_cdk.core.loader import SECTION
from moe_cdk.core.problems import Problem, problem

# FSx for Lustre User Guide, "Configuring EFA clients": the EFA interfaces a client sets up
# by default, and "Each FSx for Lustre file system has a maximum limit of 1024 EFA connections
# across all client instances" (one per configured interface). "Working with EFA-enabled file
# systems": clients are Nitro v4 or newer EFA instances, "excluding the trn2 instance family".
# Of the catalog's types only these families appear in the guide's table; the others (p4de,
# trn2, m5) reach an EFA-enabled file system over TCP.
EFA_CLIENT_INTERFACES = {"p5": 8, "p5e": 8, "p5en": 8, "p6-b200": 8, "p6e-gb200": 8, "p6-b300": 16}
MAX_EFA_CONNECTIONS = 1024


def efa_client_interfaces(instance_type: str) -> int:
    """EFA interfaces a node of ``instance_type`` (EC2 or ``ml.`` name) uses to an EFA-enabled
    file system by default; 0 when it is not an EFA client."""
    return EFA_CLIENT_INTERFACES.get(instance_type.removeprefix("ml.").split(".")[0], 0)


def efa_client_problems(clients: dict[str, int]) -> list[Problem]:
    """For an EFA-enabled file system and its clients (instance type -> node count): why it would
    not serve them over EFA, or exceed the file system's EFA connections."""
    if not any(efa_client_interfaces(t) for t in clients):
        return [
            problem(
                "no compute node can use EFA to the file system: FSx EFA clients are Nitro v4 "
                "EFA instances other than trn2 (FSx for Lustre User Guide)",
                got=sorted(clients),
                allowed="compute groups of "
                + ", ".join(f"ml.{f}.*" for f in EFA_CLIENT_INTERFACES)
                + ", or efa_enabled: false",
            )
        ]
    connections = sum(efa_client_interfaces(t) * n for t, n in clients.items())
    if connections > MAX_EFA_CONNECTIONS:
        return [
            problem(
                "more EFA connections than one file system accepts",
                got=connections,
                allowed=f"at most {MAX_EFA_CONNECTIONS} (8 per P5-family node by default)",
            )
        ]
    return []


# FSx API reference, CreateDataRepositoryAssociation: "You can have a maximum of 8 data
# repository associations on a file system."
MAX_ASSOCIATIONS = 8


# FSx API reference, DataRepositoryAssociation.ImportedFileChunkSize: default 1,024 MiB,
# at most 512,000 MiB.
CHUNK_SIZE_RANGE_MIB = (1, 512_000)


_FS_PATH = re.compile(r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$")


class S3EventType(enum.Enum):
    """File events that an association imports from S3 or exports to it."""

    NEW = "NEW"
    CHANGED = "CHANGED"
    DELETED = "DELETED"


ALL_EVENTS = (S3EventType.NEW, S3EventType.CHANGED, S3EventType.DELETED)


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class DataRepositoryAssociation:
    """One link between a file-system directory and an S3 prefix."""

    file_system_path: str
    """Directory on the file system, e.g. ``/datasets``. Required."""
    s3_prefix: str
    """Prefix in the bucket, without slashes at either end, e.g. ``datasets``. Required."""
    auto_import_events: tuple[S3EventType, ...] = ALL_EVENTS
    """S3 changes reflected on the file system. Default: NEW, CHANGED, DELETED."""
    auto_export_events: tuple[S3EventType, ...] = ()
    """File-system changes written back to S3. Default: none (read-only mirror)."""
    batch_import_metadata_on_create: bool = True
    """Import the S3 listing at creation; file contents load lazily on first read. Default: True."""
    imported_file_chunk_size_mib: int = 1024
    """Stripe size for imported files, in MiB (1 to 512000). Default: 1024."""


# Training data flows in from S3; checkpoints flow both ways, so S3 holds every
# checkpoint the trainer writes with no copy step.
DEFAULT_ASSOCIATIONS = (
    DataRepositoryAssociation(file_system_path="/datasets", s3_prefix="datasets"),
    DataRepositoryAssociation(file_system_path="/checkpoints", s3_prefix="checkpoints", auto_export_events=ALL_EVENTS),
)


def _overlaps(a: str, b: str, sep: str) -> bool:
    a_parts, b_parts = a.strip(sep).split(sep), b.strip(sep).split(sep)
    if a_parts == [""] or b_parts == [""]:
        return True
    shorter = min(len(a_parts), len(b_parts))
    return a_parts[:shorter] == b_parts[:shorter]


def association_problems(associations: Sequence[DataRepositoryAssociation]) -> list[Problem]:
    """Every reason FSx would reject this set of associations, keyed ``[i].field`` within the list
    (no key: the whole list)."""
    found: list[Problem] = []
    if len(associations) > MAX_ASSOCIATIONS:
        found.append(
            problem(
                f"too many data repository associations; a file system takes at most {MAX_ASSOCIATIONS}",
                got=len(associations),
                allowed=f"0 to {MAX_ASSOCIATIONS}",
            )
        )
    for i, dra in enumerate(associations):
        if not _FS_PATH.match(dra.file_system_path):
            found.append(
                problem(
                    "must be an absolute directory path",
                    got=dra.file_system_path,
                    allowed="'/' followed by names of letters, digits, '_', '.', '-' joined by '/'",
                ).at(f"[{i}].file_system_path")
            )
        if not _S3_PREFIX.match(dra.s3_prefix):
            found.append(
                problem(
                    "must be an S3 key prefix without leading or trailing '/'",
                    got=dra.s3_prefix,
                    allowed="letters, digits and !_.*'()- joined by '/'",
                ).at(f"[{i}].s3_prefix")
            )
        low, high = CHUNK_SIZE_RANGE_MIB
        if not low <= dra.imported_file_chunk_size_mib <= high:
            found.append(
                problem(
                    "out of range",
                    got=dra.imported_file_chunk_size_mib,
                    allowed=f"{low} to {high} MiB",
                ).at(f"[{i}].imported_file_chunk_size_mib")
            )
        for key in ("auto_import_events", "auto_export_events"):
            events = getattr(dra, key)
            if len(set(events)) != len(events):
                found.append(
                    problem(
                        "lists an event twice",
                        got=[e.value for e in events],
                        allowed="each of NEW, CHANGED, DELETED at most once",
                    ).at(f"[{i}].{key}")
                )
        # FSx API reference, DataRepositoryAssociation.FileSystemPath: "Two data repository
        # associations cannot have overlapping file system paths"; each association needs
        # "a unique S3 bucket or prefix". Nested prefixes would import the same objects twice.
        for j, other in enumerate(associations[:i]):
            if _overlaps(dra.file_system_path, other.file_system_path, "/"):
                found.append(
                    problem(
                        f"overlaps associations[{j}].file_system_path {other.file_system_path!r}",
                        got=dra.file_system_path,
                        allowed="directories that are neither equal nor nested",
                    ).at(f"[{i}].file_system_path")
                )
            if _overlaps(dra.s3_prefix, other.s3_prefix, "/"):
                found.append(
                    problem(
                        f"overlaps associations[{j}].s3_prefix {other.s3_prefix!r}",
                        got=dra.s3_prefix,
                        allowed="prefixes that are neither equal nor nested",
                    ).at(f"[{i}].s3_prefix")
                )
    return found


# FSx API reference, CreateFileSystemLustreConfiguration.PerUnitStorageThroughput:
# "For PERSISTENT_2 SSD storage: 125, 250, 500, 1000 MB/s/TiB."
THROUGHPUT_TIERS_MB_S_TIB = (125, 250, 500, 1000)


# FSx API reference, CreateFileSystem.StorageCapacity: "For SCRATCH_2, PERSISTENT_2, and
# PERSISTENT_1 deployment types using SSD storage type, the valid values are 1200 GiB,
# 2400 GiB, and increments of 2400 GiB."
SSD_FIRST_STEP_GIB = 1200


SSD_INCREMENT_GIB = 2400


# FSx for Lustre User Guide, "Increasing storage capacity": EFA-enabled file systems grow
# in multiples of 38400 / 19200 / 9600 / 4800 GiB at 125 / 250 / 500 / 1000 MB/s/TiB.
EFA_INCREMENT_GIB_BY_TIER = {125: 38400, 250: 19200, 500: 9600, 1000: 4800}


def throughput_problem(per_unit_storage_throughput_mb_s_tib: int) -> Problem | None:
    if per_unit_storage_throughput_mb_s_tib in THROUGHPUT_TIERS_MB_S_TIB:
        return None
    return problem(
        "not a PERSISTENT_2 throughput tier",
        got=per_unit_storage_throughput_mb_s_tib,
        allowed=", ".join(map(str, THROUGHPUT_TIERS_MB_S_TIB)) + " MB/s/TiB",
    )


def capacity_problem(
    storage_capacity_gib: int, *, per_unit_storage_throughput_mb_s_tib: int, efa_enabled: bool
) -> Problem | None:
    """Why FSx would reject this capacity, or None. Returns None for an unknown tier (reported separately)."""
    if efa_enabled:
        step = EFA_INCREMENT_GIB_BY_TIER.get(per_unit_storage_throughput_mb_s_tib)
        if step is None or (storage_capacity_gib > 0 and storage_capacity_gib % step == 0):
            return None
        return problem(
            f"must be a multiple of {step} GiB for an EFA-enabled file system at "
            f"{per_unit_storage_throughput_mb_s_tib} MB/s/TiB",
            got=storage_capacity_gib,
            allowed=f"{step}, {2 * step}, {3 * step}, ...",
        )
    if storage_capacity_gib == SSD_FIRST_STEP_GIB or (
        storage_capacity_gib > 0 and storage_capacity_gib % SSD_INCREMENT_GIB == 0
    ):
        return None
    return problem(
        "not a PERSISTENT_2 SSD capacity",
        got=storage_capacity_gib,
        allowed=f"{SSD_FIRST_STEP_GIB} or a multiple of {SSD_INCREMENT_GIB} GiB",
    )


_S3_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$")
