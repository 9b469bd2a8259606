"""A SageMaker HyperPod cluster orchestrated by Slurm (native ``AWS::SageMaker::Cluster``).

The lifecycle scripts reach the nodes as described in ``hyperpod_nodes``: a file asset in the
``sagemaker-`` lifecycle bucket, run by a generated entry script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_ecr as ecr, aws_iam as iam, aws_s3 as s3, aws_sagemaker as sagemaker
from constructs import Construct

from moe_cdk.constructs.hyperpod_nodes import (
    execution_role,
    instance_group_property,
    lifecycle_directory_problems,
    publish_lifecycle,
)
from moe_cdk.constructs.nag import nag_text
from moe_cdk.constructs.validation import Problem, is_unresolved, problem, raise_if_any
from moe_cdk.rules.fsx import efa_client_interfaces
from moe_cdk.rules.parallelcluster import SCRATCH
from moe_cdk.rules.sagemaker import (
    AccountingDatabase,
    NodeProvisioningMode,
    NodeType,
    SlurmConfigStrategy,
    SlurmInstanceGroup,
    group_problems,
    slurm_provisioning_problems,
)
from moe_cdk.rules.teams import TeamsConfig

# The construct, its props, and the value types its props take: those are defined in rules/ with
# their checks, which the configuration applies too.
__all__ = [
    "HyperPodSlurmCluster",
    "HyperPodSlurmClusterProps",
    "FsxMount",
    "NodeObservability",
    "SlurmInstanceGroup",
    "NodeType",
    "NodeProvisioningMode",
    "SlurmConfigStrategy",
    "AccountingDatabase",
    "provisioning_parameters",
]


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


# The account whose ECR holds the exporter images HyperPod publishes for its nodes, as AWS's reference
# lifecycle scripts pull them (aws-samples/awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/
# LifecycleScripts/base-config/observability/install_*_exporter.sh at 7217859): hyperpod/node_exporter,
# hyperpod/dcgm_exporter and hyperpod/efa_exporter.
HYPERPOD_EXPORTER_ACCOUNT = "602401143452"
# The ports the exporters hold on every node: node_exporter, EFA exporter, DCGM exporter
# (lifecycle_scripts/setup_observability.sh).
NODE_EXPORTER_PORTS = (9100, 9109, 9400)


@dataclass(frozen=True, kw_only=True)
class NodeObservability:
    """What the lifecycle scripts need to start the exporters and the agent that remote-writes to Managed
    Prometheus (lifecycle_scripts/setup_observability.sh)."""

    remote_write_url_parameter: str
    """SSM parameter holding the workspace's remote-write URL, read on the controller at boot. Required."""
    scrape_interval_s: int = 30
    """How often the agent scrapes every exporter, in seconds. Default: 30."""
    trainer_metrics_port: int | None = None
    """The trainer's Prometheus port on the compute nodes (the profile's ``metrics.prometheus_port``). Default: none,
    no trainer target."""


def _exporters_arn(stack: cdk.Stack) -> str:
    return stack.format_arn(
        service="ecr", account=HYPERPOD_EXPORTER_ACCOUNT, resource="repository", resource_name="hyperpod/*"
    )


def observability_statements(stack: cdk.Stack, remote_write_url_parameter: str) -> list[iam.PolicyStatement]:
    """What a Slurm node needs for the observability step, besides ``ecr:GetAuthorizationToken`` and
    ``aps:RemoteWrite``: the remote-write URL's parameter, and pulls of HyperPod's exporter images from its registry
    in the cluster's Region (acknowledge them with ``acknowledge_exporter_pulls``)."""
    parameter = stack.format_arn(
        service="ssm", resource="parameter", resource_name=remote_write_url_parameter.lstrip("/")
    )
    return [
        iam.PolicyStatement(actions=["ssm:GetParameter"], resources=[parameter]),
        iam.PolicyStatement(
            actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
            resources=[_exporters_arn(stack)],
        ),
    ]


def acknowledge_exporter_pulls(stack: cdk.Stack, policy: cdk.CfnResource) -> None:
    """The cdk-nag acknowledgment of ``observability_statements``' pulls, on the policy that holds them."""
    cdk.Validations.of(policy).acknowledge(
        cdk.Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::{nag_text(stack, _exporters_arn(stack))}]",
            reason="Pull-only access to the exporter images HyperPod publishes under hyperpod/ in its own "
            "registry account; the lifecycle scripts pin each image by tag (lifecycle_scripts/README.md).",
        )
    )


