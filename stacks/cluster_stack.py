"""The HyperPod Slurm cluster, wired to the network and storage stacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from moe_cdk.constructs.hyperpod_slurm_cluster import (
    HyperPodSlurmCluster,
    HyperPodSlurmClusterProps,
    provisioning_parameters,
)
from moe_cdk.schema.config import Config
from moe_cdk.stacks._shared import (
    add_slurm_observability,
    fsx_mount,
    hyperpod_synthesizer,
    lifecycle_scripts,
    node_observability,
)

if TYPE_CHECKING:  # the stacks are passed in; a stack module imports no other
    from moe_cdk.stacks.network_stack import NetworkStack
    from moe_cdk.stacks.storage_stack import StorageStack


class SlurmClusterStack(Stack):
    """HyperPodSlurmCluster from ``config.cluster``. Its file assets (the lifecycle bundle) are
    published into the storage stack's ``sagemaker-`` lifecycle bucket, under a folder named
    after the bundle's content hash."""

    def __init__(
        self, scope: Construct, id: str, *, config: Config, network: NetworkStack, storage: StorageStack, **kwargs
    ) -> None:
        groups = [g.to_props() for g in config.cluster.instance_groups]
        fsx = fsx_mount(config, storage)
        observability = node_observability(config)
        parameters = provisioning_parameters(
            instance_groups=groups, region=config.region, fsx=fsx, observability=observability, teams=config.teams
        )
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
                observability=observability,
                teams=config.teams,
            ),
        )
        self.observability = None
        if observability is not None:
            self.observability, remote_write = add_slurm_observability(self, config)
            self.observability.grant_remote_write(self.cluster.role)
            self.cluster.node.add_dependency(remote_write)
        CfnOutput(self, "ClusterArn", value=self.cluster.cluster_arn)
        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
