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

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam, aws_sagemaker as sagemaker
from constructs import Construct

from moe_cdk.constructs.hyperpod_nodes import (
    execution_role,
    instance_group_property,
    lifecycle_directory_problems,
    publish_lifecycle,
)
from moe_cdk.constructs.nag import nag_text
from moe_cdk.constructs.training_eks_cluster import pod_identity_role
from moe_cdk.constructs.validation import Problem, raise_if_any
from moe_cdk.core import catalog
from moe_cdk.rules import eks as eks_rules
from moe_cdk.rules.hyperpod_capacity import CapacityType, TieredStorage
from moe_cdk.rules.sagemaker import (
    EksInstanceGroup,
    EksNodeRole,
    NodeProvisioningMode,
    Taint,
    TaintEffect,
    eks_group_problems,
)
from moe_cdk.rules.teams import Team, TeamsConfig, eks_team_problems

# The construct, its props, and the value types its props take: those are defined in rules/ with
# their checks, which the configuration applies too.
__all__ = [
    "HyperPodEksCluster",
    "HyperPodEksClusterProps",
    "CapacityType",
    "EksInstanceGroup",
    "EksNodeRole",
    "NodeProvisioningMode",
    "TieredStorage",
    "Taint",
    "TaintEffect",
    "provisioning_parameters",
]


# The add-on creates this service account (in namespace aws-hyperpod).
TRAINING_OPERATOR_SERVICE_ACCOUNT = "hp-training-operator-controller-manager"
TRAINING_OPERATOR_POLICY = "AmazonSageMakerHyperPodTrainingOperatorAccess"
# The VPC CNI's describe calls and ECR's token call take no resource ARN.
EKS_NODE_UNSCOPED_ACTIONS = (
    "ec2:DescribeInstances",
    "ec2:DescribeTags",
    "ec2:DescribeInstanceTypes",
    "ecr:GetAuthorizationToken",
)


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
        "container_runtime": {
            "containerd_data_dir": "/opt/dlami/nvme/containerd",
            "fallback_data_dir": "/opt/sagemaker/containerd",
        },
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
    task_governance_version: str | None = None
    """The task-governance add-on's version, with ``teams``. Default: EKS's default."""
    node_provisioning_mode: NodeProvisioningMode = NodeProvisioningMode.STANDARD
    """Standard or continuous node provisioning; continuous is needed by autoscaled, Spot and flexible
    groups. Default: standard."""
    tiered_storage: TieredStorage | None = None
    """Managed tiered checkpointing's share of each node's host memory. Default: off."""
    teams: TeamsConfig | None = None
    """Task governance for these teams: the add-on, a scheduler configuration with the QoS tiers as priority classes
    and fair share on, and one compute quota per team (its share of each compute group's accelerators, or nodes).
    Default: none."""


def resource_name(cluster_name: str, suffix: str) -> str:
    """``<cluster>-<suffix>`` in the pattern and length of a SageMaker name (``^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$``,
    the registry schemas of ComputeQuota and ClusterSchedulerConfig). A name cut to fit ends in 8 characters of
    the whole name's hash, so two long names differ and none ends in a hyphen."""
    whole = f"{cluster_name}-{suffix}"
    if len(whole) <= 63:
        return whole
    digest = hashlib.sha256(whole.encode()).hexdigest()[:8]
    return f"{whole[:54].rstrip('-')}-{digest}"


