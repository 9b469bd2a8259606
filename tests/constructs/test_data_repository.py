"""DataRepository: a locked-down bucket and its associations with the file system."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match, Template
from conftest import stack_for_test

from moe_cdk.constructs.data_repository import (
    ALL_EVENTS,
    DataRepository,
    DataRepositoryAssociation,
    DataRepositoryProps,
    S3EventType,
)
from moe_cdk.core.problems import ConfigError


@pytest.fixture(scope="module")
def template() -> Template:
    stack = stack_for_test()
    DataRepository(stack, "Data", DataRepositoryProps(file_system_id="fs-0123456789abcdef0"))
    return Template.from_stack(stack)


def _data_bucket(template):
    buckets = template.find_resources("AWS::S3::Bucket", {"Properties": {"VersioningConfiguration": Match.any_value()}})
    (bucket,) = buckets.values()
    return bucket["Properties"]


def test_bucket_is_encrypted_versioned_and_private(template):
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
            "VersioningConfiguration": {"Status": "Enabled"},
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
        },
    )


def test_bucket_writes_server_access_logs(template):
    logging = _data_bucket(template)["LoggingConfiguration"]
    assert logging["LogFilePrefix"] == "data-bucket/"
    assert "AccessLogs" in logging["DestinationBucketName"]["Ref"]


def test_bucket_policy_denies_plain_http(template):
    template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "s3:*",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            },
        },
    )


def test_datasets_are_imported_only(template):
    template.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemId": "fs-0123456789abcdef0",
            "FileSystemPath": "/datasets",
            "BatchImportMetaDataOnCreate": True,
            "ImportedFileChunkSize": 1024,
            "DataRepositoryPath": {"Fn::Join": ["", ["s3://", {"Ref": Match.any_value()}, "/datasets"]]},
            "S3": {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
        },
    )


def test_checkpoints_are_imported_and_exported(template):
    template.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemPath": "/checkpoints",
            "S3": {
                "AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
                "AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
            },
        },
    )


def test_custom_association_settings_are_passed_through():
    stack = stack_for_test()
    DataRepository(
        stack,
        "Data",
        DataRepositoryProps(
            file_system_id="fs-1",
            associations=(
                DataRepositoryAssociation(
                    file_system_path="/scratch",
                    s3_prefix="runs/scratch",
                    auto_import_events=(),
                    auto_export_events=(S3EventType.NEW,),
                    batch_import_metadata_on_create=False,
                    imported_file_chunk_size_mib=256,
                ),
            ),
        ),
    )
    Template.from_stack(stack).has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemPath": "/scratch",
            "BatchImportMetaDataOnCreate": False,
            "ImportedFileChunkSize": 256,
            "S3": {"AutoExportPolicy": {"Events": ["NEW"]}},
        },
    )


def _dras(*pairs, **kwargs):
    return tuple(DataRepositoryAssociation(file_system_path=fs, s3_prefix=s3, **kwargs) for fs, s3 in pairs)


@pytest.mark.parametrize(
    ("associations", "message"),
    [
        (
            _dras(*[(f"/d{i}", f"p{i}") for i in range(9)]),
            r"associations: too many data repository associations; a file system takes at most 8 \(got 9",
        ),
        (
            _dras(("/data", "a"), ("/data", "b")),
            r"associations\[1\]\.file_system_path: overlaps associations\[0\]\.file_system_path '/data'",
        ),
        (_dras(("/", "a"), ("/data", "b")), r"associations\[1\]\.file_system_path: overlaps"),
        (
            _dras(("/a", "x/y"), ("/b", "x")),
            r"associations\[1\]\.s3_prefix: overlaps associations\[0\]\.s3_prefix 'x/y'",
        ),
        (_dras(("data", "a")), r"associations\[0\]\.file_system_path: must be an absolute directory path \(got 'data'"),
        (_dras(("/data", "/a/")), r"associations\[0\]\.s3_prefix: must be an S3 key prefix"),
        (
            _dras(("/data", "a"), imported_file_chunk_size_mib=0),
            r"associations\[0\]\.imported_file_chunk_size_mib: out of range \(got 0",
        ),
        (
            _dras(("/data", "a"), auto_export_events=(S3EventType.NEW, S3EventType.NEW)),
            r"associations\[0\]\.auto_export_events: lists an event twice",
        ),
    ],
)
def test_invalid_associations_are_rejected_by_name(associations, message):
    with pytest.raises(ConfigError, match=message):
        DataRepository(stack_for_test(), "Data", DataRepositoryProps(file_system_id="fs-1", associations=associations))


def test_eight_associations_are_accepted():
    stack = stack_for_test()
    DataRepository(
        stack,
        "Data",
        DataRepositoryProps(
            file_system_id="fs-1",
            associations=_dras(*[(f"/d{i}", f"p{i}") for i in range(8)], auto_export_events=ALL_EVENTS),
        ),
    )
    Template.from_stack(stack).resource_count_is("AWS::FSx::DataRepositoryAssociation", 8)


def _association_ids(associations) -> dict[str, str]:
    """FileSystemPath -> logical id of each association in a stack built from ``associations``."""
    stack = stack_for_test()
    DataRepository(stack, "Data", DataRepositoryProps(file_system_id="fs-1", associations=associations))
    found = Template.from_stack(stack).find_resources("AWS::FSx::DataRepositoryAssociation")
    return {r["Properties"]["FileSystemPath"]: logical for logical, r in found.items()}


def test_associations_are_created_one_after_another():
    stack = stack_for_test()
    DataRepository(
        stack,
        "Data",
        DataRepositoryProps(file_system_id="fs-1", associations=_dras(("/a", "a"), ("/b", "b"), ("/c", "c"))),
    )
    found = Template.from_stack(stack).find_resources("AWS::FSx::DataRepositoryAssociation")
    by_path = {r["Properties"]["FileSystemPath"]: (logical, r.get("DependsOn", [])) for logical, r in found.items()}
    assert by_path["/a"][1] == []
    assert by_path["/b"][1] == [by_path["/a"][0]]
    assert by_path["/c"][1] == [by_path["/b"][0]]


def test_removing_an_association_keeps_the_others_logical_ids():
    before = _association_ids(_dras(("/a", "a"), ("/b", "b"), ("/c", "c")))
    after = _association_ids(_dras(("/b", "b"), ("/c", "c")))
    assert after == {path: before[path] for path in ("/b", "/c")}


def test_paths_that_differ_only_in_separators_get_different_ids():
    ids = _association_ids(_dras(("/a-b", "x"), ("/a/b", "y")))
    assert len(set(ids.values())) == 2