def observability_problems(observability: NodeObservability) -> list[Problem]:
    """What is wrong with ``observability``, each at its prop."""
    found = []
    if not observability.remote_write_url_parameter.startswith("/"):
        found.append(
            problem("not an SSM parameter path", got=observability.remote_write_url_parameter, allowed="/a/b/c").at(
                "observability.remote_write_url_parameter"
            )
        )
    if not 30 <= observability.scrape_interval_s <= 300:
        found.append(
            problem("out of range", got=observability.scrape_interval_s, allowed="30 to 300").at(
                "observability.scrape_interval_s"
            )
        )
    port = observability.trainer_metrics_port
    if port is not None and not (1024 <= port <= 65535 and port not in NODE_EXPORTER_PORTS):
        # The lifecycle scripts refuse the same ports at boot (node_info.py --check).
        found.append(
            problem(
                "not a port the trainer can serve on next to the exporters",
                got=port,
                allowed=f"1024 to 65535 except {', '.join(map(str, NODE_EXPORTER_PORTS))}, or null",
            ).at("observability.trainer_metrics_port")
        )
    return found


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
    """Folder with ``on_create.sh`` and what it runs; shipped with the generated provisioning_parameters.json.
    Required."""
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
    observability: NodeObservability | None = None
    """Exporters on every node and an agent on the controller (the caller grants ``aps:RemoteWrite`` on its
    workspace to ``role``). Default: none."""
    teams: TeamsConfig | None = None
    """Teams: their members' users and homes on every node; accounts, QoS tiers, fair share, priority and
    preemption on the controller (lifecycle_scripts/slurm_teams.sh). Default: none."""


def provisioning_parameters(
    *,
    instance_groups: Sequence[SlurmInstanceGroup],
    region: str,
    fsx: FsxMount | None,
    observability: NodeObservability | None = None,
    teams: TeamsConfig | None = None,
    parallelcluster: bool = False,
) -> dict:
    """What the lifecycle scripts read, built from the cluster's own props: no value is typed twice.
    ``parallelcluster``: the nodes are ParallelCluster's, which mounts the file system itself."""
    groups = list(instance_groups)
    by_type = {t: [g for g in groups if g.node_type is t] for t in NodeType}
    return {
        **({"cluster_manager": "parallelcluster"} if parallelcluster else {}),
        "version": "1.0.0",
        "workload_manager": "slurm",
        "region": region,
        "controller_group": by_type[NodeType.CONTROLLER][0].name if by_type[NodeType.CONTROLLER] else None,
        "login_group": by_type[NodeType.LOGIN][0].name if by_type[NodeType.LOGIN] else None,
        "worker_groups": [g.worker_parameters() for g in by_type[NodeType.COMPUTE]],
        "fsx_lustre": None
        if fsx is None
        else {
            "dns_name_parameter": fsx.dns_name_parameter,
            "mount_name_parameter": fsx.mount_name_parameter,
            "mount_point": fsx.mount_point,
            # Worker groups that reach an EFA-enabled file system over EFA, with their interface count.
            "efa_interfaces": {
                g.name: n
                for g in by_type[NodeType.COMPUTE]
                if fsx.efa_enabled and (n := efa_client_interfaces(g.instance_type))
            },
        },
        # HyperPod's DLAMI mounts the instance NVMe at /opt/dlami/nvme; ParallelCluster mounts it at the queue's
        # EphemeralVolume.MountDir (constructs/parallelcluster_cluster.py).
        "container_runtime": {
            "enroot_data_dir": f"{SCRATCH}/enroot" if parallelcluster else "/opt/dlami/nvme/enroot",
            "pyxis": True,
        },
        "observability": None
        if observability is None
        else {
            "remote_write_url_parameter": observability.remote_write_url_parameter,
            "scrape_interval_s": observability.scrape_interval_s,
            "trainer_metrics_port": observability.trainer_metrics_port,
        },
        "teams": None if teams is None else teams_parameters(teams),
    }


