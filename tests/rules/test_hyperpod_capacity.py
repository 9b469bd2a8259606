"""Capacity that follows the work (instance-type lists, Spot, Karpenter autoscaling, tiered checkpointing):
each rule refusing a bad combination by its key, the limits compared with botocore's model and
CloudFormation's schema, and the shipped autoscaling configuration synthesized into what the API takes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import botocore.session
import pytest
import yaml
from botocore.validate import ParamValidator
from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
from conftest import ROOT, assert_cfn_lint_clean, config_errors, resources_of_type, synth

from moe_cdk.rules.hyperpod_capacity import max_instance_types, min_instance_count_range
from moe_cdk.schema.config import load_config, parse_config
from moe_cdk.tools.plan import plan

SAGEMAKER = botocore.session.get_session().get_service_model("sagemaker")
CLUSTER_SCHEMA = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-2", "AWS::SageMaker::Cluster").schema
AUTO, EKS, SLURM, JOB = (
    "config/eks-autoscaling.yaml",
    "config/eks-p5en.yaml",
    "config/default.yaml",
    "config/training-job.yaml",
)
# The index of each configuration's GPU compute group, and of its system group.
GPU = {AUTO: 1, EKS: 1, SLURM: 2, JOB: 0}
SYSTEM = 0


def _errors(config: str, cluster: dict | None = None, **group) -> list[str]:
    def mutate(data):
        data["cluster"].update(cluster or {})
        data["cluster"]["instance_groups"][GPU[config]].update(group)

    return config_errors(yaml.safe_load((ROOT / config).read_text()), mutate)


def _refused(errors: list[str], key: str, words: str) -> bool:
    return any(line.startswith(f"cluster.{key}: {words}") for line in errors)


G = f"instance_groups[{GPU[EKS]}]"
CONTINUOUS = {"node_provisioning_mode": "continuous"}


@pytest.mark.parametrize(
    ("config", "cluster", "group", "key", "words"),
    [
        pytest.param(
            EKS,
            {},
            {"autoscale": True},
            f"{G}.autoscale",
            "needs continuous node provisioning",
            id="autoscale-standard",
        ),
        pytest.param(
            EKS, {}, {"capacity": "spot"}, f"{G}.capacity", "needs continuous node provisioning", id="spot-standard"
        ),
        pytest.param(
            EKS,
            {},
            {"fallback_instance_types": ["ml.p5.48xlarge"]},
            f"{G}.fallback_instance_types",
            "needs continuous node provisioning",
            id="fallbacks-standard",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {"autoscale": True},
            f"{G}.deep_health_checks",
            "Karpenter cannot scale a group with deep health checks",
            id="autoscale-deep-health-checks",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {
                "autoscale": True,
                "deep_health_checks": False,
                "training_plan_arn": "arn:aws:sagemaker:us-east-2:123456789012:training-plan/p5en",
            },
            f"{G}.autoscale",
            "Karpenter cannot scale a group on a training plan",
            id="autoscale-training-plan",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {"capacity": "spot", "training_plan_arn": "arn:aws:sagemaker:us-east-2:123456789012:training-plan/p5en"},
            f"{G}.capacity",
            "a training plan reserves capacity",
            id="spot-training-plan",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {"fallback_instance_types": ["ml.p5en.48xlarge"]},
            f"{G}.fallback_instance_types[0]",
            "listed twice",
            id="fallback-duplicate",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {"fallback_instance_types": ["ml.m5.24xlarge"]},
            f"{G}.fallback_instance_types[0]",
            "has no EFA, and EFA is required",
            id="fallback-without-efa",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {"fallback_instance_types": ["ml.trn2.48xlarge"]},
            f"{G}.fallback_instance_types[0]",
            "a different number of accelerators than instance_type",
            id="fallback-16-chips-for-8-gpus",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {"fallback_instance_types": ["ml.p9.48xlarge"]},
            f"{G}.fallback_instance_types[0]",
            "unknown instance type",
            id="fallback-unknown",
        ),
        pytest.param(
            EKS,
            CONTINUOUS,
            {"autoscale": True, "deep_health_checks": False, "empty_node_timeout_s": -1},
            f"{G}.empty_node_timeout_s",
            "must not be negative",
            id="negative-timeout",
        ),
        pytest.param(
            EKS,
            {"tiered_storage": {"memory_percent": 0}},
            {},
            "tiered_storage.memory_percent",
            "out of range",
            id="tiered-0-percent",
        ),
        pytest.param(
            EKS,
            {"tiered_storage": {"memory_percent": 101}},
            {},
            "tiered_storage.memory_percent",
            "out of range",
            id="tiered-101-percent",
        ),
        pytest.param(
            SLURM,
            {"tiered_storage": {"memory_percent": 20}},
            {},
            "tiered_storage",
            "only HyperPod EKS clusters have managed tiered checkpointing",
            id="tiered-slurm",
        ),
        pytest.param(
            SLURM,
            {},
            {"autoscale": True},
            f"instance_groups[{GPU[SLURM]}].autoscale",
            "only HyperPod EKS clusters have Karpenter autoscaling",
            id="autoscale-slurm",
        ),
        pytest.param(
            SLURM,
            CONTINUOUS,
            {"capacity": "spot"},
            f"instance_groups[{GPU[SLURM]}].capacity",
            "only HyperPod EKS clusters have this",
            id="spot-slurm",
        ),
        pytest.param(
            SLURM,
            CONTINUOUS,
            {"fallback_instance_types": ["ml.p5.48xlarge"]},
            f"instance_groups[{GPU[SLURM]}].fallback_instance_types",
            "only HyperPod EKS clusters have this",
            id="fallbacks-slurm",
        ),
        pytest.param(
            JOB,
            {},
            {"capacity": "spot"},
            "instance_groups[0].capacity",
            "only HyperPod EKS clusters have this",
            id="spot-training-job",
        ),
        pytest.param(
            JOB,
            CONTINUOUS,
            {},
            "node_provisioning_mode",
            "only HyperPod clusters have this setting",
            id="continuous-training-job",
        ),
    ],
)
def test_a_bad_combination_is_refused_by_its_key(config, cluster, group, key, words):
    errors = _errors(config, cluster, **group)
    assert _refused(errors, key, words), errors


def test_a_system_group_is_not_autoscaled():
    errors = config_errors(
        yaml.safe_load((ROOT / AUTO).read_text()),
        lambda data: data["cluster"]["instance_groups"][SYSTEM].update(autoscale=True),
    )
    assert _refused(errors, f"instance_groups[{SYSTEM}].autoscale", "system groups stay at their size"), errors


def test_at_most_twenty_instance_types_a_group():
    fallbacks = ["ml.p5.48xlarge", "ml.p4de.24xlarge"] * 10
    errors = _errors(EKS, CONTINUOUS, fallback_instance_types=fallbacks)
    assert _refused(errors, f"{G}.fallback_instance_types", "too many instance types (got 21;"), errors


def test_the_instance_type_limit_is_botocores_and_cloudformations():
    schema = CLUSTER_SCHEMA["definitions"]["InstanceRequirements"]["properties"]["InstanceTypes"]
    assert max_instance_types() == schema["maxItems"] == 20


def test_the_memory_share_range_is_within_cloudformations():
    schema = CLUSTER_SCHEMA["definitions"]["TieredStorageConfig"]["properties"]["InstanceMemoryAllocationPercentage"]
    assert (schema["minimum"], schema["maximum"]) == (0, 100)  # 0 is refused too: the mode on, keeping nothing


@pytest.fixture(scope="module")
def autoscaling(tmp_path_factory) -> dict:
    """The shipped autoscaling configuration's HyperPod cluster and its roles, synthesized once."""
    templates = synth(load_config(ROOT / AUTO), tmp_path_factory.mktemp("cdk.out"))
    (template,) = [t for t in templates.values() if resources_of_type(t, "AWS::SageMaker::Cluster")]
    return template


