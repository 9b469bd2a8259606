"""A SageMaker HyperPod cluster orchestrated by Slurm (native ``AWS::SageMaker::Cluster``).

The lifecycle scripts reach the nodes without a Lambda-backed custom resource: the folder
(plus the generated ``provisioning_parameters.json``) is a CDK file asset, and the stack
that holds the cluster publishes its file assets into the ``sagemaker-`` lifecycle bucket
(``lifecycle_synthesizer``), which is the only kind of bucket the managed
``AmazonSageMakerClusterInstanceRolePolicy`` can read. HyperPod downloads the asset folder
and runs a small generated entry script that unpacks the bundle and runs ``on_create.sh``.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_iam as iam, aws_s3 as s3, aws_s3_assets as s3_assets, aws_sagemaker as sagemaker
from constructs import Construct

from moe_cdk.constructs import instance_catalog
from moe_cdk.constructs.validation import is_unresolved, problem, raise_if_any

# SageMaker API reference, ClusterInstanceGroupSpecification.InstanceGroupName.
GROUP_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
# SageMaker API reference, ClusterLifeCycleConfig.SourceS3Uri: "Make sure that the S3 bucket
# path starts with s3://sagemaker-" (what the managed instance policy can read).
LIFECYCLE_BUCKET_PREFIX = "sagemaker-"
# SageMaker API reference, ClusterEbsVolumeConfig.VolumeSizeInGB: 1 to 16384.
EBS_RANGE_GIB = (1, 16384)
MANAGED_INSTANCE_POLICY = "AmazonSageMakerClusterInstanceRolePolicy"
ENTRY_SCRIPT = "on_create.sh"


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
class SlurmInstanceGroup:
    """One HyperPod instance group."""

    name: str
    """Instance group name: letters, digits and inner hyphens, at most 63 characters. Required."""
    node_type: NodeType
    """Controller, Login or Compute. Required."""
    instance_type: str
    """A catalog type, by its ``ml.`` or EC2 name. Required."""
    instance_count: int
    """Nodes in the group. Required."""
    partition: str | None = None
    """Slurm partition of a compute group. Default: the group name."""
    ebs_volume_size_gib: int = 500
    """Extra EBS volume per node, mounted by HyperPod at /opt/sagemaker, in GiB. Default: 500."""
    training_plan_arn: str | None = None
    """A SageMaker training plan that reserves this group's capacity. Default: on-demand."""

    @property
    def spec(self) -> instance_catalog.InstanceSpec | None:
        return instance_catalog.lookup(self.instance_type)

    @property
    def partition_name(self) -> str | None:
        return (self.partition or self.name) if self.node_type is NodeType.COMPUTE else None

    def features(self) -> list[str]:
        """Slurm node features: ``efa`` when the type has EFA, the instance family, the accelerator kind."""
        spec = self.spec
        if spec is None:
            return []
        kind = {"nvidia-gpu": "gpu", "trainium": "trainium", "none": "cpu"}[spec.accelerator_kind.value]
        return [*(["efa"] if spec.supports_efa else []), spec.ec2_name.split(".")[0], kind]


@dataclass(frozen=True, kw_only=True)
class AccountingDatabase:
    """An external MySQL-compatible database for slurmdbd (``Orchestrator.Slurm.AccountingDatabase``)."""

    endpoint: str
    """Database host name. Required."""
    secret_arn: str
    """Secrets Manager secret with the credentials. Required."""
    name: str = "slurm_acct_db"
    """Database name. Default: slurm_acct_db."""
    port: int = 3306
    """Database port. Default: 3306."""


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
    require_efa: bool = True
    """Reject compute groups without EFA. Default: True."""
    slurm_config_strategy: SlurmConfigStrategy = SlurmConfigStrategy.MANAGED
    """Who owns slurm.conf. Default: Managed."""
    accounting_database: AccountingDatabase | None = None
    """External accounting database. Default: none (no slurmdbd)."""


