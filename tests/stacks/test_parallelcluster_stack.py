"""config/parallelcluster.yaml synthesized: the ParallelCluster custom resource, its provider, the nodes' policy and
the lifecycle scripts as each node's custom action."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from conftest import ROOT, synth

from moe_cdk.constructs.parallelcluster_cluster import (
    CapacityType,
    ParallelClusterCluster,
    ParallelClusterNodes,
    ParallelClusterProps,
    ParallelClusterQueue,
)
from moe_cdk.core.problems import ConfigError
from moe_cdk.rules.parallelcluster import DeletionPolicy
from moe_cdk.rules.sagemaker import AccountingDatabase
from moe_cdk.rules.teams import QosTier, Team, TeamMember, TeamsConfig
from moe_cdk.schema.config import load_config

CONFIG = load_config(ROOT / "config/parallelcluster.yaml")


def resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> tuple[Path, dict]:
    outdir = tmp_path_factory.mktemp("cdk.out")
    return outdir, synth(CONFIG, outdir)["moe-pc-cluster"]


@pytest.fixture(scope="module")
def cluster(synthesized) -> dict:
    (resource,) = resources(synthesized[1], "Custom::PclusterCluster").values()
    return resource["Properties"]


def test_the_cluster_is_named_apart_from_its_stack_and_retained_by_default(cluster):
    assert cluster["ClusterName"] == "moe-pc" and cluster["DeletionPolicy"] == "Retain"


def test_the_provider_is_aws_template_at_the_pinned_release(synthesized, cluster):
    (provider_id, provider), *others = resources(synthesized[1], "AWS::CloudFormation::Stack").items()
    assert not others
    url = "".join(
        p if isinstance(p, str) else "amazonaws.com" for p in provider["Properties"]["TemplateURL"]["Fn::Join"][1]
    )
    assert url == (
        "https://us-east-2-aws-parallelcluster.s3.us-east-2.amazonaws.com/parallelcluster/3.16.1"
        "/templates/custom_resource/cluster.yaml"
    )
    assert cluster["ServiceToken"] == {"Fn::GetAtt": [provider_id, "Outputs.ServiceToken"]}


def test_a_given_service_token_replaces_the_provider_stack(tmp_path):
    token = "arn:aws:lambda:us-east-2:123456789012:function:pcluster-provider"
    settings = dataclasses.replace(CONFIG.parallelcluster, service_token=token, deletion_policy=DeletionPolicy.DELETE)
    template = synth(dataclasses.replace(CONFIG, parallelcluster=settings), tmp_path)["moe-pc-cluster"]
    (resource,) = resources(template, "Custom::PclusterCluster").values()
    assert not resources(template, "AWS::CloudFormation::Stack")
    assert resource["Properties"]["ServiceToken"] == token and resource["Properties"]["DeletionPolicy"] == "Delete"


def test_every_node_gets_only_the_policy_the_provider_may_attach(synthesized, cluster):
    ((policy_id, policy),) = resources(synthesized[1], "AWS::IAM::ManagedPolicy").items()
    assert policy["Properties"]["ManagedPolicyName"] == "parallelcluster-moe-pc-us-east-2-nodes"
    config = cluster["ClusterConfiguration"]
    nodes = [config["HeadNode"], *config["LoginNodes"]["Pools"], *config["Scheduling"]["SlurmQueues"]]
    assert all(n["Iam"]["AdditionalIamPolicies"] == [{"Policy": {"Ref": policy_id}}] for n in nodes)


def actions(cluster: dict) -> dict[str, dict]:
    config = cluster["ClusterConfiguration"]
    return {
        "head": config["HeadNode"]["CustomActions"],
        "login": config["LoginNodes"]["Pools"][0]["CustomActions"],
        "gpu": config["Scheduling"]["SlurmQueues"][0]["CustomActions"],
    }


def test_each_node_runs_the_entry_script_told_its_group(cluster):
    for group, action in actions(cluster).items():
        for run in action.values():
            script = run["Script"]["Fn::Sub"]
            assert script.startswith("s3://sagemaker-${AWS::AccountId}-us-east-2-moe-pc/lifecycle/parallelcluster/")
            assert script.endswith(".sh") and run["Args"][1:] == ["us-east-2", group], group


def test_head_and_login_nodes_name_the_bundle_through_ssm_once_and_directly_after_each_update(cluster):
    # ParallelCluster refuses to update their OnNodeConfigured, so it must not change with the bundle.
    for group in ("head", "login"):
        action = actions(cluster)[group]
        assert action["OnNodeConfigured"]["Args"][0] == "/moe-cdk/moe-pc/lifecycle/bundle", group
        assert action["OnNodeUpdated"]["Args"][0]["Fn::Sub"].endswith(".zip"), group


def test_compute_nodes_name_the_bundle_so_that_a_new_one_replaces_them_by_the_queue_update_strategy(cluster):
    gpu = actions(cluster)["gpu"]
    assert list(gpu) == ["OnNodeConfigured"] and gpu["OnNodeConfigured"]["Args"][0]["Fn::Sub"].endswith(".zip")


def test_the_bundle_parameter_holds_the_bundle_the_updates_name(synthesized, cluster):
    parameters = {p["Properties"]["Name"]: p for p in resources(synthesized[1], "AWS::SSM::Parameter").values()}
    parameter = parameters["/moe-cdk/moe-pc/lifecycle/bundle"]
    assert parameter["Properties"]["Value"] == actions(cluster)["head"]["OnNodeUpdated"]["Args"][0]


def test_the_capacity_block_queue_starts_every_node_in_its_reservation_without_a_placement_group(cluster):
    (queue,) = cluster["ClusterConfiguration"]["Scheduling"]["SlurmQueues"]
    (resource,) = queue["ComputeResources"]
    assert queue["CapacityType"] == "CAPACITY_BLOCK" and queue["Networking"]["PlacementGroup"] == {"Enabled": False}
    assert (resource["MinCount"], resource["MaxCount"], resource["Efa"]) == (2, 2, {"Enabled": True})
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": "cr-0123456789abcdef0"}


def test_the_file_system_is_shared_at_fsx(cluster):
    (storage,) = cluster["ClusterConfiguration"]["SharedStorage"]
    assert (storage["MountDir"], storage["StorageType"]) == ("/fsx", "FsxLustre")
    assert "moe-pc-storage" in json.dumps(storage["FsxLustreSettings"]["FileSystemId"])  # the storage stack's


def test_the_bundle_tells_the_scripts_they_run_on_parallelcluster(synthesized, cluster):
    params = bundle_parameters(synthesized[0], cluster)
    assert params["cluster_manager"] == "parallelcluster" and params["controller_group"] == "head"
    assert params["container_runtime"]["enroot_data_dir"] == "/scratch/enroot"  # the queue's EphemeralVolume


def test_the_queue_mounts_the_instance_store_where_enroot_keeps_its_data(cluster):
    (queue,) = cluster["ClusterConfiguration"]["Scheduling"]["SlurmQueues"]
    assert queue["ComputeSettings"]["LocalStorage"]["EphemeralVolume"] == {"MountDir": "/scratch"}


def bundle_parameters(outdir: Path, cluster: dict) -> dict:
    """provisioning_parameters.json of the bundle the head node's OnNodeUpdated names."""
    key = cluster["ClusterConfiguration"]["HeadNode"]["CustomActions"]["OnNodeUpdated"]["Args"][0]["Fn::Sub"]
    bundle = next(outdir.glob(f"asset.{Path(key).stem}*"))
    if bundle.is_dir():
        return json.loads((bundle / "provisioning_parameters.json").read_text())
    return json.loads(zipfile.ZipFile(bundle).read("provisioning_parameters.json"))