def teams_parameters(teams: TeamsConfig) -> dict:
    """The teams as slurm_teams.py reads them, each team's tiers and default tier resolved."""
    return {
        "qos": [
            {
                "name": t.name,
                "priority": t.priority,
                "preempts": list(t.preempts),
                "max_gpus": t.max_gpus,
                "max_wall": t.max_wall,
                "grace_time_s": t.grace_time_s,
                "preempt_exempt_s": t.preempt_exempt_s,
                "max_gpus_per_user": t.max_gpus_per_user,
            }
            for t in teams.qos
        ],
        "teams": [
            {
                "name": team.name,
                "share_percent": team.share_percent,
                "qos": list(team.tiers(teams.qos)),
                "default_qos": team.default(teams.qos),
                "members": [{"name": m.name, "uid": m.uid} for m in team.members],
                "gid": team.group_id(position),
                "max_gpus": team.max_gpus,
                "max_gpus_per_user": team.max_gpus_per_user,
                "max_jobs_per_user": team.max_jobs_per_user,
            }
            for position, team in enumerate(teams.teams)
        ],
        "operators": list(teams.operators),
    }


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
        self.role = execution_role(
            self,
            cluster_name=props.cluster_name,
            subnet=props.subnet,
            security_group=props.security_group,
            unscoped_actions=["ecr:GetAuthorizationToken"] if props.image_repository or props.observability else [],
            instance_groups=props.instance_groups,
        )
        if props.image_repository is not None:
            # SageMaker Developer Guide, "IAM role for SageMaker HyperPod": the managed instance policy
            # has no ECR actions; the pull actions are the ones the guide lists for EKS nodes.
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                    resources=[props.image_repository.repository_arn],
                )
            )
        if props.fsx is not None:
            for name in (props.fsx.dns_name_parameter, props.fsx.mount_name_parameter):
                self.role.add_to_policy(
                    iam.PolicyStatement(
                        actions=["ssm:GetParameter"],
                        resources=[
                            stack.format_arn(service="ssm", resource="parameter", resource_name=name.lstrip("/"))
                        ],
                    )
                )
        if props.data_bucket is not None:
            # Explicit actions rather than grant_read_write's wildcards. The object-level
            # resource is the caller's to acknowledge in cdk-nag.
            props.data_bucket.grant(self.role, "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload")
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=[props.data_bucket.bucket_arn]
                )
            )

        if props.observability is not None:
            self._allow_observability(props.observability, stack)
        self.provisioning_parameters = provisioning_parameters(
            instance_groups=props.instance_groups,
            region=props.region,
            fsx=props.fsx,
            observability=props.observability,
            teams=props.teams,
        )
        lifecycle = publish_lifecycle(
            self,
            construct_name="HyperPodSlurmCluster",
            directory=props.lifecycle_scripts_directory,
            parameters=self.provisioning_parameters,
            # HyperPod then starts Slurm and installs enroot and pyxis itself
            # (lifecycle_scripts/on_create.sh says what is left to do).
            after_hyperpod_setup=True,
        )
        self.lifecycle_bundle, self.lifecycle_entry = lifecycle.bundle, lifecycle.entry

        continuous = props.node_provisioning_mode is NodeProvisioningMode.CONTINUOUS
        if props.accounting_database is not None:
            # slurmdbd reads the credentials with the nodes' role. AWS's multi-head-node sample grants
            # exactly this (aws-samples/awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/
            # sagemaker-hyperpod-slurm-multi-headnode.yaml at 7217859); the managed instance policy has no
            # Secrets Manager action. A secret under a customer managed key also needs kms:Decrypt on it.
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["secretsmanager:GetSecretValue"], resources=[props.accounting_database.secret_arn]
                )
            )
        strategy = props.slurm_config_strategy or (None if continuous else SlurmConfigStrategy.MANAGED)
        orchestrator_slurm = sagemaker.CfnCluster.ClusterOrchestratorSlurmConfigProperty(
            slurm_config_strategy=strategy.value if strategy else None,
            accounting_database=None
            if props.accounting_database is None
            else {
                "endpoint": props.accounting_database.endpoint,
                "secretArn": props.accounting_database.secret_arn,
                "name": props.accounting_database.name,
                "port": props.accounting_database.port,
            },
        )
        self._resource = sagemaker.CfnCluster(
            self,
            "Resource",
            cluster_name=props.cluster_name,
            node_recovery="Automatic",
            node_provisioning_mode="Continuous" if continuous else None,
            orchestrator=sagemaker.CfnCluster.OrchestratorProperty(slurm=orchestrator_slurm),
            vpc_config=sagemaker.CfnCluster.VpcConfigProperty(
                security_group_ids=[props.security_group.security_group_id],
                subnets=[props.subnet.subnet_id],
            ),
            instance_groups=[
                instance_group_property(
                    g,
                    role=self.role,
                    life_cycle=lifecycle.config,
                    slurm_config=sagemaker.CfnCluster.ClusterSlurmConfigProperty(
                        node_type=g.node_type.value, partition_names=[g.partition_name] if g.partition_name else None
                    ),
                )
                for g in props.instance_groups
            ],
        )
        self._resource.node.add_dependency(self.role)
        self.cluster_arn: str = self._resource.attr_cluster_arn
        self.cluster_name = props.cluster_name

    def _allow_observability(self, observability: NodeObservability, stack: cdk.Stack) -> None:
        # ecr:GetAuthorizationToken, unscoped, is granted by the execution role.
        for statement in observability_statements(stack, observability.remote_write_url_parameter):
            self.role.add_to_policy(statement)
        acknowledge_exporter_pulls(stack, self.role.node.find_child("DefaultPolicy").node.default_child)

    @staticmethod
    def _problems(props: HyperPodSlurmClusterProps) -> list[Problem]:
        found = group_problems(
            props.instance_groups,
            require_efa=props.require_efa,
            continuous=props.node_provisioning_mode is NodeProvisioningMode.CONTINUOUS,
        )
        found += lifecycle_directory_problems(props.lifecycle_scripts_directory)
        if props.observability is not None:
            found += observability_problems(props.observability)
        found += slurm_provisioning_problems(
            mode=props.node_provisioning_mode,
            slurm_config_strategy=props.slurm_config_strategy,
            accounting_database=props.accounting_database,
        )
        fsx, zone = props.fsx, props.subnet.availability_zone
        if fsx is not None and fsx.efa_enabled and not is_unresolved(zone) and fsx.availability_zone != zone:
            found.append(
                problem(
                    "an EFA-enabled file system must be in the cluster's zone", got=fsx.availability_zone, allowed=zone
                ).at("fsx.availability_zone")
            )
        return found