def _nag_text(stack: cdk.Stack, value: str) -> str:
    """``value`` as cdk-nag writes it in a finding id: pseudo parameters as ``<AWS::X>``."""
    resolved = stack.resolve(value)
    if isinstance(resolved, str):
        return resolved
    parts = resolved["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else f"<{p['Ref']}>" for p in parts)


def lifecycle_synthesizer(lifecycle_bucket_name: str, bundle_id: str) -> cdk.IStackSynthesizer:
    """The synthesizer for the stack that holds a HyperPodSlurmCluster: its file assets (the
    lifecycle bundle) go to ``s3://<lifecycle bucket>/lifecycle/<bundle_id>/`` with the
    deploying credentials, so that folder holds exactly one bundle."""
    return cdk.CliCredentialsStackSynthesizer(
        file_assets_bucket_name=lifecycle_bucket_name, bucket_prefix=f"lifecycle/{bundle_id}/",
    )


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
        "worker_groups": [
            {"instance_group_name": g.name, "partition_name": g.partition_name,
             "instance_type": g.spec.sagemaker_name if g.spec else g.instance_type, "features": g.features()}
            for g in by_type[NodeType.COMPUTE]
        ],
        "fsx_lustre": None if fsx is None else {
            "dns_name_parameter": fsx.dns_name_parameter, "mount_name_parameter": fsx.mount_name_parameter,
            "mount_point": fsx.mount_point,
        },
        "container_runtime": {"enroot_data_dir": "/opt/dlami/nvme/enroot", "pyxis": True},
    }


