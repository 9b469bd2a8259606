"""An AWS ParallelCluster Slurm cluster as CloudFormation's ``Custom::PclusterCluster`` (ParallelCluster >= 3.6).

The custom resource is served by AWS's provider stack, added here as a nested stack at the pinned release unless a
``service_token`` names one already deployed. Its ``ClusterConfiguration`` is generated from the props: the head
node, an optional login node pool, one Slurm queue of one compute resource per compute group, the shared FSx for
Lustre file system, CloudWatch logs, and the lifecycle scripts as each node's ``OnNodeConfigured`` action.

The lifecycle bundle (lifecycle_scripts/ and provisioning_parameters.json) is a file asset in the stack's asset
bucket, as for HyperPod. ParallelCluster downloads only the action's script, so the script is
lifecycle_scripts/parallelcluster_entry.sh, published on its own: it takes the bundle, the Region and the node's
instance group as arguments, fetches and unpacks the bundle and runs ``on_create.sh --group``. The node is never
looked up in ParallelCluster's internal files.

ParallelCluster refuses to update a running cluster whose head node's or login nodes' ``OnNodeConfigured`` changed
(aws-parallelcluster 3.16.1, pcluster/schemas/cluster_schema.py: ``UpdatePolicy.UNSUPPORTED``), and the bundle's
key changes with every change of a script or a parameter. So those two actions name the bundle through an SSM
parameter that holds its URI, and the entry script's own key depends only on its content (the stack's assets go to
one folder, not one per bundle). A new bundle then reaches the head and login nodes through ``OnNodeUpdated``
(updates allowed), which names it directly, and the compute nodes through their queue's ``OnNodeConfigured``,
which ParallelCluster applies by the queue update strategy.

Sources: ParallelCluster User Guide, "AWS CloudFormation custom resource", "Provider stack", "Cluster configuration
file" (HeadNode, LoginNodes, Scheduling, SharedStorage, Monitoring, CustomActions); rules/parallelcluster.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_ecr as ecr, aws_iam as iam, aws_s3_assets as s3_assets, aws_ssm as ssm
from constructs import Construct

from moe_cdk.constructs.hyperpod_nodes import lifecycle_bundle_asset
from moe_cdk.constructs.hyperpod_slurm_cluster import acknowledge_exporter_pulls, observability_statements
from moe_cdk.constructs.validation import is_unresolved, problem, raise_if_any
from moe_cdk.rules import parallelcluster as rules
from moe_cdk.rules.hyperpod_capacity import CapacityType
from moe_cdk.rules.parallelcluster import DeletionPolicy, OperatingSystem, QueueUpdateStrategy
from moe_cdk.rules.sagemaker import AccountingDatabase

__all__ = [
    "AccountingDatabase",
    "ParallelClusterCluster",
    "ParallelClusterProps",
    "ParallelClusterNodes",
    "ParallelClusterQueue",
    "CapacityType",
    "DeletionPolicy",
    "OperatingSystem",
    "QueueUpdateStrategy",
]

ENTRY_SCRIPT = "parallelcluster_entry.sh"
# ParallelCluster's capacity types (Scheduling/SlurmQueues/CapacityType).
_CAPACITY_TYPES = {
    CapacityType.ON_DEMAND: "ONDEMAND",
    CapacityType.SPOT: "SPOT",
    CapacityType.CAPACITY_BLOCK: "CAPACITY_BLOCK",
}


@dataclass(frozen=True, kw_only=True)
class ParallelClusterNodes:
    """The head node, or the login node pool."""

    name: str
    """The instance group's name: the login pool's name, and the group the lifecycle scripts are told. Required."""
    instance_type: str
    """EC2 instance type, e.g. ``m5.8xlarge``. Required."""
    count: int = 1
    """Nodes in the pool (the head node is one). Default: 1."""
    root_volume_gib: int = 500
    """Root volume size, in GiB. Default: 500."""
    custom_ami: str | None = None
    """An AMI built from ParallelCluster's. Default: ParallelCluster's official AMI for ``os``."""


@dataclass(frozen=True, kw_only=True)
class ParallelClusterQueue:
    """A Slurm queue of one compute resource, named after its instance group."""

    name: str
    """The queue's (and its partition's and compute resource's) name. Required."""
    instance_type: str
    """EC2 instance type, e.g. ``p5en.48xlarge``. Required."""
    max_count: int
    """Nodes the queue may have. Required."""
    min_count: int
    """Nodes kept running (static); the rest start when jobs wait. Required."""
    efa: bool
    """Give the nodes EFA interfaces. Required."""
    capacity: CapacityType = CapacityType.ON_DEMAND
    """On-Demand, Spot or a Capacity Block. Default: On-Demand."""
    capacity_reservation_id: str | None = None
    """The EC2 capacity reservation the nodes launch into. Required with a Capacity Block. Default: none."""
    root_volume_gib: int = 500
    """Root volume size, in GiB. Default: 500."""
    custom_ami: str | None = None
    """An AMI built from ParallelCluster's. Default: the cluster's."""


