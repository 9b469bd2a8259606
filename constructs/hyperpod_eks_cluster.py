"""A SageMaker HyperPod cluster orchestrated by Amazon EKS (``Orchestrator.Eks.ClusterArn``).

The nodes join the EKS cluster given as a prop (``TrainingEksCluster`` builds one). Instance
groups carry Kubernetes labels and taints, automatic node recovery, and deep health checks
on accelerator groups, as in the Slurm construct; lifecycle scripts arrive the same way
(``hyperpod_nodes``), with ``workload_manager: eks`` in their parameters. Optionally the
HyperPod training operator add-on is installed once the nodes exist, for HyperPodPyTorchJob.

No EKS access entry is created for the execution role: HyperPod creates the nodes' access
entries itself (SageMaker API reference, ``ClusterMetadata.EksRoleAccessEntries``: "created
by HyperPod on your behalf"), which is why the cluster's authentication mode must include API.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam, aws_sagemaker as sagemaker
from constructs import Construct

from moe_cdk.constructs import cluster_software as software
from moe_cdk.constructs.hyperpod_nodes import (
    HyperPodInstanceGroup,
    execution_role,
    instance_group_problems,
    instance_group_property,
    lifecycle_directory_problems,
    publish_lifecycle,
)
from moe_cdk.constructs.nag import nag_text
from moe_cdk.constructs.training_eks_cluster import pod_identity_role
from moe_cdk.constructs.validation import problem, raise_if_any
from moe_cdk.rules.sagemaker import label_and_taint_key_problems, taints_with_deep_health_checks_problem

# Kubernetes label keys and values ("Labels and Selectors"): an optional DNS-subdomain
# prefix, then a name of at most 63 characters; values are empty or such a name.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
# The add-on creates this service account (in namespace aws-hyperpod).
TRAINING_OPERATOR_SERVICE_ACCOUNT = "hp-training-operator-controller-manager"
TRAINING_OPERATOR_POLICY = "AmazonSageMakerHyperPodTrainingOperatorAccess"
# The VPC CNI's describe calls and ECR's token call take no resource ARN.
EKS_NODE_UNSCOPED_ACTIONS = ("ec2:DescribeInstances", "ec2:DescribeTags", "ec2:DescribeInstanceTypes",
                             "ecr:GetAuthorizationToken")


class EksNodeRole(enum.Enum):
    """What a group's nodes run."""

    COMPUTE = "compute"
    """Training pods."""
    SYSTEM = "system"
    """Operators, CoreDNS and other cluster services."""


class TaintEffect(enum.Enum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, kw_only=True)
class Taint:
    """A Kubernetes taint on every node of a group."""

    key: str
    """Taint key, a Kubernetes label key. Required."""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE
    """NoSchedule, PreferNoSchedule or NoExecute. Default: NoSchedule."""
    value: str | None = None
    """Taint value. Default: none."""

    def toleration(self) -> dict:
        """The pod toleration that matches this taint."""
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect.value}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect.value}


@dataclass(frozen=True, kw_only=True)
class EksInstanceGroup(HyperPodInstanceGroup):
    """One instance group of an EKS-orchestrated cluster."""

    role: EksNodeRole = EksNodeRole.COMPUTE
    """compute (training) or system (cluster services). Default: compute."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Kubernetes labels on every node. Default: none."""
    taints: Sequence[Taint] = ()
    """Kubernetes taints on every node. Default: none."""

    @property
    def runs_training(self) -> bool:
        return self.role is EksNodeRole.COMPUTE


