"""A SageMaker HyperPod cluster orchestrated by Slurm (native ``AWS::SageMaker::Cluster``).

The lifecycle scripts reach the nodes as described in ``hyperpod_nodes``: a file asset in the
``sagemaker-`` lifecycle bucket, run by a generated entry script.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_ecr as ecr, aws_iam as iam, aws_s3 as s3, aws_sagemaker as sagemaker
from constructs import Construct

from moe_cdk.constructs.hyperpod_nodes import (
    GROUP_NAME,
    HyperPodInstanceGroup,
    execution_role,
    instance_group_problems,
    instance_group_property,
    lifecycle_directory_problems,
    publish_lifecycle,
)
from moe_cdk.constructs.validation import is_unresolved, problem, raise_if_any
from moe_cdk.rules import sagemaker as rules
from moe_cdk.rules.fsx import efa_client_interfaces


DATABASE_NAME = re.compile(r"^[a-zA-Z0-9$_]{1,64}$")
HOST_NAME = re.compile(r"^(?=.{1,255}$)[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$")
SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+$")


class NodeType(enum.Enum):
    """``SlurmConfig.NodeType`` of an instance group."""

    CONTROLLER = "Controller"
    LOGIN = "Login"
    COMPUTE = "Compute"


class SlurmConfigStrategy(enum.Enum):
    """Who owns slurm.conf (``Orchestrator.Slurm.SlurmConfigStrategy``)."""

    MANAGED = "Managed"
    OVERWRITE = "Overwrite"
    MERGE = "Merge"


@dataclass(frozen=True, kw_only=True)
class SlurmInstanceGroup(HyperPodInstanceGroup):
    """One instance group of a Slurm cluster."""

    node_type: NodeType
    """Controller, Login or Compute. Required."""
    partition: str | None = None
    """Slurm partition of a compute group. Default: the group name."""

    @property
    def runs_training(self) -> bool:
        return self.node_type is NodeType.COMPUTE

    @property
    def partition_name(self) -> str | None:
        return (self.partition or self.name) if self.node_type is NodeType.COMPUTE else None


class NodeProvisioningMode(enum.Enum):
    """How HyperPod provisions the cluster's nodes (``NodeProvisioningMode``)."""

    STANDARD = "standard"
    """All nodes at creation; creation fails when a group cannot be filled (the property is omitted)."""
    CONTINUOUS = "continuous"
    """Partial capacity is accepted and failed launches are retried (``Continuous``). SageMaker Developer
    Guide, "Continuous provisioning for Slurm": it rejects any ``SlurmConfigStrategy``, and it is the only
    mode with an external accounting database."""


@dataclass(frozen=True, kw_only=True)
class AccountingDatabase:
    """An external MySQL-compatible database for slurmdbd (``Orchestrator.Slurm.AccountingDatabase``)."""

    endpoint: str
    """Database host name. Required."""
    secret_arn: str
    """ARN of the Secrets Manager secret with the database credentials. Required."""
    name: str = "slurm_acct_db"
    """Database name. Default: slurm_acct_db."""
    port: int = 3306
    """Database port. Default: 3306."""

    def problems(self) -> Iterator[tuple[str, str]]:
        if not is_unresolved(self.secret_arn) and not SECRET_ARN.match(self.secret_arn):
            yield "secret_arn", problem("not a Secrets Manager secret ARN", got=self.secret_arn,
                                        allowed="arn:aws:secretsmanager:<region>:<account>:secret:<name>")
        if not 1 <= self.port <= 65535:
            yield "port", problem("not a TCP port", got=self.port, allowed="1 to 65535")
        # SageMaker API reference, ClusterAccountingDatabase: Name is 1 to 64 of [a-zA-Z0-9$_], Endpoint a host name.
        if not DATABASE_NAME.match(self.name):
            yield "name", problem("not a database name", got=self.name, allowed="1 to 64 letters, digits, '$' or '_'")
        if not is_unresolved(self.endpoint) and not HOST_NAME.match(self.endpoint):
            yield "endpoint", problem("not a host name", got=self.endpoint, allowed="a DNS name of up to 255 characters")


