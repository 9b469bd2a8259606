"""The default deployment as `make synth` builds it: wiring, cdk-nag, cfn-lint, determinism."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from aws_cdk import aws_s3 as s3
from conftest import (
    PYTHON,
    ROOT,
    SHIPPED_CONFIGS,
    WITHOUT_CLOUDFORMATION_VALIDATION,
    assert_cfn_lint_clean,
    cdk_cli_synth_once,
    read_json,
    resources_of_type,
    synth,
)

from moe_cdk.schema.config import load_config, parse_config
from moe_cdk.stacks.deployment import build_app, cdk_json_context


def test_network_storage_and_slurm_cluster_stacks(default_synth):
    _, templates = default_synth
    assert sorted(templates) == ["moe-cluster", "moe-network", "moe-storage"]


def test_file_system_is_in_the_cluster_zone(default_synth, default_config):
    _, templates = default_synth
    (fs,) = resources_of_type(templates["moe-storage"], "AWS::FSx::FileSystem").values()
    (subnet_reference,) = fs["Properties"]["SubnetIds"]
    network = templates["moe-network"]
    (output,) = [
        o for o in network["Outputs"].values() if o.get("Export", {}).get("Name") == subnet_reference["Fn::ImportValue"]
    ]
    subnet_logical_id = output["Value"]["Ref"]
    assert (
        network["Resources"][subnet_logical_id]["Properties"]["AvailabilityZone"]
        == default_config.cluster.availability_zone
    )


def test_lustre_ports_are_opened_to_the_node_security_group(default_synth):
    _, templates = default_synth
    rules = resources_of_type(templates["moe-storage"], "AWS::EC2::SecurityGroupIngress").values()
    sources = {(r["Properties"]["FromPort"], json.dumps(r["Properties"]["SourceSecurityGroupId"])) for r in rules}
    node_group = [s for _, s in sources if "NodeSecurityGroup" in s]
    assert {port for port, s in sources if "NodeSecurityGroup" in s} == {988, 1018} and node_group


def test_node_security_group_lets_the_file_servers_in_on_the_lustre_ports(default_synth):
    # The Lustre client rules (FSx for Lustre User Guide, "Lustre client VPC security group rules"): the
    # rule lives in the storage stack, beside the file system's group, and names the node group by its export.
    _, templates = default_synth
    rules = resources_of_type(templates["moe-storage"], "AWS::EC2::SecurityGroupIngress").values()
    into_nodes = {
        (r["Properties"]["FromPort"], r["Properties"]["ToPort"])
        for r in rules
        if "NodeSecurityGroup" in json.dumps(r["Properties"]["GroupId"])
        and "LustreSecurityGroup" in json.dumps(r["Properties"]["SourceSecurityGroupId"])
    }
    assert into_nodes == {(988, 988), (1018, 1023)}


def test_stacks_target_the_configured_region_without_lookups(default_synth):
    outdir, _ = default_synth
    manifest = read_json(outdir / "manifest.json")
    assert "missing" not in manifest
    envs = {a["environment"] for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"}
    assert envs == {"aws://unknown-account/us-east-2"}


def test_cdk_nag_checks_every_synth(default_config, tmp_path):
    # The shipped stacks synthesize (other tests), so cdk-nag found nothing unacknowledged
    # in them; here a non-compliant bucket proves that the same app really runs cdk-nag.
    app = build_app(default_config, outdir=str(tmp_path), cloudformation_validation=False)
    storage = app.node.find_child("moe-storage")
    s3.CfnBucket(storage, "Unlogged")
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    violations = read_json(tmp_path / "validation-report.json")["pluginReports"][0]["violations"]
    flagged = {(v["ruleName"], c["constructPath"]) for v in violations for c in v["violatingConstructs"]}
    assert ("AwsSolutions-S1", "moe-storage/Unlogged") in flagged
    assert all(path == "moe-storage/Unlogged" for _, path in flagged)


@pytest.mark.parametrize("config_path", SHIPPED_CONFIGS)
def test_make_synth_passes_and_cfn_lint_is_clean(config_path, tmp_path):
    # As a user runs it: the CDK CLI with cdk.json's context, whose built-in CloudFormation validation the
    # in-process synth of the other tests leaves out. It fails on any unacknowledged cdk-nag finding too.
    returncode, output, outdir = cdk_cli_synth_once(Path(config_path))
    assert returncode == 0, output
    config = load_config(ROOT / config_path)
    assert_cfn_lint_clean(config.region, *sorted(outdir.glob("*.template.json")))


def test_cfn_lint_as_the_suite_runs_it_fails_a_template_with_an_unknown_property(tmp_path):
    template = tmp_path / "bad.template.json"
    properties = {"VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.0.0.0/24", "Bogus": 1}
    subnet = {"Type": "AWS::EC2::Subnet", "Properties": properties}
    template.write_text(json.dumps({"Resources": {"Vpc": {"Type": "AWS::EC2::VPC"}, "Subnet": subnet}}))
    with pytest.raises(AssertionError, match=r"E3002: .*'Bogus' was unexpected"):
        assert_cfn_lint_clean("us-east-2", template)


def test_synth_is_deterministic(default_synth, default_config, tmp_path):
    first, _ = default_synth
    synth(default_config, tmp_path)
    for template in first.glob("*.template.json"):
        assert (tmp_path / template.name).read_bytes() == template.read_bytes(), template.name


def test_cdk_cli_and_python_app_write_the_same_templates(tmp_path):
    # The CLI's synth of cdk.json's configuration is make synth's (test_make_synth_passes_and_cfn_lint_is_clean).
    returncode, output, cli = cdk_cli_synth_once(Path(cdk_json_context()["config"]))
    assert returncode == 0, output
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    env |= WITHOUT_CLOUDFORMATION_VALIDATION  # the CLI's synth ran it
    direct = tmp_path / "direct"
    subprocess.run([PYTHON, "app.py"], cwd=ROOT, env=env | {"CDK_OUTDIR": str(direct)}, check=True, capture_output=True)
    names = sorted(p.name for p in cli.glob("*.template.json"))
    assert names == sorted(p.name for p in direct.glob("*.template.json")) and names
    for name in names:
        assert (cli / name).read_bytes() == (direct / name).read_bytes(), name


ACCOUNTING = {
    "endpoint": "slurmdb.cluster-abc.us-east-2.rds.amazonaws.com",
    "secret_arn": "arn:aws:secretsmanager:us-east-2:123456789012:secret:slurmdb-AbCdEf",
}


def test_accounting_database_synthesizes_what_cloudformation_accepts(tmp_path):
    # AccountingDatabase needs NodeProvisioningMode Continuous, which rejects SlurmConfigStrategy
    # (SageMaker API reference and "Continuous provisioning for Slurm"); cfn-lint knows neither rule.
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    data["cluster"] |= {"node_provisioning_mode": "continuous", "accounting_database": ACCOUNTING}
    config = parse_config(data)
    synth(config, tmp_path)  # also fails on any unacknowledged cdk-nag finding
    template = read_json(tmp_path / "moe-cluster.template.json")
    (cluster,) = resources_of_type(template, "AWS::SageMaker::Cluster").values()
    assert cluster["Properties"]["NodeProvisioningMode"] == "Continuous"
    assert cluster["Properties"]["Orchestrator"] == {
        "Slurm": {
            "AccountingDatabase": {
                "Endpoint": ACCOUNTING["endpoint"],
                "SecretArn": ACCOUNTING["secret_arn"],
                "Name": "slurm_acct_db",
                "Port": 3306,
            }
        }
    }
    statements = [
        s
        for p in resources_of_type(template, "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert {
        "Action": "secretsmanager:GetSecretValue",
        "Effect": "Allow",
        "Resource": ACCOUNTING["secret_arn"],
    } in statements
    assert_cfn_lint_clean(config.region, tmp_path / "moe-cluster.template.json")


def test_subnets_and_security_groups_in_use_are_strong_references(default_synth):
    # Imported with Fn::ImportValue, a subnet or security group that the file system or the
    # cluster uses cannot be replaced by a network update: CloudFormation refuses to change an
    # export another stack imports. The app's other references stay weak (cdk.json).
    _, templates = default_synth
    exported = {o["Export"]["Name"]: o["Value"] for o in templates["moe-network"]["Outputs"].values() if "Export" in o}
    network = templates["moe-network"]["Resources"]
    for consumer in ("moe-storage", "moe-cluster"):
        text = json.dumps(templates[consumer])
        assert "Fn::GetStackOutput" not in text
        imported = set(re.findall(r'"Fn::ImportValue": "([^"]+)"', text))
        types = {
            network[(v.get("Ref") or v["Fn::GetAtt"][0])]["Type"] for name, v in exported.items() if name in imported
        }
        assert types == {"AWS::EC2::Subnet", "AWS::EC2::SecurityGroup"} | (
            {"AWS::EC2::VPC"} if consumer == "moe-storage" else set()
        )


def _storage_resources(tmp_path, change) -> dict:
    """The storage stack's resources for config/default.yaml with ``change(storage section)`` applied."""
    data = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    change(data["storage"])
    return synth(parse_config(data), tmp_path)["moe-storage"]["Resources"]


