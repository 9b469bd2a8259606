"""The Lustre file system and its S3 data repository."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from moe_cdk.constructs.data_repository import DataRepository, DataRepositoryProps
from moe_cdk.constructs.efa_security_group import EfaSecurityGroup
from moe_cdk.constructs.lustre_storage import LustreStorage, LustreStorageProps
from moe_cdk.constructs.training_image import TrainingImage, TrainingImageProps
from moe_cdk.constructs.training_network import TrainingNetwork
from moe_cdk.stacks.config import Config

REPO_ROOT = Path(__file__).resolve().parent.parent


class StorageStack(Stack):
    """What training reads and writes: LustreStorage plus DataRepository, from ``config.storage``,
    open to the training nodes only, and the training image the orchestrators run."""

    def __init__(self, scope: Construct, id: str, *, config: Config, network: TrainingNetwork,
                 node_security_group: EfaSecurityGroup, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        lustre = config.storage.lustre
        self.lustre = LustreStorage(self, "Lustre", LustreStorageProps(
            vpc=network.vpc,
            availability_zone=config.lustre_availability_zone,
            client_security_group=node_security_group.security_group,
            storage_capacity_gib=lustre.storage_capacity_gib,
            per_unit_storage_throughput_mb_s_tib=lustre.per_unit_storage_throughput_mb_s_tib,
            efa_enabled=lustre.efa_enabled,
        ))
        repository = config.storage.data_repository
        self.data_repository = DataRepository(self, "DataRepository", DataRepositoryProps(
            file_system_id=self.lustre.file_system_id,
            associations=tuple(a.to_props() for a in repository.associations),
            bucket_name=repository.bucket_name,
        ))

        self.training_image = TrainingImage(self, "TrainingImage", TrainingImageProps(context_directory=str(REPO_ROOT)))

        CfnOutput(self, "FileSystemId", value=self.lustre.file_system_id)
        CfnOutput(self, "FileSystemDnsName", value=self.lustre.dns_name)
        CfnOutput(self, "FileSystemMountName", value=self.lustre.mount_name)
        CfnOutput(self, "DataBucketName", value=self.data_repository.bucket.bucket_name)
        CfnOutput(self, "TrainingImageUri", value=self.training_image.image_uri)
