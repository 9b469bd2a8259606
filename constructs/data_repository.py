"""An S3 bucket linked to an FSx for Lustre file system through data repository associations."""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, aws_fsx as fsx, aws_s3 as s3
from constructs import Construct

from moe_cdk.constructs.validation import problem, raise_if_any

# FSx API reference, CreateDataRepositoryAssociation: "You can have a maximum of 8 data
# repository associations on a file system."
MAX_ASSOCIATIONS = 8
# FSx API reference, DataRepositoryAssociation.ImportedFileChunkSize: default 1,024 MiB,
# at most 512,000 MiB.
CHUNK_SIZE_RANGE_MIB = (1, 512_000)
_S3_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$")
_FS_PATH = re.compile(r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$")


class S3EventType(enum.Enum):
    """File events that an association imports from S3 or exports to it."""

    NEW = "NEW"
    CHANGED = "CHANGED"
    DELETED = "DELETED"


ALL_EVENTS = (S3EventType.NEW, S3EventType.CHANGED, S3EventType.DELETED)


@dataclass(frozen=True, kw_only=True)
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


def association_problems(associations: Sequence[DataRepositoryAssociation]) -> list[tuple[int | None, str, str]]:
    """Every reason FSx would reject this set of associations.

    Returns ``(index, field, message)``; index is None for a problem with the whole list.
    """
    found: list[tuple[int | None, str, str]] = []
    if len(associations) > MAX_ASSOCIATIONS:
        found.append((None, "", problem(
            f"too many data repository associations; a file system takes at most {MAX_ASSOCIATIONS}",
            got=len(associations), allowed=f"0 to {MAX_ASSOCIATIONS}",
        )))
    for i, dra in enumerate(associations):
        if not _FS_PATH.match(dra.file_system_path):
            found.append((i, "file_system_path", problem(
                "must be an absolute directory path", got=dra.file_system_path,
                allowed="'/' followed by names of letters, digits, '_', '.', '-' joined by '/'",
            )))
        if not _S3_PREFIX.match(dra.s3_prefix):
            found.append((i, "s3_prefix", problem(
                "must be an S3 key prefix without leading or trailing '/'", got=dra.s3_prefix,
                allowed="letters, digits and !_.*'()- joined by '/'",
            )))
        low, high = CHUNK_SIZE_RANGE_MIB
        if not low <= dra.imported_file_chunk_size_mib <= high:
            found.append((i, "imported_file_chunk_size_mib", problem(
                "out of range", got=dra.imported_file_chunk_size_mib, allowed=f"{low} to {high} MiB",
            )))
        for key in ("auto_import_events", "auto_export_events"):
            events = getattr(dra, key)
            if len(set(events)) != len(events):
                found.append((i, key, problem(
                    "lists an event twice", got=[e.value for e in events], allowed="each of NEW, CHANGED, DELETED at most once",
                )))
        # FSx API reference, DataRepositoryAssociation.FileSystemPath: "Two data repository
        # associations cannot have overlapping file system paths"; each association needs
        # "a unique S3 bucket or prefix". Nested prefixes would import the same objects twice.
        for j, other in enumerate(associations[:i]):
            if _overlaps(dra.file_system_path, other.file_system_path, "/"):
                found.append((i, "file_system_path", problem(
                    f"overlaps associations[{j}].file_system_path {other.file_system_path!r}",
                    got=dra.file_system_path, allowed="directories that are neither equal nor nested",
                )))
            if _overlaps(dra.s3_prefix, other.s3_prefix, "/"):
                found.append((i, "s3_prefix", problem(
                    f"overlaps associations[{j}].s3_prefix {other.s3_prefix!r}",
                    got=dra.s3_prefix, allowed="prefixes that are neither equal nor nested",
                )))
    return found


@dataclass(frozen=True, kw_only=True)
class DataRepositoryProps:
    file_system_id: str
    """The FSx for Lustre file system to link, e.g. ``LustreStorage.file_system_id``. Required."""
    associations: tuple[DataRepositoryAssociation, ...] = DEFAULT_ASSOCIATIONS
    """Directory-to-prefix links, at most 8, created one at a time in this order; each is named by its
    directory (``association_id``), so removing or reordering one leaves the others in place.
    Default: ``/datasets`` (import) and ``/checkpoints`` (import and export)."""
    bucket: s3.IBucket | None = None
    """The data bucket. Default: a new encrypted, versioned, TLS-only bucket with access logs."""
    bucket_name: str | None = None
    """Name for the new bucket; ignored when ``bucket`` is given. Default: generated by CloudFormation."""
    access_log_retention_days: int = 365
    """Days to keep the new bucket's server access logs. Default: 365."""
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    """What happens to new buckets when they leave the stack. Default: RETAIN."""


class DataRepository(Construct):
    """The training bucket and its data repository associations with a Lustre file system.

    By default ``/datasets`` mirrors ``s3://<bucket>/datasets`` (import only) and
    ``/checkpoints`` is kept in step with ``s3://<bucket>/checkpoints`` in both directions,
    so every checkpoint written to the file system reaches S3 with no copy step.
    Metadata is imported when an association is created; file contents are fetched on
    first read.
    """

    def __init__(self, scope: Construct, id: str, props: DataRepositoryProps) -> None:
        super().__init__(scope, id)
        # Grant S3 log delivery through a bucket policy rather than an ACL, whatever the
        # app's feature flags: the buckets enforce bucket-owner object ownership, which
        # disables ACLs. Context must be set before any child is added.
        self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
        raise_if_any("DataRepository", [
            (f"associations[{i}].{key}: " if i is not None else "associations: ") + message
            for i, key, message in association_problems(props.associations)
        ])
        self.props = props

        self.access_logs_bucket: s3.IBucket | None = None
        if props.bucket is not None:
            self.bucket = props.bucket
        else:
            # Server access logs must go to a bucket with SSE-S3 encryption
            # (Amazon S3 User Guide, "Enabling Amazon S3 server access logging").
            access_logs = s3.Bucket(
                self, "AccessLogs",
                encryption=s3.BucketEncryption.S3_MANAGED,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                enforce_ssl=True,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(props.access_log_retention_days))],
                removal_policy=props.removal_policy,
            )
            # SSE-S3 rather than SSE-KMS: FSx data repository associations read and
            # write the bucket through the FSx service-linked role, which has no grant on
            # a customer key unless the key policy is edited by hand.
            self.bucket = s3.Bucket(
                self, "Bucket",
                bucket_name=props.bucket_name,
                encryption=s3.BucketEncryption.S3_MANAGED,
                versioned=True,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                enforce_ssl=True,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                server_access_logs_bucket=access_logs,
                server_access_logs_prefix="data-bucket/",
                removal_policy=props.removal_policy,
            )
            self.access_logs_bucket = access_logs

        self.associations: list[fsx.CfnDataRepositoryAssociation] = []
        for dra in props.associations:
            s3_config = fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=_policy(fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty, dra.auto_import_events),
                auto_export_policy=_policy(fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty, dra.auto_export_events),
            )
            association = fsx.CfnDataRepositoryAssociation(
                self, association_id(dra.file_system_path),
                file_system_id=props.file_system_id,
                file_system_path=dra.file_system_path,
                data_repository_path=self.s3_uri(dra.s3_prefix),
                batch_import_meta_data_on_create=dra.batch_import_metadata_on_create,
                imported_file_chunk_size=dra.imported_file_chunk_size_mib,
                s3=s3_config,
            )
            # One at a time: associations created in parallel on one file system fail
            # intermittently (hashicorp/terraform-provider-aws#24678, labelled upstream).
            if self.associations:
                association.add_dependency(self.associations[-1])
            self.associations.append(association)

    def s3_uri(self, prefix: str) -> str:
        """``s3://<bucket>/<prefix>`` for a prefix of the data bucket."""
        return f"s3://{self.bucket.bucket_name}/{prefix}"


def association_id(file_system_path: str) -> str:
    """The construct id of the association for ``file_system_path``: named by its directory,
    not its place in the list, so that removing or reordering associations leaves the others'
    logical ids alone (``FileSystemPath`` is create-only: a renamed association is replaced).
    ``/`` is the construct path separator, so it becomes ``:``, which no path here contains."""
    return "Association" + file_system_path.replace("/", ":")


def _policy(cls, events: tuple[S3EventType, ...]):
    return cls(events=[e.value for e in events]) if events else None