def kubernetes_metadata_problems(groups: Sequence[EksInstanceGroup]) -> list[tuple[str, str]]:
    found = []
    for i, g in enumerate(groups):
        if g.runs_deep_health_checks and (p := taints_with_deep_health_checks_problem([t.key for t in g.taints],
                                                                                     g.instance_type)):
            found.append((f"instance_groups[{i}].taints", p))
        found += [(f"instance_groups[{i}].{name}", message) for name, message in
                  label_and_taint_key_problems(list(g.labels), [t.key for t in g.taints])]
        for key, value in g.labels.items():
            if not LABEL_KEY.match(key):
                found.append((f"instance_groups[{i}].labels", problem("not a Kubernetes label key", got=key,
                                                                      allowed="[prefix/]name, name at most 63 characters")))
            if not LABEL_VALUE.match(value):
                found.append((f"instance_groups[{i}].labels.{key}", problem("not a Kubernetes label value", got=value,
                                                                            allowed="at most 63 letters, digits, '-', '_', '.'")))
        for j, taint in enumerate(g.taints):
            if not LABEL_KEY.match(taint.key):
                found.append((f"instance_groups[{i}].taints[{j}].key", problem("not a Kubernetes taint key", got=taint.key,
                                                                               allowed="[prefix/]name")))
            if taint.value is not None and not LABEL_VALUE.match(taint.value):
                found.append((f"instance_groups[{i}].taints[{j}].value", problem("not a Kubernetes taint value",
                                                                                 got=taint.value, allowed="at most 63 characters")))
    return found


def eks_group_problems(groups: Sequence[EksInstanceGroup], *, require_efa: bool) -> list[tuple[str, str]]:
    """``(key, message)`` for groups HyperPod, Kubernetes or the lifecycle scripts would reject."""
    found = instance_group_problems(groups, require_efa=require_efa) + kubernetes_metadata_problems(groups)
    roles = [g.role for g in groups]
    if EksNodeRole.COMPUTE not in roles:
        found.append(("instance_groups", problem("needs at least one compute group", got=[r.value for r in roles],
                                                 allowed="one or more groups with role compute")))
    if EksNodeRole.SYSTEM not in roles:
        found.append(("instance_groups", problem(
            "needs a system group: HyperPod brings every node, so operators and CoreDNS need untainted nodes",
            got=[r.value for r in roles], allowed="a group with role system, e.g. ml.m5.2xlarge")))
    return found


def provisioning_parameters(*, instance_groups: Sequence[EksInstanceGroup], region: str) -> dict:
    """What the lifecycle scripts read; on EKS the CSI driver mounts the file system, so no FSx here."""
    return {
        "version": "1.0.0",
        "workload_manager": "eks",
        "region": region,
        "controller_group": None,
        "login_group": None,
        "worker_groups": [g.worker_parameters() for g in instance_groups],
        "fsx_lustre": None,
        "container_runtime": {"containerd_data_dir": "/opt/dlami/nvme/containerd",
                              "fallback_data_dir": "/opt/sagemaker/containerd"},
    }


@dataclass(frozen=True, kw_only=True)
class HyperPodEksClusterProps:
    cluster_name: str
    """HyperPod cluster name. Required."""
    eks_cluster: eks.ICluster
    """The orchestrating EKS cluster. Required."""
    instance_groups: Sequence[EksInstanceGroup]
    """At least one compute group and one system group. Required."""
    subnet: ec2.ISubnet
    """The private subnet in the capacity's zone. Required."""
    security_group: ec2.ISecurityGroup
    """The EFA security group of the nodes. Required."""
    lifecycle_scripts_directory: str
    """Folder with ``on_create.sh``; shipped with the generated provisioning_parameters.json. Required."""
    region: str
    """Region, written into provisioning_parameters.json. Required."""
    require_efa: bool = True
    """Reject compute groups without EFA. Default: True."""
    training_operator: bool = True
    """Install the HyperPod training operator add-on (HyperPodPyTorchJob). Default: True."""
    training_operator_version: str | None = None
    """Its add-on version. Default: EKS's default."""