@dataclass(frozen=True, kw_only=True)
class FsxMount:
    """The Lustre file system the nodes mount, by reference: its values are read on the node from SSM."""

    file_system_id: str
    """The file system ID (for scoped describe permissions). Required."""
    availability_zone: str
    """The file system's zone, checked against the cluster's. Required."""
    efa_enabled: bool
    """Whether the file system serves clients over EFA (then it must be in the cluster's zone). Required."""
    dns_name_parameter: str
    """SSM parameter holding the DNS name. Required."""
    mount_name_parameter: str
    """SSM parameter holding the Lustre mount name. Required."""
    mount_point: str = "/fsx"
    """Where nodes mount it. Default: /fsx."""


@dataclass(frozen=True, kw_only=True)
class HyperPodSlurmClusterProps:
    cluster_name: str
    """HyperPod cluster name. Required."""
    instance_groups: Sequence[SlurmInstanceGroup]
    """Exactly one controller group of one node, at most one login group, one or more compute groups. Required."""
    subnet: ec2.ISubnet
    """The private subnet in the capacity's zone. Required."""
    security_group: ec2.ISecurityGroup
    """The EFA security group of the nodes. Required."""
    lifecycle_scripts_directory: str
    """Folder with ``on_create.sh`` and what it runs; shipped with the generated provisioning_parameters.json. Required."""
    region: str
    """Region, written into provisioning_parameters.json for the node's AWS calls. Required."""
    fsx: FsxMount | None = None
    """The shared file system. Default: none."""
    data_bucket: s3.IBucket | None = None
    """Bucket the nodes may read and write. Default: none."""
    image_repository: ecr.IRepository | None = None
    """ECR repository of the training image, which the nodes' enroot pulls with the role. Default: none."""
    require_efa: bool = True
    """Reject compute groups without EFA. Default: True."""
    node_provisioning_mode: NodeProvisioningMode = NodeProvisioningMode.STANDARD
    """Standard or continuous node provisioning. Default: standard."""
    slurm_config_strategy: SlurmConfigStrategy | None = None
    """Who owns slurm.conf. Default: Managed in standard mode; must stay None in continuous mode, which
    rejects the property."""
    accounting_database: AccountingDatabase | None = None
    """External accounting database; needs continuous provisioning. The execution role may read its
    secret. Default: none (slurmdbd on the controller, as HyperPod sets it up)."""


def provisioning_parameters(*, instance_groups: Sequence[SlurmInstanceGroup], region: str, fsx: FsxMount | None) -> dict:
    """What the lifecycle scripts read, built from the cluster's own props: no value is typed twice."""
    groups = list(instance_groups)
    by_type = {t: [g for g in groups if g.node_type is t] for t in NodeType}
    return {
        "version": "1.0.0",
        "workload_manager": "slurm",
        "region": region,
        "controller_group": by_type[NodeType.CONTROLLER][0].name if by_type[NodeType.CONTROLLER] else None,
        "login_group": by_type[NodeType.LOGIN][0].name if by_type[NodeType.LOGIN] else None,
        "worker_groups": [g.worker_parameters() for g in by_type[NodeType.COMPUTE]],
        "fsx_lustre": None if fsx is None else {
            "dns_name_parameter": fsx.dns_name_parameter, "mount_name_parameter": fsx.mount_name_parameter,
            "mount_point": fsx.mount_point,
            # Worker groups that reach an EFA-enabled file system over EFA, with their interface count.
            "efa_interfaces": {g.name: n for g in by_type[NodeType.COMPUTE]
                               if fsx.efa_enabled and (n := efa_client_interfaces(g.instance_type))},
        },
        "container_runtime": {"enroot_data_dir": "/opt/dlami/nvme/enroot", "pyxis": True},
    }


