"""What every HyperPod cluster needs, whoever orchestrates it: instance-group rules, the
nodes' execution role, and lifecycle scripts delivered without a Lambda custom resource.

The lifecycle folder (plus the generated ``provisioning_parameters.json``) is a CDK file
asset. The stack holding the cluster publishes its file assets into the ``sagemaker-``
lifecycle bucket (``lifecycle_synthesizer``), the only kind of bucket the managed
``AmazonSageMakerClusterInstanceRolePolicy`` can read. HyperPod downloads the asset folder
and runs a small generated entry script that unpacks the bundle and runs ``on_create.sh``.

``HyperPodSlurmCluster`` and ``HyperPodEksCluster`` build on these; this module has no
public construct of its own.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import (
    aws_ec2 as ec2,
    aws_iam as iam,
    aws_s3 as s3,
    aws_s3_assets as s3_assets,
    aws_sagemaker as sagemaker,
)
from constructs import Construct

from moe_cdk.constructs.nag import managed_policy_finding, nag_text
from moe_cdk.constructs.validation import Problem, problem, raise_if_any
from moe_cdk.core import catalog
from moe_cdk.rules.hyperpod_capacity import CapacityType
from moe_cdk.rules.sagemaker import HyperPodInstanceGroup

# SageMaker API reference, ClusterLifeCycleConfig.SourceS3Uri: "Make sure that the S3 bucket
# path starts with s3://sagemaker-" (what the managed instance policy can read).
LIFECYCLE_BUCKET_PREFIX = "sagemaker-"
MANAGED_INSTANCE_POLICY = "AmazonSageMakerClusterInstanceRolePolicy"
ENTRY_SCRIPT = "on_create.sh"
# The lifecycle bucket's folder for published bundles: lifecycle/<bundle id>/.
LIFECYCLE_PREFIX = "lifecycle/"
# Where a CDK app names a non-default bootstrap qualifier (DefaultStackSynthesizer reads it too).
BOOTSTRAP_QUALIFIER_CONTEXT = "@aws-cdk/core:bootstrapQualifier"


def _struct(api: object) -> object:
    """An API-shaped value (``{"PatchingStrategy": ...}``, as CloudFormation spells it too) as the jsii
    struct a CDK property takes, whose keys are camelCase."""
    if isinstance(api, dict):
        return {key[0].lower() + key[1:]: _struct(value) for key, value in api.items()}
    if isinstance(api, list):
        return [_struct(item) for item in api]
    return api


def instance_group_property(
    g: HyperPodInstanceGroup,
    *,
    role: iam.IRole,
    life_cycle: sagemaker.CfnCluster.ClusterLifeCycleConfigProperty,
    **orchestrator_fields,
) -> sagemaker.CfnCluster.ClusterInstanceGroupProperty:
    """One ``InstanceGroups`` entry: deep health checks on accelerator groups (unless turned off), one
    thread per core on GPU groups, the EBS volume; ``orchestrator_fields`` add
    ``slurm_config`` or ``kubernetes_config``."""
    spec = g.spec
    flexible = bool(g.fallback_instance_types)
    return sagemaker.CfnCluster.ClusterInstanceGroupProperty(
        instance_group_name=g.name,
        # InstanceType and InstanceRequirements are mutually exclusive (botocore's model); the list's
        # order is HyperPod's order of preference.
        instance_type=None if flexible else spec.sagemaker_name,
        instance_requirements=(
            sagemaker.CfnCluster.InstanceRequirementsProperty(instance_types=g.instance_types) if flexible else None
        ),
        capacity_requirements=(
            sagemaker.CfnCluster.ClusterCapacityRequirementsProperty(spot={})
            if g.capacity is CapacityType.SPOT
            else None
        ),
        # "Autoscaling on SageMaker HyperPod EKS": a scaled group starts at 0 nodes (Karpenter scales a
        # larger one down to 0); its instance_count is the NodePool's limit instead.
        instance_count=0 if g.autoscaled else g.instance_count,
        # Slurm, continuous provisioning: the group enters service once it has this many nodes, and rolls
        # back if it has not within 3 hours (botocore's ClusterInstanceGroupSpecification.MinInstanceCount).
        min_instance_count=g.min_instance_count,
        execution_role=role.role_arn,
        life_cycle_config=life_cycle,
        # One thread per core on GPU groups: the trainer pins one process per GPU and
        # hyper-threads add noise to its data loading (HyperPod ThreadsPerCore).
        threads_per_core=1 if spec.accelerator_kind is catalog.AcceleratorKind.NVIDIA_GPU else None,
        on_start_deep_health_checks=["InstanceStress", "InstanceConnectivity"] if g.runs_deep_health_checks else None,
        instance_storage_configs=[
            sagemaker.CfnCluster.ClusterInstanceStorageConfigProperty(
                ebs_volume_config=sagemaker.CfnCluster.ClusterEbsVolumeConfigProperty(
                    volume_size_in_gb=g.ebs_volume_size_gib
                ),
            )
        ],
        training_plan_arn=g.training_plan_arn,
        image_id=g.image_id,
        scheduled_update_config=_struct(g.scheduled_update.to_api()) if g.scheduled_update else None,
        auto_patch_config=_struct(g.auto_patch.to_api()) if g.auto_patch else None,
        **orchestrator_fields,
    )


DETACH_NETWORK_INTERFACE = "ec2:DetachNetworkInterface"


def network_interface_arn(scope: Construct) -> str:
    """Every network interface of the scope's account and region: the ones a SageMaker role creates have no
    ARN before they exist."""
    return cdk.Stack.of(scope).format_arn(service="ec2", resource="network-interface", resource_name="*")


def network_interface_resources(scope: Construct, *, subnet_id: str, security_group_id: str) -> list[str]:
    """The resources that scope a SageMaker role's network-interface actions to one subnet and one security
    group. Service Authorization Reference, Amazon EC2: CreateNetworkInterface is authorized against the
    interface, the subnet and the security group, so creating one elsewhere is refused; the
    NetworkInterfacePermission actions and DeleteNetworkInterface against the interface only."""
    stack = cdk.Stack.of(scope)
    return [
        stack.format_arn(service="ec2", resource="subnet", resource_name=subnet_id),
        stack.format_arn(service="ec2", resource="security-group", resource_name=security_group_id),
        network_interface_arn(stack),
    ]


def execution_role(
    scope: Construct,
    *,
    cluster_name: str,
    subnet: ec2.ISubnet,
    security_group: ec2.ISecurityGroup,
    unscoped_actions: Sequence[str] = (),
    instance_groups: Sequence[HyperPodInstanceGroup] = (),
) -> iam.Role:
    """The nodes' role: the managed instance policy, plus the network-interface permissions a
    cluster in a custom VPC needs, plus ``unscoped_actions`` (actions without resource-level
    permissions) on ``*``, plus reading the alarms the ``instance_groups``' AMI updates roll back
    on. Its three cdk-nag findings are acknowledged here."""
    stack = cdk.Stack.of(scope)
    role = iam.Role(
        scope,
        "ExecutionRole",
        assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(MANAGED_INSTANCE_POLICY)],
        description=f"HyperPod nodes of {cluster_name}",
    )
    # SageMaker Developer Guide, "IAM role for SageMaker HyperPod": a cluster in a custom VPC
    # needs these to attach its nodes' network interfaces. Creation is scoped to the cluster's
    # subnet and security group; EC2's Describe* calls take no resource ARN.
    # ec2:DetachNetworkInterface is authorized against the instance as well as the interface
    # (Service Authorization Reference, Amazon EC2), so scoped to subnet, security-group and
    # interface ARNs it was never allowed. AWS's HyperPod role template grants it on "*"
    # (aws-samples/awsome-distributed-training, 1.architectures/7.sagemaker-hyperpod-eks/
    # cfn-templates/nested-stacks/sagemaker-iam-role-stack.yaml at 98c1057), and so does this.
    eni_arn = network_interface_arn(stack)
    role.add_to_policy(
        iam.PolicyStatement(
            actions=[
                "ec2:CreateNetworkInterface",
                "ec2:CreateNetworkInterfacePermission",
                "ec2:DeleteNetworkInterface",
                "ec2:DeleteNetworkInterfacePermission",
                "ec2:ModifyNetworkInterfaceAttribute",
                "ec2:CreateTags",
            ],
            resources=network_interface_resources(
                stack, subnet_id=subnet.subnet_id, security_group_id=security_group.security_group_id
            ),
        )
    )
    unscoped = [
        "ec2:DescribeNetworkInterfaces",
        "ec2:DescribeVpcs",
        "ec2:DescribeDhcpOptions",
        "ec2:DescribeSubnets",
        "ec2:DescribeSecurityGroups",
        *unscoped_actions,
    ]
    role.add_to_policy(iam.PolicyStatement(actions=[*unscoped, DETACH_NETWORK_INTERFACE], resources=["*"]))
    # SageMaker Developer Guide, "Update your AMI version in your SageMaker HyperPod cluster": an update
    # with AutoRollbackConfiguration needs cloudwatch:DescribeAlarms, which takes alarm ARNs.
    alarms = sorted(
        {
            name
            for g in instance_groups
            for section in (g.scheduled_update, g.auto_patch)
            if section is not None and section.rolling is not None
            for name in section.rolling.rollback_alarms
        }
    )
    if alarms:
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:DescribeAlarms"],
                resources=[
                    stack.format_arn(
                        service="cloudwatch",
                        resource="alarm",
                        resource_name=name,
                        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                    )
                    for name in alarms
                ],
            )
        )
    cdk.Validations.of(role.node.default_child).acknowledge(
        cdk.Acknowledgment(
            id=managed_policy_finding(MANAGED_INSTANCE_POLICY),
            reason="AWS requires this managed policy on HyperPod execution roles: it lets the HyperPod agents on "
            "each node report health and read the sagemaker-* lifecycle bucket (SageMaker Developer Guide, "
            "'IAM role for SageMaker HyperPod').",
        )
    )
    cdk.Validations.of(role.node.find_child("DefaultPolicy").node.default_child).acknowledge(
        cdk.Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason=f"Only {', '.join(sorted(unscoped))} and {DETACH_NETWORK_INTERFACE} use '*'. The former do "
            "not support resource-level permissions; the latter is also authorized against the node's "
            "instance, which has no ARN before HyperPod launches it (Service Authorization Reference; "
            "AWS's HyperPod execution-role template grants it on '*' too).",
        ),
        cdk.Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::{nag_text(stack, eni_arn)}]",
            reason="Network interfaces HyperPod creates for the nodes have no ARN before they exist; creation is "
            "also scoped to the cluster's one subnet and security group in the same statement.",
        ),
    )
    return role


def lifecycle_synthesizer(lifecycle_bucket_name: str, bundle_id: str) -> cdk.IStackSynthesizer:
    """The synthesizer for the stack that holds a HyperPod cluster: its file assets (the
    lifecycle bundle, and the template) go to ``s3://<lifecycle bucket>/lifecycle/<bundle_id>/``,
    so that folder holds exactly one bundle. The CDK CLI uploads them as the bootstrap's
    file-publishing role and deploys as its deploy role, as for every other stack: the two
    principals ``lifecycle_bucket_statements`` names, so the bucket can refuse writes from anyone else."""
    return cdk.DefaultStackSynthesizer(
        file_assets_bucket_name=lifecycle_bucket_name,
        bucket_prefix=f"{LIFECYCLE_PREFIX}{bundle_id}/",
    )


def bootstrap_role_arn(scope: Construct, purpose: str) -> str:
    """The CDK bootstrap role ``cdk-<qualifier>-<purpose>-role-<account>-<region>`` of the scope's
    environment, as DefaultStackSynthesizer names it (``file-publishing``, ``deploy``), with the
    qualifier the synthesizer reads from the same context."""
    stack = cdk.Stack.of(scope)
    qualifier = scope.node.try_get_context(BOOTSTRAP_QUALIFIER_CONTEXT) or cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
    return stack.format_arn(
        service="iam",
        region="",
        resource="role",
        resource_name=f"cdk-{qualifier}-{purpose}-role-{stack.account}-{stack.region}",
    )


# Every object write that replaces, hides or re-labels a script a node runs as root: PutObject (also
# copies and multipart uploads), its ACL, tagging, retention and legal-hold variants, and
# DeleteObject* (delete markers, version deletes, tag deletes).
LIFECYCLE_OBJECT_WRITES = ("s3:PutObject*", "s3:DeleteObject*")


def lifecycle_bucket_statements(scope: Construct, bucket: s3.IBucket) -> list[iam.PolicyStatement]:
    """The lifecycle bucket's policy beyond TLS: only the CDK file-publishing role may write objects.

    AmazonSageMakerFullAccess and AmazonSageMakerFeatureStoreAccess allow s3:PutObject on any
    ``*sagemaker*`` bucket, so without the deny any notebook or Studio role in the account could
    replace the scripts the next HyperPod node runs as root. aws:PrincipalArn holds the role's ARN
    for its sessions too (IAM User Guide, "AWS global condition context keys"). The nodes keep
    reading through their managed instance policy; nothing else needs to write.

    The publishing role's own policy only covers the bootstrap bucket (bootstrap template,
    FilePublishingRoleDefaultPolicy), so this allows it what the CLI does here: find the bucket,
    read its encryption, list the key, upload. The deploy role reads the template CloudFormation is
    given by URL (bootstrap template, the deploy role's CliStagingBucket statement)."""
    publisher = bootstrap_role_arn(scope, "file-publishing")
    deployer = bootstrap_role_arn(scope, "deploy")
    published = bucket.arn_for_objects(f"{LIFECYCLE_PREFIX}*")
    return [
        iam.PolicyStatement(
            sid="OnlyTheCdkPublisherWritesObjects",
            effect=iam.Effect.DENY,
            principals=[iam.AnyPrincipal()],
            actions=list(LIFECYCLE_OBJECT_WRITES),
            resources=[bucket.arn_for_objects("*")],
            conditions={"ArnNotLike": {"aws:PrincipalArn": publisher}},
        ),
        iam.PolicyStatement(
            sid="CdkPublisherUploadsBundles",
            principals=[iam.ArnPrincipal(publisher)],
            actions=["s3:PutObject", "s3:AbortMultipartUpload"],
            resources=[published],
        ),
        iam.PolicyStatement(
            sid="CdkDeployerReadsTemplates",
            principals=[iam.ArnPrincipal(deployer)],
            actions=["s3:GetObject"],
            resources=[published],
        ),
        iam.PolicyStatement(
            sid="CdkRolesFindTheBucket",
            principals=[iam.ArnPrincipal(publisher), iam.ArnPrincipal(deployer)],
            actions=["s3:GetBucketLocation", "s3:GetEncryptionConfiguration", "s3:ListBucket"],
            resources=[bucket.bucket_arn],
        ),
    ]


def lifecycle_bundle_id(lifecycle_scripts_directory: str, parameters: dict) -> str:
    """A content hash of the scripts and the provisioning parameters: the bundle's S3 folder name."""
    digest = hashlib.sha256(json.dumps(parameters, sort_keys=True).encode())
    for path in sorted(Path(lifecycle_scripts_directory).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(lifecycle_scripts_directory)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def lifecycle_directory_problems(directory: str) -> list[Problem]:
    if (Path(directory) / ENTRY_SCRIPT).is_file():
        return []
    return [
        problem(f"has no {ENTRY_SCRIPT}", got=directory, allowed="the lifecycle_scripts folder").at(
            "lifecycle_scripts_directory"
        )
    ]


@dataclass(frozen=True)
class PublishedLifecycle:
    """The lifecycle bundle and entry-script assets, and the ``LifeCycleConfig`` that runs the entry script."""

    bundle: s3_assets.Asset
    entry: s3_assets.Asset
    config: sagemaker.CfnCluster.ClusterLifeCycleConfigProperty


def publish_lifecycle(
    scope: Construct, *, construct_name: str, directory: str, parameters: dict, after_hyperpod_setup: bool
) -> PublishedLifecycle:
    """Stage ``directory`` plus ``provisioning_parameters.json`` as one asset, with a generated
    entry script beside it. ``after_hyperpod_setup`` runs it as ``OnInitComplete``, after HyperPod's
    AMI-based configuration (Slurm only); otherwise as ``OnCreate``, which EKS requires."""
    # The Asset copies its source into the cloud assembly as it is constructed, so the staging folders go at once
    # (each synthesis used to leave two folders in the temporary directory).
    bundle = lifecycle_bundle_asset(scope, directory, parameters)
    with tempfile.TemporaryDirectory(prefix="moe-cdk-entry-") as staging:
        entry = s3_assets.Asset(
            scope, "LifecycleEntry", path=str(_stage_entry_script(bundle.asset_hash, Path(staging)))
        )
    # No grant needed: the managed instance policy reads sagemaker-* buckets, which the
    # lifecycle bucket is (checked here).
    resolved = cdk.Stack.of(scope).resolve(bundle.s3_bucket_name)
    name = resolved.get("Fn::Sub") if isinstance(resolved, dict) else resolved
    if isinstance(name, str) and not name.startswith(LIFECYCLE_BUCKET_PREFIX):
        raise_if_any(
            construct_name,
            [
                problem(
                    "is published to the stack's file-asset bucket, which HyperPod nodes can only read if its name "
                    "starts "
                    "with 'sagemaker-'; give the stack lifecycle_synthesizer(...)",
                    got=name,
                    allowed="a stack synthesizer whose file-asset bucket starts with sagemaker-",
                ).at("lifecycle_scripts_directory")
            ],
        )
    prefix = entry.s3_object_key[: -len(entry.asset_hash) - 3]
    script = f"{entry.asset_hash}.sh"
    return PublishedLifecycle(
        bundle,
        entry,
        sagemaker.CfnCluster.ClusterLifeCycleConfigProperty(
            source_s3_uri=f"s3://{entry.s3_bucket_name}/{prefix}",
            on_init_complete=script if after_hyperpod_setup else None,
            on_create=None if after_hyperpod_setup else script,
        ),
    )


def lifecycle_bundle_asset(scope: Construct, directory: str, parameters: dict) -> s3_assets.Asset:
    """``directory`` plus ``provisioning_parameters.json`` as one file asset (a zip), ``LifecycleBundle``."""
    with tempfile.TemporaryDirectory(prefix="moe-cdk-lifecycle-") as staging:
        return s3_assets.Asset(scope, "LifecycleBundle", path=str(_stage_bundle(directory, parameters, Path(staging))))


def _stage_bundle(directory: str, parameters: dict, staging: Path) -> Path:
    shutil.copytree(directory, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (staging / "provisioning_parameters.json").write_text(json.dumps(parameters, indent=2) + "\n")
    return staging


def _stage_entry_script(bundle_hash: str, staging: Path) -> Path:
    # Assets keep no file names, so HyperPod's OnCreate is this generated script, which
    # unpacks the bundle published beside it and runs the real entry point.
    path = staging / "entry.sh"
    path.write_text(f"""#!/usr/bin/env bash
# Generated by moe-cdk: unpack the lifecycle bundle published beside this script, then run {ENTRY_SCRIPT}.
set -euo pipefail
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
target="${{MOE_LC_TARGET:-/opt/moe-cdk/lifecycle}}"
rm -rf "$target"
mkdir -p "$target"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$here/{bundle_hash}.zip" "$target"
exec bash "$target/{ENTRY_SCRIPT}"
""")  # noqa: E501 (the script's own lines)
    return path