def compute_quota_properties(
    team: Team, *, cluster_name: str, cluster_arn: str, groups: Sequence[EksInstanceGroup]
) -> dict:
    """``AWS::SageMaker::ComputeQuota`` for ``team``: its share of each compute group's accelerators (whole nodes on
    a type without them), rounded down; its sharing strategy, borrow limit and absolute borrow limits; its fair-share
    weight; and preemption of lower-priority tasks, as the schema's default."""
    # One entry per instance type: a node launched as a group's fallback type counts against the quota of that type,
    # so each type a group may run gets the team's share of the group's nodes; groups of one type add up (the API
    # takes one entry per InstanceType).
    per_type: dict[str, dict] = {}
    for g in groups:
        if g.role is not EksNodeRole.COMPUTE:
            continue
        for spec in filter(None, (catalog.lookup(t) for t in (g.instance_type, *g.fallback_instance_types))):
            key = "Accelerators" if spec.accelerator_count else "Count"
            units = g.instance_count * (spec.accelerator_count or 1)
            entry = per_type.setdefault(spec.sagemaker_name, {"InstanceType": spec.sagemaker_name, key: 0})
            entry[key] += units
    resources = [
        {k: (v * team.share_percent // 100 if k != "InstanceType" else v) for k, v in entry.items()}
        for entry in per_type.values()
    ]
    sharing = {"Strategy": team.sharing, **({"BorrowLimit": team.borrow_percent} if team.borrow_percent else {})}
    # [TG-SHARING] in rules/teams.py: AbsoluteBorrowLimits takes ComputeQuotaResourceConfig entries, by ml. name.
    if team.borrow_limits:
        sharing["AbsoluteBorrowLimits"] = [
            {"InstanceType": catalog.lookup(limit.instance_type).sagemaker_name, **limit.amounts()}
            for limit in team.borrow_limits
        ]
    return {
        "Name": resource_name(cluster_name, team.name),
        "ClusterArn": cluster_arn,
        "ComputeQuotaConfig": {
            "ComputeQuotaResources": resources,
            "ResourceSharingConfig": sharing,
            "PreemptTeamTasks": "LowerPriority",
        },
        "ComputeQuotaTarget": {"TeamName": team.name, "FairShareWeight": team.share_percent},
        "ActivationState": "Enabled",
    }


class HyperPodEksCluster(Construct):
    """HyperPod nodes for an EKS cluster, with automatic node recovery and deep health checks."""

    def __init__(self, scope: Construct, id: str, props: HyperPodEksClusterProps) -> None:
        super().__init__(scope, id)
        raise_if_any("HyperPodEksCluster", self._problems(props))
        self.props = props
        stack = cdk.Stack.of(self)
        self.role = execution_role(
            self,
            cluster_name=props.cluster_name,
            subnet=props.subnet,
            security_group=props.security_group,
            unscoped_actions=EKS_NODE_UNSCOPED_ACTIONS,
            instance_groups=props.instance_groups,
        )
        self._grant_eks_node_permissions(stack)

        self.provisioning_parameters = provisioning_parameters(
            instance_groups=props.instance_groups, region=props.region
        )
        lifecycle = publish_lifecycle(
            self,
            construct_name="HyperPodEksCluster",
            directory=props.lifecycle_scripts_directory,
            parameters=self.provisioning_parameters,
            after_hyperpod_setup=False,
        )
        self.lifecycle_bundle, self.lifecycle_entry = lifecycle.bundle, lifecycle.entry
        # Automatic node recovery on every cluster; Karpenter needs it too ("Autoscaling on SageMaker
        # HyperPod EKS", prerequisites), with continuous provisioning (checked in rules).
        autoscaled = any(g.autoscale for g in props.instance_groups)
        self.autoscaler_role = self._autoscaler_role(stack) if autoscaled else None
        continuous = props.node_provisioning_mode is NodeProvisioningMode.CONTINUOUS
        self._resource = sagemaker.CfnCluster(
            self,
            "Resource",
            cluster_name=props.cluster_name,
            node_recovery="Automatic",
            node_provisioning_mode="Continuous" if continuous else None,
            auto_scaling=(
                sagemaker.CfnCluster.ClusterAutoScalingConfigProperty(mode="Enable", auto_scaler_type="Karpenter")
                if autoscaled
                else None
            ),
            cluster_role=self.autoscaler_role.role_arn if self.autoscaler_role else None,
            tiered_storage_config=(
                sagemaker.CfnCluster.TieredStorageConfigProperty(
                    mode="Enable", instance_memory_allocation_percentage=props.tiered_storage.memory_percent
                )
                if props.tiered_storage
                else None
            ),
            orchestrator=sagemaker.CfnCluster.OrchestratorProperty(
                eks=sagemaker.CfnCluster.ClusterOrchestratorEksConfigProperty(cluster_arn=props.eks_cluster.cluster_arn)
            ),
            vpc_config=sagemaker.CfnCluster.VpcConfigProperty(
                security_group_ids=[props.security_group.security_group_id], subnets=[props.subnet.subnet_id]
            ),
            instance_groups=[
                instance_group_property(
                    g,
                    role=self.role,
                    life_cycle=lifecycle.config,
                    kubernetes_config=sagemaker.CfnCluster.ClusterKubernetesConfigProperty(
                        labels=dict(g.labels) or None,
                        taints=[
                            sagemaker.CfnCluster.ClusterKubernetesTaintProperty(
                                key=t.key, value=t.value, effect=t.effect.value
                            )
                            for t in g.taints
                        ]
                        or None,
                    ),
                )
                for g in props.instance_groups
            ],
        )
        self._resource.node.add_dependency(self.role)
        if self.autoscaler_role:
            self._resource.node.add_dependency(self.autoscaler_role)
        self.cluster_arn: str = self._resource.attr_cluster_arn
        self.cluster_name = props.cluster_name
        self.training_operator = self._training_operator() if props.training_operator else None
        self.team_quotas: list[cdk.CfnResource] = []
        """One ``AWS::SageMaker::ComputeQuota`` per team; each creates the team's namespace ``hyperpod-ns-<team>``."""
        self.task_governance = self._task_governance(props.teams) if props.teams is not None else None

    def _grant_eks_node_permissions(self, stack: cdk.Stack) -> None:
        # What EKS nodes do beyond a Slurm node, per AWS's HyperPod EKS console template
        # (github.com/aws/sagemaker-hyperpod-cluster-setup, eks/cloudformation/
        # sagemaker-iam-role-template.yaml): the VPC CNI assigns pod IPs on the nodes' network
        # interfaces, kubelet pulls images from ECR, and pods assume roles through Pod Identity.
        instance_arn = stack.format_arn(service="ec2", resource="instance", resource_name="*")
        eni_arn = stack.format_arn(service="ec2", resource="network-interface", resource_name="*")
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignPrivateIpAddresses",
                    "ec2:AttachNetworkInterface",
                ],
                resources=[instance_arn, eni_arn],
            )
        )
        repositories = stack.format_arn(
            service="ecr", region="*", account="*", resource="repository", resource_name="*"
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                resources=[repositories],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["eks-auth:AssumeRoleForPodIdentity"], resources=[self.props.eks_cluster.cluster_arn]
            )
        )
        cdk.Validations.of(self.role.node.find_child("DefaultPolicy").node.default_child).acknowledge(
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(stack, instance_arn)}]",
                reason="The VPC CNI on each node assigns pod addresses on whichever HyperPod instance it runs on; the "
                "instances are created by HyperPod and have no ARN at synth time.",
            ),
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(stack, repositories)}]",
                reason="kubelet pulls images (read-only) from the ECR repositories of AWS's add-ons, which live in "
                "AWS-owned accounts and, for some add-ons, other regions.",
            ),
        )

    def _autoscaler_role(self, stack: cdk.Stack) -> iam.Role:
        # "Autoscaling on SageMaker HyperPod EKS", IAM page: a role HyperPod assumes to add and remove
        # the nodes Karpenter asks for. AWS's policy allows the two calls on every cluster of every
        # account with an account condition; this one allows them on this account's clusters in this
        # Region. Its KMS grant is for groups whose EBS volumes use a customer key, which moe-cdk never
        # sets, so it is left out.
        role = iam.Role(
            self,
            "AutoscalerRole",
            assumed_by=iam.ServicePrincipal("hyperpod.sagemaker.amazonaws.com"),
            description=f"Karpenter autoscaling of HyperPod cluster {self.props.cluster_name}",
        )
        clusters = stack.format_arn(service="sagemaker", resource="cluster", resource_name="*")
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["sagemaker:BatchAddClusterNodes", "sagemaker:BatchDeleteClusterNodes"], resources=[clusters]
            )
        )
        cdk.Validations.of(role.node.find_child("DefaultPolicy").node.default_child).acknowledge(
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(stack, clusters)}]",
                reason="A HyperPod cluster's ARN ends in an id SageMaker assigns at creation, and the cluster "
                "names this role when it is created, so the role cannot name its one cluster: it may add and "
                "remove nodes of this account's clusters in this Region.",
            )
        )
        return role

    def _training_operator(self) -> eks.CfnAddon:
        # [HP-TO] in rules/eks.py: the add-on needs a HyperPod cluster, cert-manager and
        # the Pod Identity agent; its controller gets the managed policy through Pod Identity.
        role = pod_identity_role(
            self,
            "TrainingOperatorRole",
            TRAINING_OPERATOR_POLICY,
            reason="The policy AWS documents for the HyperPod training operator's service account; "
            "it reads the HyperPod cluster's node and job state.",
        )
        addon = eks.CfnAddon(
            self,
            "TrainingOperator",
            cluster_name=self.props.eks_cluster.cluster_name,
            addon_name=eks_rules.TRAINING_OPERATOR.name,
            addon_version=self.props.training_operator_version,
            resolve_conflicts="OVERWRITE",
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=role.role_arn, service_account=TRAINING_OPERATOR_SERVICE_ACCOUNT
                )
            ],
        )
        addon.node.add_dependency(self._resource)
        return addon

    def _task_governance(self, teams: TeamsConfig) -> eks.CfnAddon:
        # [HP-TG] in rules/eks.py: the add-on first, then the scheduler configuration, then the quotas
        # (a scheduler configuration created before the add-on is active can end in CreateFailed).
        addon = eks.CfnAddon(
            self,
            "TaskGovernance",
            cluster_name=self.props.eks_cluster.cluster_name,
            addon_name=eks_rules.TASK_GOVERNANCE.name,
            addon_version=self.props.task_governance_version,
            resolve_conflicts="OVERWRITE",
        )
        addon.node.add_dependency(self._resource)
        scheduler = sagemaker.CfnClusterSchedulerConfig(
            self,
            "SchedulerConfig",
            name=resource_name(self.props.cluster_name, "teams"),
            cluster_arn=self.cluster_arn,
            scheduler_config=sagemaker.CfnClusterSchedulerConfig.SchedulerConfigProperty(
                priority_classes=[
                    sagemaker.CfnClusterSchedulerConfig.PriorityClassProperty(name=t.name, weight=t.priority)
                    for t in teams.qos
                ],
                fair_share="Enabled",
                idle_resource_sharing="Enabled" if teams.idle_resource_sharing else None,
            ),
        )
        scheduler.node.add_dependency(addon)
        for team in teams.teams:
            quota = cdk.CfnResource(
                self,
                f"Quota-{team.name}",
                # aws-cdk-lib 2.275 has no L1 for it; cfn-lint checks the properties against the registry schema.
                type="AWS::SageMaker::ComputeQuota",
                properties=compute_quota_properties(
                    team,
                    cluster_name=self.props.cluster_name,
                    cluster_arn=self.cluster_arn,
                    groups=self.props.instance_groups,
                ),
            )
            quota.node.add_dependency(scheduler)
            self.team_quotas.append(quota)
            cdk.Validations.of(quota).acknowledge(
                cdk.Acknowledgment(
                    id="CloudFormation-Validate::F3006",
                    reason="AWS::SageMaker::ComputeQuota is in CloudFormation's resource registry (the registry "
                    "schemas cfn-lint 1.58.0 ships list it in us-east-1, us-east-2, us-west-2, eu-west-1 and 15 more "
                    "Regions; botocore's SageMaker model has CreateComputeQuota), but not yet in the resource "
                    "specification that aws-cdk-lib 2.275's built-in validator reads (it has no L1 for it either); "
                    "cfn-lint checks this resource against the registry schema instead",
                )
            )
        return addon

    @staticmethod
    def _problems(props: HyperPodEksClusterProps) -> list[Problem]:
        found = eks_group_problems(
            props.instance_groups,
            require_efa=props.require_efa,
            continuous=props.node_provisioning_mode is NodeProvisioningMode.CONTINUOUS,
        )
        if props.tiered_storage is not None:
            found += [p.at("tiered_storage") for p in props.tiered_storage.problems()]
        if props.teams is not None:
            found += list(eks_team_problems(props.teams, props.instance_groups))
        return found + lifecycle_directory_problems(props.lifecycle_scripts_directory)