def lifecycle_bundle_id(lifecycle_scripts_directory: str, parameters: dict) -> str:
    """A content hash of the scripts and the provisioning parameters: the bundle's S3 folder name."""
    digest = hashlib.sha256(json.dumps(parameters, sort_keys=True).encode())
    for path in sorted(Path(lifecycle_scripts_directory).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(lifecycle_scripts_directory)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def group_problems(instance_groups: Sequence[SlurmInstanceGroup], *, require_efa: bool,
                   slurm: bool = True) -> list[tuple[str, str]]:
    """``(key, message)`` for instance groups HyperPod or the lifecycle scripts would reject.
    ``slurm=False`` drops the Slurm-only rules (controller and login groups)."""
    found: list[tuple[str, str]] = []
    groups = list(instance_groups)
    names = [g.name for g in groups]
    for i, g in enumerate(groups):
        key = f"instance_groups[{i}]"
        if not GROUP_NAME.match(g.name):
            found.append((f"{key}.name", problem("not a valid instance group name", got=g.name,
                                                 allowed="letters, digits and inner hyphens, 1 to 63 characters")))
        if g.name in names[:i]:
            found.append((f"{key}.name", problem("duplicate group name", got=g.name, allowed="unique names")))
        if g.spec is None:
            found.append((f"{key}.instance_type", instance_catalog.unknown_instance_type_message(g.instance_type)))
        elif require_efa and g.node_type is NodeType.COMPUTE and not g.spec.supports_efa:
            found.append((f"{key}.instance_type", problem("has no EFA, and EFA is required", got=g.instance_type,
                                                          allowed="an EFA-capable type, e.g. ml.p5en.48xlarge")))
        if g.instance_count < 1:
            found.append((f"{key}.instance_count", problem("must be at least 1", got=g.instance_count, allowed="1 or more")))
        if g.partition is not None and g.node_type is not NodeType.COMPUTE:
            found.append((f"{key}.partition", problem("only compute groups have a partition", got=g.partition, allowed="None")))
        if g.partition_name is not None and not GROUP_NAME.match(g.partition_name):
            found.append((f"{key}.partition", problem("not a valid partition name", got=g.partition_name,
                                                      allowed="letters, digits and inner hyphens")))
        low, high = EBS_RANGE_GIB
        if not low <= g.ebs_volume_size_gib <= high:
            found.append((f"{key}.ebs_volume_size_gib", problem("out of range", got=g.ebs_volume_size_gib,
                                                                allowed=f"{low} to {high} GiB")))
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


class HyperPodSlurmCluster(Construct):
    """A HyperPod Slurm cluster with automatic node recovery, deep health checks on accelerator
    groups, one thread per core on GPU groups, and lifecycle scripts that mount the shared
    file system, configure enroot/pyxis on NVMe and set Slurm node features."""

    def __init__(self, scope: Construct, id: str, props: HyperPodSlurmClusterProps) -> None:
        super().__init__(scope, id)
        raise_if_any("HyperPodSlurmCluster", self._problems(props))
        self.props = props
        stack = cdk.Stack.of(self)

        self.role = iam.Role(
            self, "ExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(MANAGED_INSTANCE_POLICY)],
            description=f"HyperPod nodes of {props.cluster_name}",
        )
        self._grant_vpc_access(props)
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
        bundle = self._stage_bundle(props.lifecycle_scripts_directory, self.provisioning_parameters)
        self.lifecycle_bundle = s3_assets.Asset(self, "LifecycleBundle", path=str(bundle))
        entry = self._stage_entry_script(self.lifecycle_bundle.asset_hash)
        self.lifecycle_entry = s3_assets.Asset(self, "LifecycleEntry", path=str(entry))
        # No grant needed: the managed instance policy reads sagemaker-* buckets, which the
        # lifecycle bucket is (checked below).
        self._check_lifecycle_bucket(self.lifecycle_bundle.s3_bucket_name)
        prefix = self.lifecycle_entry.s3_object_key[: -len(self.lifecycle_entry.asset_hash) - 3]
        life_cycle = sagemaker.CfnCluster.ClusterLifeCycleConfigProperty(
            source_s3_uri=f"s3://{self.lifecycle_entry.s3_bucket_name}/{prefix}",
            on_create=f"{self.lifecycle_entry.asset_hash}.sh",
        )

        orchestrator_slurm = sagemaker.CfnCluster.ClusterOrchestratorSlurmConfigProperty(
            slurm_config_strategy=props.slurm_config_strategy.value,
            accounting_database=None if props.accounting_database is None else {
                "endpoint": props.accounting_database.endpoint, "secretArn": props.accounting_database.secret_arn,
                "name": props.accounting_database.name, "port": props.accounting_database.port,
            },
        )
        self._resource = sagemaker.CfnCluster(
            self, "Resource",
            cluster_name=props.cluster_name,
            node_recovery="Automatic",
            orchestrator=sagemaker.CfnCluster.OrchestratorProperty(slurm=orchestrator_slurm),
            vpc_config=sagemaker.CfnCluster.VpcConfigProperty(
                security_group_ids=[props.security_group.security_group_id], subnets=[props.subnet.subnet_id],
            ),
            instance_groups=[self._instance_group(g, life_cycle) for g in props.instance_groups],
        )
        self._resource.node.add_dependency(self.role)
        self._acknowledge_findings()
        self.cluster_arn: str = self._resource.attr_cluster_arn
        self.cluster_name = props.cluster_name

    def _instance_group(self, g: SlurmInstanceGroup, life_cycle) -> sagemaker.CfnCluster.ClusterInstanceGroupProperty:
        spec = g.spec
        accelerated = spec is not None and spec.is_accelerated
        return sagemaker.CfnCluster.ClusterInstanceGroupProperty(
            instance_group_name=g.name,
            instance_type=spec.sagemaker_name,
            instance_count=g.instance_count,
            execution_role=self.role.role_arn,
            life_cycle_config=life_cycle,
            # One thread per core on GPU groups: the trainer pins one process per GPU and
            # hyper-threads add noise to its data loading (HyperPod ThreadsPerCore).
            threads_per_core=1 if spec.accelerator_kind is instance_catalog.AcceleratorKind.NVIDIA_GPU else None,
            on_start_deep_health_checks=["InstanceStress", "InstanceConnectivity"] if accelerated else None,
            instance_storage_configs=[sagemaker.CfnCluster.ClusterInstanceStorageConfigProperty(
                ebs_volume_config=sagemaker.CfnCluster.ClusterEbsVolumeConfigProperty(volume_size_in_gb=g.ebs_volume_size_gib),
            )],
            slurm_config=sagemaker.CfnCluster.ClusterSlurmConfigProperty(
                node_type=g.node_type.value,
                partition_names=[g.partition_name] if g.partition_name else None,
            ),
            training_plan_arn=g.training_plan_arn,
        )

    def _grant_vpc_access(self, props: HyperPodSlurmClusterProps) -> None:
        # SageMaker Developer Guide, "IAM role for SageMaker HyperPod": a cluster in a custom
        # VPC needs these to attach its nodes' network interfaces. Creation is scoped to the
        # cluster's subnet and security group; EC2's Describe* calls take no resource ARN.
        stack = cdk.Stack.of(self)
        self._eni_arn = stack.format_arn(service="ec2", resource="network-interface", resource_name="*")
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
                     "ec2:DeleteNetworkInterfacePermission", "ec2:DetachNetworkInterface",
                     "ec2:ModifyNetworkInterfaceAttribute", "ec2:CreateTags"],
            resources=[
                stack.format_arn(service="ec2", resource="subnet", resource_name=props.subnet.subnet_id),
                stack.format_arn(service="ec2", resource="security-group", resource_name=props.security_group.security_group_id),
                self._eni_arn,
            ],
        ))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                     "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"],
            resources=["*"],
        ))

    def _acknowledge_findings(self) -> None:
        """The cdk-nag findings this construct accepts, each on the one resource it concerns."""
        stack = cdk.Stack.of(self)
        cdk.Validations.of(self.role.node.default_child).acknowledge(cdk.Acknowledgment(
            id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{MANAGED_INSTANCE_POLICY}]",
            reason="AWS requires this managed policy on HyperPod execution roles: it lets the HyperPod agents on "
                   "each node report health and read the sagemaker-* lifecycle bucket (SageMaker Developer Guide, "
                   "'IAM role for SageMaker HyperPod').",
        ))
        policy = self.role.node.find_child("DefaultPolicy").node.default_child
        cdk.Validations.of(policy).acknowledge(
            cdk.Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="Only ec2:Describe* (network interfaces, VPCs, DHCP options, subnets, security groups) use '*': "
                       "EC2 Describe actions do not support resource-level permissions.",
            ),
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{_nag_text(stack, self._eni_arn)}]",
                reason="Network interfaces HyperPod creates for the nodes have no ARN before they exist; creation is "
                       "also scoped to the cluster's one subnet and security group in the same statement.",
            ),
        )

    @staticmethod
    def _stage_bundle(directory: str, parameters: dict) -> Path:
        staging = Path(tempfile.mkdtemp(prefix="moe-cdk-lifecycle-"))
        shutil.copytree(directory, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (staging / "provisioning_parameters.json").write_text(json.dumps(parameters, indent=2) + "\n")
        return staging

    @staticmethod
    def _stage_entry_script(bundle_hash: str) -> Path:
        # Assets keep no file names, so HyperPod's OnCreate is this generated script, which
        # unpacks the bundle published beside it and runs the real entry point.
        path = Path(tempfile.mkdtemp(prefix="moe-cdk-entry-")) / "entry.sh"
        path.write_text(f"""#!/usr/bin/env bash
# Generated by moe-cdk: unpack the lifecycle bundle published beside this script, then run {ENTRY_SCRIPT}.
set -euo pipefail
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
target="${{MOE_LC_TARGET:-/opt/moe-cdk/lifecycle}}"
rm -rf "$target"
mkdir -p "$target"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$here/{bundle_hash}.zip" "$target"
exec bash "$target/{ENTRY_SCRIPT}"
""")
        return path

    def _check_lifecycle_bucket(self, bucket_name: str) -> None:
        resolved = cdk.Stack.of(self).resolve(bucket_name)
        name = resolved.get("Fn::Sub") if isinstance(resolved, dict) else resolved
        if isinstance(name, str) and not name.startswith(LIFECYCLE_BUCKET_PREFIX):
            raise_if_any("HyperPodSlurmCluster", ["lifecycle_scripts_directory: " + problem(
                "is published to the stack's file-asset bucket, which HyperPod nodes can only read if its name starts "
                "with 'sagemaker-'; give the stack lifecycle_synthesizer(...)",
                got=name, allowed="a stack synthesizer whose file-asset bucket starts with sagemaker-")])

    @staticmethod
    def _problems(props: HyperPodSlurmClusterProps) -> list[str]:
        found = [f"{key}: {message}" for key, message in group_problems(props.instance_groups, require_efa=props.require_efa)]
        if not (Path(props.lifecycle_scripts_directory) / ENTRY_SCRIPT).is_file():
            found.append("lifecycle_scripts_directory: " + problem(f"has no {ENTRY_SCRIPT}",
                                                                   got=props.lifecycle_scripts_directory, allowed="the lifecycle_scripts folder"))
        fsx, zone = props.fsx, props.subnet.availability_zone
        if fsx is not None and fsx.efa_enabled and not is_unresolved(zone) and fsx.availability_zone != zone:
            found.append("fsx.availability_zone: " + problem("an EFA-enabled file system must be in the cluster's zone",
                                                             got=fsx.availability_zone, allowed=zone))
        return found
