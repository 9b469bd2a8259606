"""Who may do what, as the synthesized templates say it: the lifecycle bucket's writers, the Training Jobs
role's network-interface scope, the flow-log role's trust."""

from __future__ import annotations

import fnmatch
import re

import pytest
import yaml
from conftest import ROOT, read_json, resources_of_type, synth

from moe_cdk.schema.config import load_config, parse_config

# Writes that would replace or remove what a HyperPod node runs as root.
SCRIPT_WRITES = (
    "s3:PutObject",
    "s3:PutObjectAcl",
    "s3:PutObjectTagging",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
)


def rendered(value) -> str:
    """A template value as one string, pseudo parameters and other references as ``${Name}``; the partition
    of the configurations' region (us-east-2), which CDK writes as ``aws``, as ``aws`` too."""
    if isinstance(value, str):
        return value.replace("${AWS::Partition}", "aws")
    if value == {"Ref": "AWS::Partition"}:
        return "aws"
    if "Ref" in value:
        return f"${{{value['Ref']}}}"
    if "Fn::Sub" in value:
        return rendered(value["Fn::Sub"])
    if "Fn::GetAtt" in value:
        return f"${{{'.'.join(value['Fn::GetAtt'])}}}"
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(rendered(part) for part in parts)
    return "${" + next(iter(value)) + "}"  # another stack's value


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def lifecycle_bucket_policy(template: dict) -> dict:
    """The policy document of the one bucket policy on the ``sagemaker-`` lifecycle bucket."""
    policies = [
        policy["Properties"]["PolicyDocument"]
        for policy in resources_of_type(template, "AWS::S3::BucketPolicy").values()
        if "LifecycleBucket" in rendered(policy["Properties"]["Bucket"])
        or rendered(policy["Properties"]["Bucket"]).startswith("sagemaker-")
    ]
    assert len(policies) == 1, policies
    return policies[0]


def write_denials(document: dict) -> list[dict]:
    """The Deny statements on object writes, other than the one for requests without TLS."""
    return [
        s
        for s in document["Statement"]
        if s["Effect"] == "Deny"
        and "aws:SecureTransport" not in s.get("Condition", {}).get("Bool", {})
        and any(fnmatch.fnmatch("s3:PutObject", a) for a in as_list(s["Action"]))
    ]


def publishing_roles(outdir, stack: str) -> set[str]:
    """The roles the CDK CLI assumes to publish ``stack``'s file assets."""
    manifest = read_json(outdir / f"{stack}.assets.json")
    return {
        rendered(d.get("assumeRoleArn", "none")) for f in manifest["files"].values() for d in f["destinations"].values()
    }


def assert_only_the_publisher_writes(document: dict, publisher: str) -> None:
    (deny,) = write_denials(document)
    assert deny["Principal"] == {"AWS": "*"}
    for action in SCRIPT_WRITES:
        assert any(fnmatch.fnmatch(action, pattern) for pattern in as_list(deny["Action"])), action
    (objects,) = [rendered(r) for r in as_list(deny["Resource"])]
    assert re.fullmatch(r"(\$\{LifecycleBucket\w+\.Arn\}|arn:aws:s3:::sagemaker-[^/]+)/\*", objects)
    (operator,) = deny["Condition"]
    assert operator == "ArnNotLike"
    assert list(deny["Condition"][operator]) == ["aws:PrincipalArn"]
    assert [rendered(arn) for arn in as_list(deny["Condition"][operator]["aws:PrincipalArn"])] == [publisher]


PUBLISHER = "arn:aws:iam::${AWS::AccountId}:role/cdk-hnb659fds-file-publishing-role-${AWS::AccountId}-us-east-2"


def test_only_the_cdk_asset_publisher_may_replace_the_lifecycle_scripts(default_synth):
    # AmazonSageMakerFullAccess grants s3:PutObject on *sagemaker* buckets: without the deny, any notebook
    # role could swap the scripts the next HyperPod node runs as root.
    outdir, templates = default_synth
    assert_only_the_publisher_writes(lifecycle_bucket_policy(templates["moe-storage"]), PUBLISHER)
    assert publishing_roles(outdir, "moe-cluster") == {PUBLISHER}  # the one the exception names


def test_the_cdk_roles_that_deploy_the_cluster_reach_the_lifecycle_bucket(default_synth):
    # The bootstrap roles' own policies cover only the bootstrap bucket: the lifecycle bucket's policy
    # is what lets the publisher upload the bundle and the deploy role read the template it points
    # CloudFormation at.
    outdir, templates = default_synth
    cluster = read_json(outdir / "manifest.json")["artifacts"]["moe-cluster"]["properties"]
    deployer = rendered(cluster["assumeRoleArn"])
    assert cluster["stackTemplateAssetObjectUrl"].startswith("s3://sagemaker-")
    allowed = {
        (rendered(principal), action, rendered(resource))
        for s in lifecycle_bucket_policy(templates["moe-storage"])["Statement"]
        if s["Effect"] == "Allow" and "AWS" in s["Principal"]
        for principal in as_list(s["Principal"]["AWS"])
        for action in as_list(s["Action"])
        for resource in as_list(s["Resource"])
    }
    objects = "${LifecycleBucket0668F9AE.Arn}/lifecycle/*"
    assert {(PUBLISHER, "s3:PutObject", objects), (deployer, "s3:GetObject", objects)} <= allowed
    assert {(p, "s3:ListBucket", "${LifecycleBucket0668F9AE.Arn}") for p in (PUBLISHER, deployer)} <= allowed


def test_an_adopted_lifecycle_bucket_gets_the_same_write_deny(tmp_path):
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    data["storage"]["adopt_retained_buckets"] = True
    templates = synth(parse_config(data), tmp_path)
    document = lifecycle_bucket_policy(templates["moe-storage"])
    assert_only_the_publisher_writes(document, PUBLISHER)
    (tls,) = [s for s in document["Statement"] if "aws:SecureTransport" in s.get("Condition", {}).get("Bool", {})]
    assert tls["Effect"] == "Deny" and tls["Action"] == "s3:*"


ENI_WRITES = (
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
)


@pytest.fixture(scope="module")
def training_job_role_statements(tmp_path_factory) -> list[dict]:
    outdir = tmp_path_factory.mktemp("training-job")
    template = synth(load_config(ROOT / "config/training-job.yaml"), outdir)["moe-tj-training-job"]
    return [
        s
        for policy in resources_of_type(template, "AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_training_jobs_create_network_interfaces_only_in_their_subnet_and_security_group(
    training_job_role_statements,
):
    granting = [s for s in training_job_role_statements if set(ENI_WRITES) & set(as_list(s["Action"]))]
    assert {a for s in granting for a in as_list(s["Action"])} >= set(ENI_WRITES)
    for statement in granting:
        resources = [rendered(r) for r in as_list(statement["Resource"])]
        assert "*" not in resources
        assert sorted(re.search(r":(\w[\w-]*)/", r).group(1) for r in resources) == [
            "network-interface",
            "security-group",
            "subnet",
        ]