class HyperPodEksCluster(Construct):
    """HyperPod nodes for an EKS cluster, with automatic node recovery and deep health checks."""

    def __init__(self, scope: Construct, id: str, props: HyperPodEksClusterProps) -> None:
        super().__init__(scope, id)
        raise_if_any("HyperPodEksCluster", self._problems(props))
        self.props = props
        stack = cdk.Stack.of(self)
        self.role = execution_role(self, cluster_name=props.cluster_name, subnet=props.subnet,
                                   security_group=props.security_group, unscoped_actions=EKS_NODE_UNSCOPED_ACTIONS)
        self._grant_eks_node_permissions(stack)

        self.provisioning_parameters = provisioning_parameters(instance_groups=props.instance_groups, region=props.region)
        lifecycle = publish_lifecycle(self, construct_name="HyperPodEksCluster",
                                      directory=props.lifecycle_scripts_directory, parameters=self.provisioning_parameters,
                                      after_hyperpod_setup=False)
        self.lifecycle_bundle, self.lifecycle_entry = lifecycle.bundle, lifecycle.entry
        self._resource = sagemaker.CfnCluster(
            self, "Resource",
            cluster_name=props.cluster_name,
            node_recovery="Automatic",
            orchestrator=sagemaker.CfnCluster.OrchestratorProperty(
                eks=sagemaker.CfnCluster.ClusterOrchestratorEksConfigProperty(cluster_arn=props.eks_cluster.cluster_arn)),
            vpc_config=sagemaker.CfnCluster.VpcConfigProperty(
                security_group_ids=[props.security_group.security_group_id], subnets=[props.subnet.subnet_id]),
            instance_groups=[instance_group_property(
                g, role=self.role, life_cycle=lifecycle.config,
                kubernetes_config=sagemaker.CfnCluster.ClusterKubernetesConfigProperty(
                    labels=dict(g.labels) or None,
                    taints=[sagemaker.CfnCluster.ClusterKubernetesTaintProperty(key=t.key, value=t.value, effect=t.effect.value)
                            for t in g.taints] or None),
            ) for g in props.instance_groups],
        )
        self._resource.node.add_dependency(self.role)
        self.cluster_arn: str = self._resource.attr_cluster_arn
        self.cluster_name = props.cluster_name
        self.training_operator = self._training_operator() if props.training_operator else None

    def _grant_eks_node_permissions(self, stack: cdk.Stack) -> None:
        # What EKS nodes do beyond a Slurm node, per AWS's HyperPod EKS console template
        # (github.com/aws/sagemaker-hyperpod-cluster-setup, eks/cloudformation/
        # sagemaker-iam-role-template.yaml): the VPC CNI assigns pod IPs on the nodes' network
        # interfaces, kubelet pulls images from ECR, and pods assume roles through Pod Identity.
        instance_arn = stack.format_arn(service="ec2", resource="instance", resource_name="*")
        eni_arn = stack.format_arn(service="ec2", resource="network-interface", resource_name="*")
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses", "ec2:AttachNetworkInterface"],
            resources=[instance_arn, eni_arn]))
        repositories = stack.format_arn(service="ecr", region="*", account="*", resource="repository", resource_name="*")
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
            resources=[repositories]))
        self.role.add_to_policy(iam.PolicyStatement(actions=["eks-auth:AssumeRoleForPodIdentity"],
                                                    resources=[self.props.eks_cluster.cluster_arn]))
        cdk.Validations.of(self.role.node.find_child("DefaultPolicy").node.default_child).acknowledge(
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(stack, instance_arn)}]",
                reason="The VPC CNI on each node assigns pod addresses on whichever HyperPod instance it runs on; the "
                       "instances are created by HyperPod and have no ARN at synth time."),
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(stack, repositories)}]",
                reason="kubelet pulls images (read-only) from the ECR repositories of AWS's add-ons, which live in "
                       "AWS-owned accounts and, for some add-ons, other regions."))

    def _training_operator(self) -> eks.CfnAddon:
        # [HP-TO] in cluster_software: the add-on needs a HyperPod cluster, cert-manager and
        # the Pod Identity agent; its controller gets the managed policy through Pod Identity.
        role = pod_identity_role(self, "TrainingOperatorRole", TRAINING_OPERATOR_POLICY,
                                 reason="The policy AWS documents for the HyperPod training operator's service account; "
                                        "it reads the HyperPod cluster's node and job state.")
        addon = eks.CfnAddon(
            self, "TrainingOperator", cluster_name=self.props.eks_cluster.cluster_name,
            addon_name=software.TRAINING_OPERATOR.name, addon_version=self.props.training_operator_version,
            resolve_conflicts="OVERWRITE",
            pod_identity_associations=[eks.CfnAddon.PodIdentityAssociationProperty(
                role_arn=role.role_arn, service_account=TRAINING_OPERATOR_SERVICE_ACCOUNT)])
        addon.node.add_dependency(self._resource)
        return addon

    @staticmethod
    def _problems(props: HyperPodEksClusterProps) -> list[str]:
        found = [f"{key}: {message}" for key, message in eks_group_problems(props.instance_groups, require_efa=props.require_efa)]
        return found + lifecycle_directory_problems(props.lifecycle_scripts_directory)