def _cluster(template: dict) -> dict:
    (cluster,) = resources_of_type(template, "AWS::SageMaker::Cluster").values()
    return cluster["Properties"]


def test_autoscaling_turns_on_karpenter_with_continuous_provisioning_and_node_recovery(autoscaling):
    cluster = _cluster(autoscaling)
    assert cluster["AutoScaling"] == {"Mode": "Enable", "AutoScalerType": "Karpenter"}
    assert (cluster["NodeProvisioningMode"], cluster["NodeRecovery"]) == ("Continuous", "Automatic")
    assert cluster["TieredStorageConfig"] == {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}


def test_the_autoscaled_group_starts_at_zero_with_its_type_list_on_spot(autoscaling):
    system, gpu = _cluster(autoscaling)["InstanceGroups"]
    assert (system["InstanceType"], system["InstanceCount"]) == ("ml.m5.2xlarge", 2)
    assert "InstanceType" not in gpu and gpu["InstanceCount"] == 0
    assert gpu["InstanceRequirements"] == {"InstanceTypes": ["ml.p5en.48xlarge", "ml.p5.48xlarge"]}
    assert gpu["CapacityRequirements"] == {"Spot": {}}


def test_the_cluster_role_is_trusted_by_hyperpod_and_may_only_add_and_remove_nodes(autoscaling):
    role_id = _cluster(autoscaling)["ClusterRole"]["Fn::GetAtt"][0]
    role = autoscaling["Resources"][role_id]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "hyperpod.sagemaker.amazonaws.com"}
    statements = [
        s
        for policy in resources_of_type(autoscaling, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert [s["Action"] for s in statements] == [
        ["sagemaker:BatchAddClusterNodes", "sagemaker:BatchDeleteClusterNodes"]
    ]
    assert json.dumps(statements[0]["Resource"]).endswith(':cluster/*"]]}')


def test_the_groups_are_what_createcluster_takes(autoscaling):
    for group in _cluster(autoscaling)["InstanceGroups"]:
        request = {
            k: v for k, v in group.items() if k in SAGEMAKER.shape_for("ClusterInstanceGroupSpecification").members
        }
        request |= {
            "ExecutionRole": "arn:aws:iam::123456789012:role/node",
            "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-bucket/lifecycle/", "OnCreate": "on_create.sh"},
        }
        report = ParamValidator().validate(request, SAGEMAKER.shape_for("ClusterInstanceGroupSpecification"))
        assert not report.has_errors(), report.generate_report()


def test_clusters_without_the_settings_carry_none_of_them(default_synth):
    _, templates = default_synth
    text = json.dumps(templates)
    keys = ("AutoScaling", "ClusterRole", "InstanceRequirements", "CapacityRequirements", "TieredStorageConfig")
    for key in (*keys, "MinInstanceCount"):
        assert f'"{key}"' not in text, key


def _with_on_demand_fallback(data: dict, **fallback) -> dict:
    """The shipped autoscaling configuration with an autoscaled On-Demand group ``gpu-od`` of the Spot group's
    second type as its fallback group, ``fallback`` changed on it."""
    groups = data["cluster"]["instance_groups"]
    spot = groups[GPU[AUTO]]
    od = copy.deepcopy(spot) | {"name": "gpu-od", "capacity": "on-demand", "instance_type": "ml.p5.48xlarge"}
    del od["fallback_instance_types"]
    groups.append(od | fallback)
    spot["fallback_groups"] = ["gpu-od"]
    return data


def test_a_spot_group_takes_an_on_demand_fallback_group():
    config = parse_config(_with_on_demand_fallback(yaml.safe_load((ROOT / AUTO).read_text())))
    assert config.cluster.instance_groups[GPU[AUTO]].fallback_groups == ("gpu-od",)


FALLBACK = f"instance_groups[{GPU[AUTO]}].fallback_groups"


@pytest.mark.parametrize(
    ("spot", "fallback", "key", "words"),
    [
        pytest.param({"capacity": "on-demand"}, {}, FALLBACK, "Karpenter takes Spot groups first", id="od-group"),
        pytest.param({}, {"capacity": "spot"}, f"{FALLBACK}[0]", "a Spot fallback draws on", id="spot-fallback"),
        pytest.param({}, {"autoscale": False}, f"{FALLBACK}[0]", "not autoscaled", id="static-fallback"),
        pytest.param(
            {"fallback_groups": ["gpu-od", "gpu-od"]}, {}, f"{FALLBACK}[1]", "listed twice", id="listed-twice"
        ),
        pytest.param({"fallback_groups": ["gpu-0d"]}, {}, f"{FALLBACK}[0]", "no such instance group", id="unknown"),
        pytest.param({"fallback_groups": ["gpu"]}, {}, f"{FALLBACK}[0]", "names its own group", id="itself"),
        pytest.param(
            {"fallback_groups": ["gpu-od"] + [f"g{i}" for i in range(10)]},
            {},
            FALLBACK,
            "more groups than one node class takes (got 12;",
            id="eleven-fallbacks",
        ),
        pytest.param(
            {},
            {"instance_type": "ml.p4de.24xlarge"},
            f"{FALLBACK}[0]",
            "has instance types gpu lacks",
            id="other-type",
        ),
        pytest.param({}, {"labels": {"moe-cdk/pool": "od"}}, f"{FALLBACK}[0]", "other labels", id="other-labels"),
        pytest.param({}, {"taints": [{"key": "moe-cdk/od"}]}, f"{FALLBACK}[0]", "other taints", id="other-taints"),
        pytest.param(
            {}, {"empty_node_timeout_s": 60}, f"{FALLBACK}[0]", "another empty_node_timeout_s", id="other-timeout"
        ),
        pytest.param({}, {"instance_count": 5}, f"{FALLBACK}[0]", "more nodes than the shared NodePool", id="bigger"),
        pytest.param(
            {}, {"fallback_groups": ["gpu"]}, f"{FALLBACK}[0]", "has fallback groups of its own", id="chained"
        ),
    ],
)
def test_a_bad_fallback_group_is_refused_by_its_key(spot, fallback, key, words):
    def mutate(data):
        _with_on_demand_fallback(data, **fallback)["cluster"]["instance_groups"][GPU[AUTO]].update(spot)

    errors = config_errors(yaml.safe_load((ROOT / AUTO).read_text()), mutate)
    assert _refused(errors, key, words), errors


def test_a_group_is_the_fallback_of_one_group_only():
    def mutate(data):
        groups = _with_on_demand_fallback(data)["cluster"]["instance_groups"]
        groups.append(copy.deepcopy(groups[GPU[AUTO]]) | {"name": "gpu-b"})

    errors = config_errors(yaml.safe_load((ROOT / AUTO).read_text()), mutate)
    assert _refused(errors, "instance_groups[3].fallback_groups[0]", "already a fallback of another group"), errors


def test_fallback_groups_are_for_eks_clusters():
    errors = _errors(SLURM, fallback_groups=["login"])
    assert _refused(errors, f"instance_groups[{GPU[SLURM]}].fallback_groups", "only HyperPod EKS clusters"), errors


@pytest.mark.parametrize(
    ("config", "cluster", "count", "key", "words"),
    [
        pytest.param(EKS, CONTINUOUS, 1, G, "AWS documents a minimum count for Slurm clusters only", id="eks"),
        pytest.param(SLURM, {}, 1, f"instance_groups[{GPU[SLURM]}]", "needs continuous node provisioning", id="std"),
        pytest.param(SLURM, CONTINUOUS, 3, f"instance_groups[{GPU[SLURM]}]", "out of range", id="over-count"),
        pytest.param(SLURM, CONTINUOUS, -1, f"instance_groups[{GPU[SLURM]}]", "out of range", id="negative"),
        pytest.param(JOB, {}, 1, "instance_groups[0]", "only HyperPod instance groups have this", id="training-job"),
    ],
)
def test_a_bad_min_instance_count_is_refused_by_its_key(config, cluster, count, key, words):
    errors = _errors(config, cluster, min_instance_count=count)
    assert _refused(errors, f"{key}.min_instance_count", words), errors


def test_the_min_instance_count_range_is_botocores_and_cloudformations():
    schema = CLUSTER_SCHEMA["definitions"]["ClusterInstanceGroup"]["properties"]["MinInstanceCount"]
    assert min_instance_count_range() == (schema["minimum"], schema["maximum"]) == (0, 6758)


@pytest.fixture(scope="module")
def minimum(tmp_path_factory) -> tuple[dict, Path]:
    """The default Slurm configuration, continuous, its GPU group in service from 1 node of 2: (templates, cdk.out)."""
    data = yaml.safe_load((ROOT / SLURM).read_text())
    data["cluster"].update(CONTINUOUS)
    data["cluster"]["instance_groups"][GPU[SLURM]]["min_instance_count"] = 1
    outdir = tmp_path_factory.mktemp("minimum")
    return synth(parse_config(data), outdir), outdir


def test_the_minimum_reaches_the_group_as_createcluster_takes_it(minimum):
    templates, _ = minimum
    (template,) = [t for t in templates.values() if resources_of_type(t, "AWS::SageMaker::Cluster")]
    groups = {g["InstanceGroupName"]: g for g in _cluster(template)["InstanceGroups"]}
    assert groups["gpu"]["MinInstanceCount"] == 1 and "MinInstanceCount" not in groups["controller"]
    request = {k: v for k, v in groups["gpu"].items() if k in ("InstanceGroupName", "InstanceType", "InstanceCount")}
    request |= {
        "MinInstanceCount": groups["gpu"]["MinInstanceCount"],
        "ExecutionRole": "arn:aws:iam::123456789012:role/node",
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-bucket/lifecycle/", "OnCreate": "on_create.sh"},
    }
    report = ParamValidator().validate(request, SAGEMAKER.shape_for("ClusterInstanceGroupSpecification"))
    assert not report.has_errors(), report.generate_report()


def test_the_minimum_is_cfn_lint_clean(minimum):
    _, outdir = minimum
    assert_cfn_lint_clean("us-east-2", *sorted(outdir.glob("*.template.json")))


def test_a_fallback_groups_nodes_stand_in_for_the_spot_groups_and_do_not_add_to_the_plan():
    config = parse_config(_with_on_demand_fallback(yaml.safe_load((ROOT / AUTO).read_text())))
    sized = plan(config)
    # 4 nodes of 8 GPUs, Spot or On-Demand, as without the fallback group.
    assert (
        (config.world_size, sized.nodes, sized.world_size)
        == (32, 4, 32)
        == (load_config(ROOT / AUTO).world_size, 4, 32)
    )