def node_statements(template: dict) -> dict[str, list]:
    """Action -> the resources of the nodes' policy statements that allow it."""
    ((_, policy),) = resources(template, "AWS::IAM::ManagedPolicy").items()
    found: dict[str, list] = {}
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            found.setdefault(action, []).append(statement["Resource"])
    return found


def test_with_observability_the_nodes_may_remote_write_to_the_workspace_and_only_there(synthesized):
    (workspace_id,) = resources(synthesized[1], "AWS::APS::Workspace")
    assert node_statements(synthesized[1])["aps:RemoteWrite"] == [{"Fn::GetAtt": [workspace_id, "Arn"]}]


def test_with_observability_the_nodes_may_read_the_url_parameter_and_pull_the_exporters(synthesized):
    statements = node_statements(synthesized[1])
    text = json.dumps(statements)
    assert ":parameter/moe-cdk/moe-pc/observability/remote-write-url" in text
    assert ":602401143452:repository/hyperpod/*" in json.dumps(statements["ecr:BatchGetImage"])
    assert statements["ecr:GetAuthorizationToken"] == ["*"]


def test_the_cluster_is_created_after_the_parameter_its_head_node_reads(synthesized):
    template = synthesized[1]
    (parameter_id,) = [
        k for k, v in resources(template, "AWS::SSM::Parameter").items()
        if v["Properties"]["Name"] == "/moe-cdk/moe-pc/observability/remote-write-url"
    ]  # fmt: skip
    (resource,) = resources(template, "Custom::PclusterCluster").values()
    assert parameter_id in resource["DependsOn"]