def group_problems(instance_groups: Sequence[SlurmInstanceGroup], *, require_efa: bool,
                   slurm: bool = True) -> list[tuple[str, str]]:
    """``(key, message)`` for instance groups HyperPod or the lifecycle scripts would reject.
    ``slurm=False`` drops the Slurm-only rules (controller and login groups)."""
    groups = list(instance_groups)
    found = instance_group_problems(groups, require_efa=require_efa)
    for i, g in enumerate(groups):
        key = f"instance_groups[{i}]"
        if g.partition is not None and g.node_type is not NodeType.COMPUTE:
            found.append((f"{key}.partition", problem("only compute groups have a partition", got=g.partition, allowed="None")))
        if g.partition_name is not None and not GROUP_NAME.match(g.partition_name):
            found.append((f"{key}.partition", problem("not a valid partition name", got=g.partition_name,
                                                      allowed="letters, digits and inner hyphens")))
    types = [g.node_type for g in groups]
    controllers = [g for g in groups if g.node_type is NodeType.CONTROLLER]
    if slurm and (len(controllers) != 1 or controllers[0].instance_count != 1):
        found.append(("instance_groups", problem("needs exactly one controller group with instance_count 1",
                                                 got=[(g.name, g.instance_count) for g in controllers], allowed="one controller node")))
    if slurm and types.count(NodeType.LOGIN) > 1:
        found.append(("instance_groups", problem("at most one login group", got=types.count(NodeType.LOGIN), allowed="0 or 1")))
    if NodeType.COMPUTE not in types:
        found.append(("instance_groups", problem("needs at least one compute group", got=[t.value for t in types],
                                                 allowed="one or more Compute groups")))
    return found


def provisioning_problems(*, mode: NodeProvisioningMode, slurm_config_strategy: SlurmConfigStrategy | None,
                          accounting_database: AccountingDatabase | None) -> list[tuple[str, str]]:
    """``(key, message)`` for provisioning settings CreateCluster rejects (``rules.sagemaker``), and
    for a bad accounting database."""
    found = rules.provisioning_problems(
        continuous=mode is NodeProvisioningMode.CONTINUOUS, accounting_database=accounting_database is not None,
        slurm_config_strategy=None if slurm_config_strategy is None else slurm_config_strategy.value)
    if accounting_database is not None:
        found += [(f"accounting_database.{key}", message) for key, message in accounting_database.problems()]
    return found