@dataclass(frozen=True, kw_only=True)
class ParallelClusterProps:
    cluster_name: str
    """The cluster's name; it cannot change, and must differ from the stack's. Required."""
    head_node: ParallelClusterNodes
    """The head node (slurmctld). Required."""
    queues: Sequence[ParallelClusterQueue]
    """One or more queues. Required."""
    subnet: ec2.ISubnet
    """The private subnet every node is in. Required."""
    security_group: ec2.ISecurityGroup
    """The nodes' EFA security group, which the file system's admits. Required."""
    file_system_id: str
    """The FSx for Lustre file system, mounted at /fsx on every node. Required."""
    lifecycle_scripts_directory: str
    """lifecycle_scripts/, with ``parallelcluster_entry.sh`` and ``on_create.sh``. Required."""
    lifecycle_parameters: dict
    """provisioning_parameters.json, shipped in the bundle. With its ``observability`` set, the nodes' policy lets
    them read the remote-write URL's parameter and pull HyperPod's exporter images; the caller grants
    ``aps:RemoteWrite`` on ``node_policy``. Required."""
    region: str
    """The Region, passed to the entry script. Required."""
    login_nodes: ParallelClusterNodes | None = None
    """A login node pool. Default: none."""
    image_repository: ecr.IRepository | None = None
    """The training image's repository, which the nodes pull from. Default: none."""
    version: str = rules.VERSION
    """The ParallelCluster release. Default: the pinned one."""
    service_token: str | None = None
    """An existing provider's ServiceToken. Default: AWS's provider stack, nested."""
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    """What deleting the resource does to the cluster. Default: Retain."""
    os: OperatingSystem = OperatingSystem.UBUNTU_2204
    """The official AMI's operating system. Default: ubuntu2204."""
    queue_update_strategy: QueueUpdateStrategy = QueueUpdateStrategy.DRAIN
    """How an update replaces a changed queue's nodes. Default: DRAIN."""
    ssh_key_name: str | None = None
    """An EC2 key pair for the head node. Default: none."""
    log_retention_days: int = 365
    """CloudWatch Logs retention of the node logs, in days. Default: 365."""
    accounting_database: AccountingDatabase | None = None
    """Slurm accounting in this external MySQL-compatible database (``SlurmSettings.Database``), which the head
    node's slurmdbd reaches at ``endpoint:port`` as ``user_name``, with the password the secret holds as plain text;
    ParallelCluster lets the head node read the secret. Needed for teams. Default: no accounting."""


def _problems(props: ParallelClusterProps, stack_name: str):
    if stack_name == props.cluster_name and not is_unresolved(stack_name):
        yield problem("must differ from the stack's name", got=props.cluster_name, allowed="another name").at(
            "cluster_name"
        )
    if p := rules.version_problem(props.version):
        yield p.at("version")
    if not props.queues:
        yield problem("needs at least one queue", got=[], allowed="one or more queues").at("queues")
    names = [q.name for q in props.queues] + ([props.login_nodes.name] if props.login_nodes else [])
    for i, name in enumerate(names):
        if p := rules.name_problem(name):
            yield p.at(f"queues[{i}].name" if i < len(props.queues) else "login_nodes.name")
    for i, q in enumerate(props.queues):
        if q.capacity is CapacityType.CAPACITY_BLOCK:
            if q.capacity_reservation_id is None:
                yield problem("a Capacity Block queue names its reservation", got=None, allowed="cr-...").at(
                    f"queues[{i}].capacity_reservation_id"
                )
            if q.min_count != q.max_count:
                yield problem("a Capacity Block's queue has min_count = max_count", got=q.min_count, allowed=str(
                    q.max_count
                )).at(f"queues[{i}].min_count")  # fmt: skip
        if not 0 <= q.min_count <= q.max_count:
            yield problem("out of range", got=q.min_count, allowed=f"0 to max_count ({q.max_count})").at(
                f"queues[{i}].min_count"
            )
    if props.accounting_database is not None:
        yield from (p.at("accounting_database") for p in rules.database_problems(props.accounting_database))
    if not (Path(props.lifecycle_scripts_directory) / ENTRY_SCRIPT).is_file():
        yield problem(f"has no {ENTRY_SCRIPT}", got=props.lifecycle_scripts_directory, allowed="lifecycle_scripts/").at(
            "lifecycle_scripts_directory"
        )