def test_the_bundle_carries_the_observability_settings(synthesized, cluster):
    params = bundle_parameters(synthesized[0], cluster)
    assert params["observability"] == {
        "remote_write_url_parameter": "/moe-cdk/moe-pc/observability/remote-write-url",
        "scrape_interval_s": 30,
        "trainer_metrics_port": 9410,  # the profile's metrics.prometheus_port
    }


SECRET = "arn:aws:secretsmanager:us-east-2:123456789012:secret:moe-pc-slurmdbd-AbCdEf"
TEAMS_CONFIG = dataclasses.replace(
    CONFIG,
    cluster=dataclasses.replace(
        CONFIG.cluster,
        accounting_database=AccountingDatabase(endpoint="slurmdb.example.com", secret_arn=SECRET, user_name="slurm"),
    ),
    teams=TeamsConfig(
        qos=(QosTier(name="normal", priority=50, max_gpus=16),),
        teams=(Team(name="research", share_percent=100, members=(TeamMember(name="alice", uid=2001),)),),
    ),
)


@pytest.fixture(scope="module")
def with_teams(tmp_path_factory) -> tuple[Path, dict]:
    """config/parallelcluster.yaml with teams and the external accounting database they need, synthesized."""
    outdir = tmp_path_factory.mktemp("cdk.out")
    template = synth(TEAMS_CONFIG, outdir)["moe-pc-cluster"]
    (resource,) = resources(template, "Custom::PclusterCluster").values()
    return outdir, resource["Properties"]


def test_the_accounting_database_is_slurms_with_gpus_tracked(with_teams):
    settings = with_teams[1]["ClusterConfiguration"]["Scheduling"]["SlurmSettings"]
    assert settings["Database"] == {
        "Uri": "slurmdb.example.com:3306",
        "UserName": "slurm",
        "PasswordSecretArn": SECRET,
        "DatabaseName": "slurm_acct_db",
    }
    assert settings["CustomSlurmSettings"] == [{"AccountingStorageTRES": "gres/gpu"}]


def test_without_an_accounting_database_slurm_has_no_accounting(cluster):
    assert set(cluster["ClusterConfiguration"]["Scheduling"]["SlurmSettings"]) == {"QueueUpdateStrategy"}


def test_the_bundle_carries_the_teams(with_teams):
    params = bundle_parameters(*with_teams)
    assert [t["name"] for t in params["teams"]["teams"]] == ["research"]


def test_an_accounting_database_without_its_user_is_refused_by_the_construct():
    stack, props = construct_props(accounting_database=AccountingDatabase(endpoint="db.example.com", secret_arn=SECRET))
    expected = "accounting_database.user_name: ParallelCluster's SlurmSettings.Database takes the user name here"
    with pytest.raises(ConfigError, match=expected):
        ParallelClusterCluster(stack, "Cluster", props)


def construct_props(**changes) -> tuple[cdk.Stack, ParallelClusterProps]:
    """A stack named pc and the props of a cluster in it, with ``changes``."""
    stack = cdk.Stack(cdk.App(), "pc", env=cdk.Environment(region="us-east-2"))
    props = ParallelClusterProps(
        cluster_name="pc-1",
        head_node=ParallelClusterNodes(name="head", instance_type="m5.8xlarge"),
        queues=[ParallelClusterQueue(name="gpu", instance_type="p5en.48xlarge", max_count=2, min_count=2, efa=True)],
        subnet=ec2.Subnet.from_subnet_attributes(stack, "Subnet", subnet_id="subnet-0123456789abcdef0"),
        security_group=ec2.SecurityGroup.from_security_group_id(stack, "Nodes", "sg-0123456789abcdef0"),
        file_system_id="fs-0123456789abcdef0",
        lifecycle_scripts_directory=str(ROOT / "lifecycle_scripts"),
        lifecycle_parameters={},
        region="us-east-2",
    )
    return stack, dataclasses.replace(props, **changes)


def test_a_cluster_named_like_its_stack_is_refused():
    stack, props = construct_props(cluster_name="pc")
    with pytest.raises(ConfigError, match="cluster_name: must differ from the stack's name"):
        ParallelClusterCluster(stack, "Cluster", props)


def test_a_capacity_block_queue_without_its_reservation_and_with_dynamic_nodes_is_refused_with_both():
    queue = ParallelClusterQueue(
        name="gpu",
        instance_type="p5en.48xlarge",
        max_count=2,
        min_count=1,
        efa=True,
        capacity=CapacityType.CAPACITY_BLOCK,
    )
    stack, props = construct_props(queues=[queue])
    with pytest.raises(ConfigError) as caught:
        ParallelClusterCluster(stack, "Cluster", props)
    assert [e.split(":")[0] for e in caught.value.errors] == [
        "queues[0].capacity_reservation_id",
        "queues[0].min_count",
    ]
