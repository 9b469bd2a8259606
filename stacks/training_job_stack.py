"""What SageMaker Training Jobs need to run the trainer: an execution role scoped to the data,
checkpoint and output prefixes and the training image, in the training network."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aws_cdk as cdk
from aws_cdk import CfnOutput, ReferenceStrength, Stack, aws_iam as iam
from constructs import Construct

from moe_cdk.constructs.hyperpod_nodes import network_interface_arn, network_interface_resources
from moe_cdk.constructs.nag import nag_text
from moe_cdk.schema.config import Config
from moe_cdk.stacks._shared import data_bucket_name

if TYPE_CHECKING:  # the stacks are passed in; a stack module imports no other
    from moe_cdk.stacks.network_stack import NetworkStack
    from moe_cdk.stacks.storage_stack import StorageStack

# Prefixes of the data bucket a training job uses: the first two are the ones the file
# system's data repository associations link to /datasets and /checkpoints.
PREFIXES = {
    "datasets": (("s3:GetObject",), "the training data the job reads"),
    "checkpoints": (
        ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"),
        "checkpoints the trainer writes and resumes from, one folder per run",
    ),
    "training-jobs": (("s3:PutObject", "s3:AbortMultipartUpload"), "job output and TensorBoard logs SageMaker uploads"),
    "profiles": (("s3:GetObject",), "the trainer profile of each run, which moe-cdk sagemaker submit uploads"),
}


class TrainingJobStack(Stack):
    """The execution role and the outputs that ``moe-cdk sagemaker submit`` reads.

    Jobs run in the private subnet with the node security group, so they reach the Lustre file
    system (FileSystemDataSource input) as cluster nodes do. S3 permissions name the data
    bucket by its deterministic name, so this stack needs no export from the storage stack for them.
    """

    def __init__(
        self, scope: Construct, id: str, *, config: Config, network: NetworkStack, storage: StorageStack, **kwargs
    ) -> None:
        super().__init__(scope, id, **kwargs)
        bucket = data_bucket_name(config).replace("${AWS::AccountId}", cdk.Aws.ACCOUNT_ID)
        bucket_arn = f"arn:{cdk.Aws.PARTITION}:s3:::{bucket}"
        object_arns = {prefix: f"{bucket_arn}/{prefix}/*" for prefix in PREFIXES}
        log_group_arn = (
            f"arn:{cdk.Aws.PARTITION}:logs:{self.region}:{cdk.Aws.ACCOUNT_ID}:log-group:/aws/sagemaker/TrainingJobs:*"
        )
        self.role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"SageMaker training jobs of {config.name}",
        )
        for prefix, (actions, _) in PREFIXES.items():
            self.role.add_to_policy(iam.PolicyStatement(actions=list(actions), resources=[object_arns[prefix]]))
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=[bucket_arn])
        )
        storage.training_image.grant_pull(self.role)
        # SageMaker Developer Guide, "CreateTrainingJob API: Execution Role Permissions": logs
        # go to the /aws/sagemaker/TrainingJobs group, and a job in a VPC attaches network interfaces.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[log_group_arn],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}},
            )
        )
        # Outputs only repeat the network stack's values, so they read them weakly: an output of an
        # import would be an export chain (cfn-lint W6001) and blocks nothing. The role's network-interface
        # scope reads the same values, so it names the subnet and group that jobs are submitted with.
        subnet = network.network.subnet_in(config.cluster.availability_zone)
        subnet_id = Stack.consume_reference(subnet.subnet_id, ReferenceStrength.WEAK)
        security_group_id = Stack.consume_reference(
            network.node_security_group.security_group_id, ReferenceStrength.WEAK
        )
        # Creating the job's interfaces is scoped as the HyperPod role's is: to the one subnet and security
        # group jobs run in (SageMaker Developer Guide, "CreateTrainingJob API: Execution Role Permissions",
        # lists these, with the Describe calls below, for a job in a VPC).
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "ec2:CreateNetworkInterface",
                    "ec2:CreateNetworkInterfacePermission",
                    "ec2:DeleteNetworkInterface",
                    "ec2:DeleteNetworkInterfacePermission",
                ],
                resources=network_interface_resources(self, subnet_id=subnet_id, security_group_id=security_group_id),
            )
        )
        # These take no resource ARN (Service Authorization Reference), so they stay on "*".
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "ecr:GetAuthorizationToken",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeVpcs",
                    "ec2:DescribeDhcpOptions",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups",
                    "fsx:DescribeFileSystems",
                ],
                resources=["*"],
            )
        )
        self._acknowledge_findings(object_arns, log_group_arn)

        CfnOutput(self, "RoleArn", value=self.role.role_arn)
        CfnOutput(self, "SubnetIds", value=subnet_id)
        CfnOutput(self, "SecurityGroupIds", value=security_group_id)
        CfnOutput(self, "DataBucketName", value=bucket)
        CfnOutput(self, "FileSystemId", value=storage.lustre.file_system_id)
        CfnOutput(self, "FileSystemMountName", value=storage.lustre.mount_name)
        CfnOutput(self, "TrainingImageUri", value=storage.training_image.image_uri)

    def _acknowledge_findings(self, object_arns: dict[str, str], log_group_arn: str) -> None:
        """Each wildcard this role keeps, on its one policy, with the reason a reviewer needs."""
        policy = self.role.node.find_child("DefaultPolicy").node.default_child
        cdk.Validations.of(policy).acknowledge(
            cdk.Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason=(
                    "ecr:GetAuthorizationToken, EC2 Describe* and fsx:DescribeFileSystems take no resource ARN; "
                    "cloudwatch:PutMetricData is limited to SageMaker's training namespace by a condition."
                ),
            ),
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(self, network_interface_arn(self))}]",
                reason="A training job's network interfaces have no ARN before SageMaker creates them; creation is "
                "also scoped to the job's one subnet and security group in the same statement.",
            ),
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(self, log_group_arn)}]",
                reason="Each training job writes its own log streams in SageMaker's fixed log group.",
            ),
            *(
                cdk.Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::{nag_text(self, object_arns[prefix])}]",
                    reason=f"Objects under {prefix}/: {why}.",
                )
                for prefix, (_, why) in PREFIXES.items()
            ),
        )