def _by_type(resources: dict, type_name: str) -> list[dict]:
    return [r for r in resources.values() if r["Type"] == type_name]


def test_file_system_key_and_security_group_are_retained_together(default_synth):
    # A retained file system keeps using its security group: deleting the group under it fails
    # the stack deletion with DependencyViolation.
    resources = default_synth[1]["moe-storage"]["Resources"]
    fsx_group = next(
        r
        for r in _by_type(resources, "AWS::EC2::SecurityGroup")
        if r["Properties"]["GroupDescription"].startswith("FSx for Lustre servers")
    )
    for resource in (*_by_type(resources, "AWS::FSx::FileSystem"), *_by_type(resources, "AWS::KMS::Key"), fsx_group):
        assert resource.get("DeletionPolicy") == "Retain", resource["Type"]


def test_file_system_can_be_deleted_with_the_stack(tmp_path):
    resources = _storage_resources(tmp_path, lambda storage: storage["lustre"].update(retain_on_delete=False))
    (file_system,) = _by_type(resources, "AWS::FSx::FileSystem")
    assert file_system.get("DeletionPolicy") == "Delete"


def test_a_redeploy_after_destroy_adopts_the_retained_buckets(tmp_path):
    resources = _storage_resources(tmp_path, lambda storage: storage.update(adopt_retained_buckets=True))
    assert _by_type(resources, "AWS::S3::Bucket") == []
    paths = [
        json.dumps(a["Properties"]["DataRepositoryPath"])
        for a in _by_type(resources, "AWS::FSx::DataRepositoryAssociation")
    ]
    assert paths and all("moe-data-" in p and "-us-east-2-moe/" in p for p in paths)


