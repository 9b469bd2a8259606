"""What training reads and writes: the Lustre file system, its S3 data repository, the
HyperPod lifecycle bucket and the training image."""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import (
    Acknowledgment,
    CfnOutput,
    RemovalPolicy,
    Stack,
    Validations,
    aws_iam as iam,
    aws_s3 as s3,
    aws_ssm as ssm,
)
from constructs import Construct

from moe_cdk.constructs.data_repository import DataRepository, DataRepositoryProps
from moe_cdk.constructs.efa_security_group import EfaSecurityGroup
from moe_cdk.constructs.hyperpod_nodes import lifecycle_bucket_statements
from moe_cdk.constructs.lustre_storage import LustreStorage, LustreStorageProps
from moe_cdk.constructs.training_image import TrainingImage, TrainingImageProps
from moe_cdk.constructs.training_network import TrainingNetwork
from moe_cdk.core.names import project_root
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.rules.serving import default_tls_bucket_name
from moe_cdk.schema.config import Config
from moe_cdk.stacks._shared import data_bucket_name, fsx_parameter_names, lifecycle_bucket_name


class StorageStack(Stack):
    """LustreStorage plus DataRepository from ``config.storage``, open to the training nodes only;
    the ``sagemaker-`` bucket the HyperPod lifecycle scripts are published to; the training image."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: Config,
        network: TrainingNetwork,
        node_security_group: EfaSecurityGroup,
        **kwargs,
    ) -> None:
        super().__init__(scope, id, **kwargs)
        lustre = config.storage.lustre
        self.lustre = LustreStorage(
            self,
            "Lustre",
            LustreStorageProps(
                vpc=network.vpc,
                availability_zone=config.lustre_availability_zone,
                client_security_group=node_security_group.security_group,
                storage_capacity_gib=lustre.storage_capacity_gib,
                per_unit_storage_throughput_mb_s_tib=lustre.per_unit_storage_throughput_mb_s_tib,
                efa_enabled=lustre.efa_enabled,
                removal_policy=RemovalPolicy.RETAIN if lustre.retain_on_delete else RemovalPolicy.DESTROY,
            ),
        )
        repository = config.storage.data_repository
        # The buckets are retained and fixed-name, so after `cdk destroy` a new deployment adopts them
        # (storage.adopt_retained_buckets) rather than failing to create them again.
        adopt = config.storage.adopt_retained_buckets
        data_bucket = data_bucket_name(config).replace("${AWS::AccountId}", self.account)
        self.data_repository = DataRepository(
            self,
            "DataRepository",
            DataRepositoryProps(
                file_system_id=self.lustre.file_system_id,
                associations=repository.associations,
                bucket=s3.Bucket.from_bucket_name(self, "AdoptedDataBucket", data_bucket) if adopt else None,
                bucket_name=data_bucket,
            ),
        )
        # Written by CloudFormation from the construct's attributes, read by the lifecycle
        # scripts: the deploy-time names reach the nodes without a hand-made copy.
        dns_parameter, mount_parameter = fsx_parameter_names(config)
        self.fsx_parameters = (
            ssm.StringParameter(self, "FsxDnsName", parameter_name=dns_parameter, string_value=self.lustre.dns_name),
            ssm.StringParameter(
                self, "FsxMountName", parameter_name=mount_parameter, string_value=self.lustre.mount_name
            ),
        )
        # The lifecycle bucket's policy also lets only the CDK publisher write (lifecycle_bucket_statements).
        self.lifecycle_bucket = self._retained_bucket(
            "Lifecycle",
            lifecycle_bucket_name(config).replace("${AWS::AccountId}", self.account),
            adopt=adopt,
            versioned=True,
            statements=lambda bucket: lifecycle_bucket_statements(self, bucket),
        )
        self.tls_bucket = self._tls_bucket(config) if config.serving is not None else None
        # One image per configuration: the one its compute trains with (rules/neuron.py, training.stack).
        dockerfile = (
            "training/Dockerfile.neuron" if config.training_stack is TrainingStack.NXDT else "training/Dockerfile"
        )
        self.training_image = TrainingImage(
            self, "TrainingImage", TrainingImageProps(context_directory=str(project_root()), dockerfile=dockerfile)
        )

        CfnOutput(self, "FileSystemId", value=self.lustre.file_system_id)
        CfnOutput(self, "FileSystemDnsName", value=self.lustre.dns_name)
        CfnOutput(self, "FileSystemMountName", value=self.lustre.mount_name)
        # What `cdk destroy` keeps with the file system (docs/operations.md).
        CfnOutput(self, "FileSystemSecurityGroupId", value=self.lustre.security_group.security_group_id)
        CfnOutput(self, "FileSystemKeyId", value=self.lustre.kms_key.key_id)
        CfnOutput(self, "DataBucketName", value=self.data_repository.bucket.bucket_name)
        CfnOutput(self, "LifecycleBucketName", value=self.lifecycle_bucket.bucket_name)
        CfnOutput(self, "TrainingImageUri", value=self.training_image.image_uri)
        if self.tls_bucket is not None:
            CfnOutput(self, "TlsBucketName", value=self.tls_bucket.bucket_name)

    def _tls_bucket(self, config: Config) -> s3.IBucket:
        """The bucket the inference operator writes the endpoints' TLS certificates to: encrypted, TLS only, never
        public, logged, and kept on destroy like the other buckets (its name is fixed, so a new deployment adopts it
        with storage.adopt_retained_buckets). AWS's templates make it the same way (aws/sagemaker-hyperpod-cluster-
        setup, eks/cloudformation/tls-certificates-s3-bucket-template.yaml)."""
        name = config.serving.tls_bucket_name or default_tls_bucket_name(
            config.name, account=self.account, region=config.region
        )
        self.tls_bucket_name = name
        return self._retained_bucket("Tls", name, adopt=config.storage.adopt_retained_buckets)

    def _retained_bucket(
        self,
        id_prefix: str,
        name: str,
        *,
        adopt: bool,
        versioned: bool = False,
        statements: Callable[[s3.IBucket], list[iam.PolicyStatement]] = lambda _: [],
    ) -> s3.IBucket:
        """A bucket kept on destroy, under its fixed ``name``: encrypted, TLS only, never public, its access logged
        beside the data bucket's (prefix ``<id_prefix>-bucket/`` in lowercase), with ``statements`` in its policy.
        ``adopt``: the bucket an earlier deployment kept. Its policy went with the old stack, and a bucket adopted
        by name gets none from CDK, so this puts back what a new bucket has: TLS only and ``statements``."""
        if adopt:
            bucket = s3.Bucket.from_bucket_name(self, f"Adopted{id_prefix}Bucket", name)
            policy = s3.BucketPolicy(self, f"Adopted{id_prefix}BucketPolicy", bucket=bucket)
            policy.document.add_statements(_tls_only(bucket), *statements(bucket))
            Validations.of(policy.node.default_child).acknowledge(
                Acknowledgment(
                    id="AwsSolutions-S10",
                    reason="The policy's first statement denies every request without TLS to the bucket and its "
                    "objects. cdk-nag 3.0.2 builds its pattern for an adopted bucket from the Fn::Join that names it "
                    "(S3BucketSSLRequestsOnly: the object's text, '[object Object]'), so it matches only by chance: "
                    "for a deployment named moe, not moe-teams.",
                )
            )
            return bucket
        bucket = s3.Bucket(
            self,
            f"{id_prefix}Bucket",
            bucket_name=name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=versioned,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.data_repository.access_logs_bucket,
            server_access_logs_prefix=f"{id_prefix.lower()}-bucket/",
            removal_policy=RemovalPolicy.RETAIN,
        )
        for statement in statements(bucket):
            bucket.add_to_resource_policy(statement)
        return bucket


def _tls_only(bucket: s3.IBucket) -> iam.PolicyStatement:
    """What ``enforce_ssl`` adds to a bucket CDK creates: any request without TLS is denied."""
    return iam.PolicyStatement(
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=["s3:*"],
        resources=[bucket.bucket_arn, bucket.arn_for_objects("*")],
        conditions={"Bool": {"aws:SecureTransport": "false"}},
    )
