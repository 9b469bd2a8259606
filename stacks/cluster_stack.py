"""The HyperPod Slurm cluster, wired to the network and storage stacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from moe_cdk.constructs.hyperpod_slurm_cluster import (
    FsxMount,
    HyperPodSlurmCluster,
    HyperPodSlurmClusterProps,
    provisioning_parameters,
)
from moe_cdk.schema.config import Config
from moe_cdk.stacks._shared import fsx_parameter_names, hyperpod_synthesizer, lifecycle_scripts

if TYPE_CHECKING:  # the stacks are passed in; a stack module imports no other
    from moe_cdk.stacks.network_stack import NetworkStack
    from moe_cdk.stacks.storage_stack import StorageStack


def _fsx_mount(config: Config, storage: StorageStack) -> FsxMount:
    dns_parameter, mount_parameter = fsx_parameter_names(config)
    return FsxMount(
        file_system_id=storage.lustre.file_system_id,
        availability_zone=config.lustre_availability_zone,
        efa_enabled=config.storage.lustre.efa_enabled,
        dns_name_parameter=dns_parameter,
        mount_name_parameter=mount_parameter,
    )


class SlurmClusterStack(Stack):
    """HyperPodSlurmCluster from ``config.cluster``. Its file assets (the lifecycle bundle) are
    published into the storage stack's ``sagemaker-`` lifecycle bucket, under a folder named
    after the bundle's content hash."""

    def __init__(
        self, scope: Construct, id: str, *, config: Config, network: NetworkStack, storage: StorageStack, **kwargs
    ) -> None:
        groups = [g.to_props() for g in config.cluster.instance_groups]
        fsx = _fsx_mount(config, storage)
        parameters = provisioning_parameters(instance_groups=groups, region=config.region, fsx=fsx)
        super().__init__(scope, id, synthesizer=hyperpod_synthesizer(config, parameters), **kwargs)
        # The lifecycle bucket must exist before this stack's assets are published into it.
        self.add_stack_dependency(storage)
        self.cluster = HyperPodSlurmCluster(
            self,
            "Cluster",
            HyperPodSlurmClusterProps(
                cluster_name=config.name,
                instance_groups=groups,
                subnet=network.network.subnet_in(config.cluster.availability_zone),
                security_group=network.node_security_group.security_group,
                lifecycle_scripts_directory=str(lifecycle_scripts()),
                region=config.region,
                fsx=fsx,
                image_repository=storage.training_image.asset.repository,
                require_efa=config.cluster.require_efa,
                node_provisioning_mode=config.cluster.node_provisioning_mode,
                slurm_config_strategy=config.cluster.construct_slurm_config_strategy,
                accounting_database=config.cluster.accounting_database,
            ),
        )
        CfnOutput(self, "ClusterArn", value=self.cluster.cluster_arn)
        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