class HyperPodSlurmCluster(Construct):
    """A HyperPod Slurm cluster with automatic node recovery, deep health checks on accelerator
    groups, one thread per core on GPU groups, and lifecycle scripts that mount the shared
    file system, configure enroot/pyxis on NVMe and set Slurm node features."""

    def __init__(self, scope: Construct, id: str, props: HyperPodSlurmClusterProps) -> None:
        super().__init__(scope, id)
        raise_if_any("HyperPodSlurmCluster", self._problems(props))
        self.props = props
        stack = cdk.Stack.of(self)

        # ecr:GetAuthorizationToken has no resource-level permissions (Service Authorization Reference).
        self.role = execution_role(self, cluster_name=props.cluster_name, subnet=props.subnet,
                                   security_group=props.security_group,
                                   unscoped_actions=["ecr:GetAuthorizationToken"] if props.image_repository else [])
        if props.image_repository is not None:
            # SageMaker Developer Guide, "IAM role for SageMaker HyperPod": the managed instance policy
            # has no ECR actions; the pull actions are the ones the guide lists for EKS nodes.
            self.role.add_to_policy(iam.PolicyStatement(
                actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                resources=[props.image_repository.repository_arn]))
        if props.fsx is not None:
            for name in (props.fsx.dns_name_parameter, props.fsx.mount_name_parameter):
                self.role.add_to_policy(iam.PolicyStatement(
                    actions=["ssm:GetParameter"],
                    resources=[stack.format_arn(service="ssm", resource="parameter", resource_name=name.lstrip("/"))],
                ))
        if props.data_bucket is not None:
            # Explicit actions rather than grant_read_write's wildcards. The object-level
            # resource is the caller's to acknowledge in cdk-nag.
            props.data_bucket.grant(self.role, "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload")
            self.role.add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"],
                                                        resources=[props.data_bucket.bucket_arn]))

        self.provisioning_parameters = provisioning_parameters(
            instance_groups=props.instance_groups, region=props.region, fsx=props.fsx)
        lifecycle = publish_lifecycle(self, construct_name="HyperPodSlurmCluster",
                                      directory=props.lifecycle_scripts_directory, parameters=self.provisioning_parameters,
                                      # HyperPod then starts Slurm and installs enroot and pyxis itself
                                      # (lifecycle_scripts/on_create.sh says what is left to do).
                                      after_hyperpod_setup=True)
        self.lifecycle_bundle, self.lifecycle_entry = lifecycle.bundle, lifecycle.entry

        continuous = props.node_provisioning_mode is NodeProvisioningMode.CONTINUOUS
        if props.accounting_database is not None:
            # slurmdbd reads the credentials with the nodes' role. AWS's multi-head-node sample grants
            # exactly this (aws-samples/awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/
            # sagemaker-hyperpod-slurm-multi-headnode.yaml at 7217859); the managed instance policy has no
            # Secrets Manager action. A secret under a customer managed key also needs kms:Decrypt on it.
            self.role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                        resources=[props.accounting_database.secret_arn]))
        strategy = props.slurm_config_strategy or (None if continuous else SlurmConfigStrategy.MANAGED)
        orchestrator_slurm = sagemaker.CfnCluster.ClusterOrchestratorSlurmConfigProperty(
            slurm_config_strategy=strategy.value if strategy else None,
            accounting_database=None if props.accounting_database is None else {
                "endpoint": props.accounting_database.endpoint, "secretArn": props.accounting_database.secret_arn,
                "name": props.accounting_database.name, "port": props.accounting_database.port,
            },
        )
        self._resource = sagemaker.CfnCluster(
            self, "Resource",
            cluster_name=props.cluster_name,
            node_recovery="Automatic",
            node_provisioning_mode="Continuous" if continuous else None,
            orchestrator=sagemaker.CfnCluster.OrchestratorProperty(slurm=orchestrator_slurm),
            vpc_config=sagemaker.CfnCluster.VpcConfigProperty(
                security_group_ids=[props.security_group.security_group_id], subnets=[props.subnet.subnet_id],
            ),
            instance_groups=[instance_group_property(
                g, role=self.role, life_cycle=lifecycle.config,
                slurm_config=sagemaker.CfnCluster.ClusterSlurmConfigProperty(
                    node_type=g.node_type.value, partition_names=[g.partition_name] if g.partition_name else None),
            ) for g in props.instance_groups],
        )
        self._resource.node.add_dependency(self.role)
        self.cluster_arn: str = self._resource.attr_cluster_arn
        self.cluster_name = props.cluster_name

    @staticmethod
    def _problems(props: HyperPodSlurmClusterProps) -> list[str]:
        found = [f"{key}: {message}" for key, message in group_problems(props.instance_groups, require_efa=props.require_efa)]
        found += lifecycle_directory_problems(props.lifecycle_scripts_directory)
        found += [f"{key}: {message}" for key, message in provisioning_problems(
            mode=props.node_provisioning_mode, slurm_config_strategy=props.slurm_config_strategy,
            accounting_database=props.accounting_database)]
        fsx, zone = props.fsx, props.subnet.availability_zone
        if fsx is not None and fsx.efa_enabled and not is_unresolved(zone) and fsx.availability_zone != zone:
            found.append("fsx.availability_zone: " + problem("an EFA-enabled file system must be in the cluster's zone",
                                                             got=fsx.availability_zone, allowed=zone))
        return found