def test_a_redeploy_after_destroy_synthesizes_for_any_name_with_every_adopted_bucket_tls_only(tmp_path):
    # cdk-nag 3.0.2 matched an adopted bucket's policy by chance (its S10 rule reads the Fn::Join naming the bucket
    # as text): the deployment named moe passed, moe-eks (the lifecycle and TLS buckets) failed the synth.
    data = yaml.safe_load((ROOT / "config/eks-p5en.yaml").read_text())
    data.setdefault("storage", {})["adopt_retained_buckets"] = True
    resources = synth(parse_config(data), tmp_path)["moe-eks-storage"]["Resources"]
    policies = _by_type(resources, "AWS::S3::BucketPolicy")
    assert len(policies) == 2  # the lifecycle and the TLS bucket's
    for policy in policies:
        (tls,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                  if s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"]  # fmt: skip
        assert tls["Effect"] == "Deny" and tls["Action"] == "s3:*" and len(tls["Resource"]) == 2


def test_readme_shows_the_synth_summary_of_the_default_config(default_synth):
    _, templates = default_synth
    shown = re.findall(r"^moe-\S+: \d+ resources -> \S+$", (ROOT / "README.md").read_text(), re.MULTILINE)
    assert shown == [
        f"{name}: {len(template['Resources'])} resources -> cdk.out/{name}.template.json"
        for name, template in templates.items()
    ]