def _accounting(database: AccountingDatabase) -> dict:
    """``SlurmSettings`` for accounting in ``database``: ``Database`` (its URI is host:port, no scheme: its
    DatabaseUriValidator), and GPUs among the tracked resources (``AccountingStorageTRES=gres/gpu``, as HyperPod's
    accounting sets it: AWS's base-config setup_mariadb_accounting.sh), without which sacctmgr refuses the teams' GPU
    limits ("no TRES known by type gres/gpu") and sacct counts no GPU-hours."""
    return {
        "Database": {
            "Uri": f"{database.endpoint}:{database.port}",
            "UserName": database.user_name,
            "PasswordSecretArn": database.secret_arn,
            "DatabaseName": database.name,
        },
        "CustomSlurmSettings": [{"AccountingStorageTRES": "gres/gpu"}],
    }


class ParallelClusterCluster(Construct):
    """``Custom::PclusterCluster`` (``resource``) with its provider (``service_token``), the nodes' policy
    (``node_policy``), the lifecycle scripts and the parameter naming their bundle (``bundle_parameter``)."""

    def __init__(self, scope: Construct, id: str, props: ParallelClusterProps) -> None:
        super().__init__(scope, id)
        raise_if_any("ParallelClusterCluster", _problems(props, cdk.Stack.of(self).stack_name))
        bundle = lifecycle_bundle_asset(self, props.lifecycle_scripts_directory, props.lifecycle_parameters)
        entry = s3_assets.Asset(
            self, "LifecycleEntry", path=str(Path(props.lifecycle_scripts_directory) / ENTRY_SCRIPT)
        )
        bundle_parameter = f"/moe-cdk/{props.cluster_name}/lifecycle/bundle"
        self.bundle_parameter = ssm.StringParameter(
            self,
            "LifecycleBundleUri",
            parameter_name=bundle_parameter,
            string_value=bundle.s3_object_url,
            description=f"The lifecycle bundle the nodes of ParallelCluster cluster {props.cluster_name} run",
        )
        self.node_policy = self._node_policy(props, bundle, entry)
        self.service_token = props.service_token or self._provider(props)

        def run(bundle_reference: str, group: str) -> dict:
            return {"Script": entry.s3_object_url, "Args": [bundle_reference, props.region, group]}

        def action(group: str, *, updated: bool) -> dict:
            """A head or login node's actions: a stable OnNodeConfigured, and an OnNodeUpdated naming the bundle."""
            configured = {"OnNodeConfigured": run(bundle_parameter, group)}
            return {**configured, "OnNodeUpdated": run(bundle.s3_object_url, group)} if updated else configured

        policies = [{"Policy": self.node_policy.managed_policy_arn}]
        # ParallelCluster's own security groups, plus the nodes' EFA group, which the file system admits.
        networking = {"AdditionalSecurityGroups": [props.security_group.security_group_id]}
        head = props.head_node
        head_node = {
            "InstanceType": head.instance_type,
            "Networking": {"SubnetId": props.subnet.subnet_id, **networking},
            "LocalStorage": {"RootVolume": {"Size": head.root_volume_gib, "Encrypted": True}},
            "Iam": {"AdditionalIamPolicies": policies},
            "CustomActions": action(head.name, updated=True),
            "Imds": {"Secured": True},
        }
        if head.custom_ami:
            head_node["Image"] = {"CustomAmi": head.custom_ami}
        if props.ssh_key_name:
            head_node["Ssh"] = {"KeyName": props.ssh_key_name}
        config = {
            "Region": props.region,
            "Image": {"Os": props.os.value},
            "HeadNode": head_node,
            "Scheduling": {
                "Scheduler": "slurm",
                "SlurmSettings": {
                    "QueueUpdateStrategy": props.queue_update_strategy.value,
                    **(_accounting(props.accounting_database) if props.accounting_database else {}),
                },
                "SlurmQueues": [
                    self._queue(q, props, networking, policies, {"OnNodeConfigured": run(bundle.s3_object_url, q.name)})
                    for q in props.queues
                ],
            },
            "SharedStorage": [
                {
                    "Name": "fsx",
                    "MountDir": rules.MOUNT_DIR,
                    "StorageType": "FsxLustre",
                    "FsxLustreSettings": {"FileSystemId": props.file_system_id},
                }
            ],
            "Monitoring": {
                "Logs": {"CloudWatch": {"Enabled": True, "RetentionInDays": props.log_retention_days}},
                "Dashboards": {"CloudWatch": {"Enabled": True}},
            },
        }
        if props.login_nodes is not None:
            login = props.login_nodes
            config["LoginNodes"] = {
                "Pools": [
                    {
                        "Name": login.name,
                        "Count": login.count,
                        "InstanceType": login.instance_type,
                        "Networking": {"SubnetIds": [props.subnet.subnet_id], **networking},
                        "Iam": {"AdditionalIamPolicies": policies},
                        "CustomActions": action(login.name, updated=True),
                        # No Ssh.KeyName: ParallelCluster 3.15 and later refuse it on login nodes, which take the
                        # head node's.
                        **({"Image": {"CustomAmi": login.custom_ami}} if login.custom_ami else {}),
                    }
                ]
            }
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=self.service_token,
            resource_type=rules.RESOURCE_TYPE,
            properties={
                "ClusterName": props.cluster_name,
                "ClusterConfiguration": config,
                "DeletionPolicy": props.deletion_policy.value,
            },
        )
        self.resource.node.add_dependency(self.node_policy, self.bundle_parameter)

    def _queue(self, q: ParallelClusterQueue, props, networking: dict, policies: list, actions: dict) -> dict:
        resource = {
            "Name": q.name,
            "InstanceType": q.instance_type,
            "MinCount": q.min_count,
            "MaxCount": q.max_count,
            "Efa": {"Enabled": q.efa},
        }
        if q.capacity_reservation_id:
            resource["CapacityReservationTarget"] = {"CapacityReservationId": q.capacity_reservation_id}
        queue = {
            "Name": q.name,
            "CapacityType": _CAPACITY_TYPES[q.capacity],
            "Networking": {
                "SubnetIds": [props.subnet.subnet_id],
                **networking,
                # None with a targeted reservation, as AWS's reference cluster advises (awslabs/awsome-distributed-ai,
                # 1.architectures/2.aws-parallelcluster README); ParallelCluster warns about one on a Capacity Block
                # (PlacementGroupCapacityTypeValidator).
                "PlacementGroup": {"Enabled": q.efa and q.capacity_reservation_id is None},
            },
            "ComputeResources": [resource],
            "ComputeSettings": {
                "LocalStorage": {
                    "RootVolume": {"Size": q.root_volume_gib, "Encrypted": True},
                    # The instance NVMe, where enroot keeps images and containers (provisioning_parameters).
                    "EphemeralVolume": {"MountDir": rules.SCRATCH},
                }
            },
            "Iam": {"AdditionalIamPolicies": policies},
            "CustomActions": actions,
        }
        if q.custom_ami:
            queue["Image"] = {"CustomAmi": q.custom_ami}
        return queue

    def _provider(self, props: ParallelClusterProps) -> str:
        stack = cdk.Stack.of(self)
        provider = cdk.CfnStack(
            self,
            "Provider",
            template_url=rules.provider_template_url(stack.region, stack.url_suffix, props.version),
        )
        return provider.get_att("Outputs.ServiceToken").to_string()

    def _node_policy(self, props: ParallelClusterProps, bundle: s3_assets.Asset, entry: s3_assets.Asset):
        policy = iam.ManagedPolicy(
            self,
            "NodePolicy",
            # [PC-PROVIDER]: the provider attaches only policies whose names start with "parallelcluster".
            managed_policy_name=f"{rules.POLICY_PREFIX}-{props.cluster_name}-{props.region}-nodes",
            description=f"ParallelCluster nodes of {props.cluster_name}: the lifecycle bundle and the training image",
        )
        policy.add_statements(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[
                    bundle.bucket.arn_for_objects(bundle.s3_object_key),
                    entry.bucket.arn_for_objects(entry.s3_object_key),
                ],
            ),
            iam.PolicyStatement(actions=["ssm:GetParameter"], resources=[self.bundle_parameter.parameter_arn]),
        )
        observability = props.lifecycle_parameters.get("observability")
        if observability is not None:
            stack = cdk.Stack.of(self)
            policy.add_statements(*observability_statements(stack, observability["remote_write_url_parameter"]))
            acknowledge_exporter_pulls(stack, policy.node.default_child)
        if props.image_repository is not None:
            policy.add_statements(
                iam.PolicyStatement(
                    actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                    resources=[props.image_repository.repository_arn],
                )
            )
        if props.image_repository is not None or observability is not None:
            policy.add_statements(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))
            cdk.Validations.of(policy.node.default_child).acknowledge(
                cdk.Acknowledgment(
                    id="AwsSolutions-IAM5[Resource::*]",
                    reason="Only ecr:GetAuthorizationToken uses '*': it has no resource-level permissions (Service "
                    "Authorization Reference, Amazon ECR); the pulls are scoped to named repositories.",
                )
            )
        return policy
