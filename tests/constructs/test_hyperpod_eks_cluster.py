"""HyperPodEksCluster: HyperPod nodes for an EKS cluster, with Kubernetes labels and taints,
recovery and health checks, EKS node permissions, and the training operator add-on."""

from __future__ import annotations

import dataclasses
import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks
from conftest import ROOT

from moe_cdk.constructs.hyperpod_eks_cluster import (
    EksInstanceGroup,
    EksNodeRole,
    HyperPodEksCluster,
    HyperPodEksClusterProps,
    NodeProvisioningMode,
    Taint,
    provisioning_parameters,
)
from moe_cdk.constructs.hyperpod_nodes import lifecycle_synthesizer
from moe_cdk.core.problems import ConfigError

GROUPS = (
    EksInstanceGroup(name="system", role=EksNodeRole.SYSTEM, instance_type="ml.m5.2xlarge", instance_count=2),
    EksInstanceGroup(
        name="gpu", instance_type="ml.p5en.48xlarge", instance_count=2, labels={"moe-cdk/pool": "training"}
    ),
    # Custom taints need deep health checks off (HyperPod EKS prerequisites).
    EksInstanceGroup(
        name="tainted",
        instance_type="ml.p5en.48xlarge",
        instance_count=1,
        deep_health_checks=False,
        labels={"moe-cdk/pool": "training"},
        taints=(Taint(key="nvidia.com/gpu"),),
    ),
)


def _build(*, groups=GROUPS, **overrides):
    app = cdk.App()
    stack = cdk.Stack(
        app,
        "T",
        env=cdk.Environment(region="us-east-2"),
        synthesizer=lifecycle_synthesizer("sagemaker-${AWS::AccountId}-us-east-2-t", "bundle1"),
    )
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Vpc",
        vpc_id="vpc-0123456789abcdef0",
        availability_zones=["us-east-2a"],
        private_subnet_ids=["subnet-0123456789abcdef0"],
    )
    group = ec2.SecurityGroup.from_security_group_id(stack, "Sg", "sg-0123456789abcdef0")
    cluster = eks.Cluster.from_cluster_attributes(stack, "Eks", cluster_name="t")
    props = (
        dict(
            cluster_name="t",
            eks_cluster=cluster,
            instance_groups=groups,
            subnet=vpc.private_subnets[0],
            security_group=group,
            lifecycle_scripts_directory=str(ROOT / "lifecycle_scripts"),
            region="us-east-2",
        )
        | overrides
    )
    hyperpod = HyperPodEksCluster(stack, "Cluster", HyperPodEksClusterProps(**props))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack, hyperpod


@pytest.fixture(scope="module")
def built():
    app, stack, hyperpod = _build()
    app.synth()  # fails on any unacknowledged cdk-nag finding
    return Template.from_stack(stack), stack.resolve(hyperpod.props.eks_cluster.cluster_arn)


@pytest.fixture(scope="module")
def template(built):
    return built[0]


def _groups(template: Template) -> dict[str, dict]:
    (cluster,) = template.find_resources("AWS::SageMaker::Cluster").values()
    return {g["InstanceGroupName"]: g for g in cluster["Properties"]["InstanceGroups"]}


def test_eks_orchestrator_with_automatic_recovery(built):
    template, cluster_arn = built
    template.has_resource_properties(
        "AWS::SageMaker::Cluster", {"NodeRecovery": "Automatic", "Orchestrator": {"Eks": {"ClusterArn": cluster_arn}}}
    )


def test_labels_and_taints_reach_the_nodes(template):
    config = _groups(template)["tainted"]["KubernetesConfig"]
    assert config == {
        "Labels": {"moe-cdk/pool": "training"},
        "Taints": [{"Key": "nvidia.com/gpu", "Effect": "NoSchedule"}],
    }


def test_accelerator_groups_get_deep_health_checks_and_system_groups_do_not(template):
    groups = _groups(template)
    assert groups["gpu"]["OnStartDeepHealthChecks"] == ["InstanceStress", "InstanceConnectivity"]
    assert "OnStartDeepHealthChecks" not in groups["system"]


def test_nodes_may_assign_pod_addresses_and_use_pod_identity(built):
    template, cluster_arn = built
    statements = [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert {
        "ec2:AssignPrivateIpAddresses",
        "ec2:UnassignPrivateIpAddresses",
        "eks-auth:AssumeRoleForPodIdentity",
        "ecr:BatchGetImage",
    } <= actions
    pod_identity = next(s for s in statements if s["Action"] == "eks-auth:AssumeRoleForPodIdentity")
    assert pod_identity["Resource"] == cluster_arn


def test_training_operator_addon_with_its_pod_identity(template):
    template.has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "amazon-sagemaker-hyperpod-training-operator",
            "ClusterName": "t",
            "PodIdentityAssociations": [
                Match.object_like({"ServiceAccount": "hp-training-operator-controller-manager"})
            ],
        },
    )


