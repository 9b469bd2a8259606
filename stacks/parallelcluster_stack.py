"""An AWS ParallelCluster Slurm cluster, wired to the network and storage stacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from moe_cdk.constructs.hyperpod_nodes import lifecycle_synthesizer
from moe_cdk.constructs.hyperpod_slurm_cluster import provisioning_parameters
from moe_cdk.constructs.parallelcluster_cluster import (
    ParallelClusterCluster,
    ParallelClusterNodes,
    ParallelClusterProps,
    ParallelClusterQueue,
)
from moe_cdk.core import catalog
from moe_cdk.schema.config import Config, InstanceGroupConfig, NodeRole
from moe_cdk.stacks._shared import (
    add_slurm_observability,
    fsx_mount,
    lifecycle_bucket_name,
    lifecycle_scripts,
    node_observability,
)

if TYPE_CHECKING:  # the stacks are passed in; a stack module imports no other
    from moe_cdk.stacks.network_stack import NetworkStack
    from moe_cdk.stacks.storage_stack import StorageStack


def _ec2_name(group: InstanceGroupConfig) -> str:
    return catalog.lookup(group.instance_type).ec2_name


def _nodes(group: InstanceGroupConfig) -> ParallelClusterNodes:
    return ParallelClusterNodes(
        name=group.name,
        instance_type=_ec2_name(group),
        count=group.instance_count,
        root_volume_gib=group.ebs_volume_size_gib,
        custom_ami=group.image_id,
    )


def _queue(group: InstanceGroupConfig) -> ParallelClusterQueue:
    return ParallelClusterQueue(
        name=group.name,
        instance_type=_ec2_name(group),
        max_count=group.instance_count,
        min_count=group.instance_count if group.min_instance_count is None else group.min_instance_count,
        efa=catalog.lookup(group.instance_type).supports_efa,
        capacity=group.capacity,
        capacity_reservation_id=group.capacity_reservation_id,
        root_volume_gib=group.ebs_volume_size_gib,
        custom_ami=group.image_id,
    )


class ParallelClusterStack(Stack):
    """ParallelClusterCluster from ``config.cluster`` and ``config.parallelcluster``. Its file assets (the lifecycle
    bundle and the entry script) are published into the storage stack's lifecycle bucket, under
    ``lifecycle/parallelcluster/``."""

    def __init__(
        self, scope: Construct, id: str, *, config: Config, network: NetworkStack, storage: StorageStack, **kwargs
    ) -> None:
        groups = config.cluster.instance_groups
        parameters = provisioning_parameters(
            instance_groups=[g.to_props() for g in groups],
            region=config.region,
            fsx=fsx_mount(config, storage),
            observability=node_observability(config),
            teams=config.teams,
            parallelcluster=True,
        )
        # One folder for every version of the assets: the entry script's key then changes only with its content,
        # which the head and login nodes' OnNodeConfigured names (constructs/parallelcluster_cluster.py).
        synthesizer = lifecycle_synthesizer(lifecycle_bucket_name(config), "parallelcluster")
        super().__init__(scope, id, synthesizer=synthesizer, **kwargs)
        self.add_stack_dependency(storage)
        login = [g for g in groups if g.role is NodeRole.LOGIN]
        settings = config.parallelcluster
        self.cluster = ParallelClusterCluster(
            self,
            "Cluster",
            ParallelClusterProps(
                cluster_name=config.name,
                head_node=_nodes(next(g for g in groups if g.role is NodeRole.CONTROLLER)),
                login_nodes=_nodes(login[0]) if login else None,
                queues=[_queue(g) for g in groups if g.role is NodeRole.COMPUTE],
                subnet=network.network.subnet_in(config.cluster.availability_zone),
                security_group=network.node_security_group.security_group,
                file_system_id=storage.lustre.file_system_id,
                lifecycle_scripts_directory=str(lifecycle_scripts()),
                lifecycle_parameters=parameters,
                region=config.region,
                image_repository=storage.training_image.asset.repository,
                version=settings.version,
                service_token=settings.service_token,
                deletion_policy=settings.deletion_policy,
                os=settings.os,
                queue_update_strategy=settings.queue_update_strategy,
                ssh_key_name=settings.ssh_key_name,
                log_retention_days=settings.log_retention_days,
                accounting_database=config.cluster.accounting_database,
            ),
        )
        self.observability = None
        if config.observability.enabled:
            self.observability, remote_write = add_slurm_observability(self, config)
            self.cluster.node_policy.add_statements(self.observability.remote_write_statement())
            self.cluster.resource.node.add_dependency(remote_write)
        CfnOutput(self, "ClusterName", value=config.name)
        CfnOutput(self, "HeadNodePrivateIp", value=self.cluster.resource.get_att_string("headNode.privateIpAddress"))