def test_training_operator_waits_for_the_hyperpod_cluster(template):
    (addon,) = template.find_resources("AWS::EKS::Addon").values()
    cluster_id = next(iter(template.find_resources("AWS::SageMaker::Cluster")))
    assert cluster_id in addon["DependsOn"]


def test_provisioning_parameters_say_eks_and_carry_no_fsx():
    parameters = provisioning_parameters(instance_groups=GROUPS, region="us-east-2")
    assert (parameters["workload_manager"], parameters["fsx_lustre"]) == ("eks", None)
    assert [g["instance_group_name"] for g in parameters["worker_groups"]] == ["system", "gpu", "tainted"]
    fixture = json.loads((ROOT / "tests/fixtures/eks_provisioning_parameters.json").read_text())
    assert set(parameters) == set(fixture) and set(parameters["container_runtime"]) == set(fixture["container_runtime"])


def test_a_system_group_is_required():
    with pytest.raises(ConfigError) as error:
        _build(groups=GROUPS[1:])
    assert error.value.errors[0].startswith("instance_groups: needs a system group")


def test_bad_labels_and_taints_are_reported():
    group = EksInstanceGroup(
        name="gpu",
        instance_type="ml.p5en.48xlarge",
        instance_count=1,
        deep_health_checks=False,
        labels={"bad key!": "x", "ok": "bad value!"},
        taints=(Taint(key="-bad"),),
    )
    with pytest.raises(ConfigError) as error:
        _build(groups=(GROUPS[0], group))
    assert [p.split(":")[0] for p in error.value.errors] == [
        "instance_groups[1].labels",
        "instance_groups[1].labels.ok",
        "instance_groups[1].taints[0].key",
    ]


def test_taints_on_a_group_with_deep_health_checks_are_refused():
    group = dataclasses.replace(GROUPS[2], deep_health_checks=True)
    with pytest.raises(ConfigError) as error:
        _build(groups=(GROUPS[0], group))
    (message,) = error.value.errors
    assert message.startswith("instance_groups[1].taints: custom taints cannot be combined with deep health checks")
    assert "deep_health_checks: false" in message


def test_a_group_without_deep_health_checks_asks_for_none(template):
    assert "OnStartDeepHealthChecks" not in _groups(template)["tainted"]


def test_reserved_label_and_taint_prefixes_are_refused():
    group = dataclasses.replace(
        GROUPS[2], labels={"kubernetes.io/pool": "x"}, taints=(Taint(key="sagemaker.amazonaws.com/mine"),)
    )
    with pytest.raises(ConfigError) as error:
        _build(groups=(GROUPS[0], group))
    assert all(": uses a prefix reserved for system use (got " in p for p in error.value.errors)
    assert [p.split(":")[0] for p in error.value.errors] == ["instance_groups[1].labels", "instance_groups[1].taints"]


def test_lifecycle_runs_as_on_create_which_eks_requires(template):
    assert all(set(g["LifeCycleConfig"]) == {"SourceS3Uri", "OnCreate"} for g in _groups(template).values())


AUTOSCALED = dataclasses.replace(GROUPS[1], autoscale=True, deep_health_checks=False)


def test_an_autoscaled_group_needs_continuous_provisioning_at_the_construct_too():
    with pytest.raises(ConfigError) as error:
        _build(groups=(GROUPS[0], AUTOSCALED))
    assert error.value.errors == [
        "instance_groups[1].autoscale: needs continuous node provisioning "
        "(got True; allowed node_provisioning_mode continuous)"
    ]


def test_a_construct_without_autoscaled_groups_gets_no_autoscaler_role():
    _, _, hyperpod = _build()
    assert hyperpod.autoscaler_role is None


def test_an_autoscaled_construct_synthesizes_nag_clean_with_its_role():
    app, stack, hyperpod = _build(
        groups=(GROUPS[0], AUTOSCALED), node_provisioning_mode=NodeProvisioningMode.CONTINUOUS
    )
    app.synth()  # fails on any unacknowledged cdk-nag finding
    cluster = _cluster_properties(Template.from_stack(stack))
    assert cluster["ClusterRole"] == stack.resolve(hyperpod.autoscaler_role.role_arn)
    assert _groups(Template.from_stack(stack))["gpu"]["InstanceCount"] == 0


def _cluster_properties(template: Template) -> dict:
    (cluster,) = template.find_resources("AWS::SageMaker::Cluster").values()
    return cluster["Properties"]
