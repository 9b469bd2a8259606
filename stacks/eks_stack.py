"""The EKS control plane for HyperPod, its software, the FSx volume, and observability."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from moe_cdk.constructs.lustre_volume import LustreVolume, LustreVolumeProps
from moe_cdk.constructs.training_eks_cluster import TrainingEksCluster, TrainingEksClusterProps
from moe_cdk.rules import eks as eks_rules
from moe_cdk.schema.config import Config
from moe_cdk.stacks._shared import add_observability

if TYPE_CHECKING:  # the stacks are passed in; a stack module imports no other
    from moe_cdk.stacks.network_stack import NetworkStack
    from moe_cdk.stacks.storage_stack import StorageStack


class EksStack(Stack):
    """``TrainingEksCluster`` from ``config.eks``, the Lustre file system as a PersistentVolumeClaim,
    and (``observability.enabled``) Managed Prometheus with its scraper and Managed Grafana."""

    def __init__(
        self, scope: Construct, id: str, *, config: Config, network: NetworkStack, storage: StorageStack, **kwargs
    ) -> None:
        super().__init__(scope, id, **kwargs)
        eks_config = config.eks
        zones = [config.cluster.availability_zone, eks_config.second_availability_zone]
        subnets = [network.network.subnet_in(zone) for zone in zones]
        self.training_cluster = TrainingEksCluster(
            self,
            "Eks",
            TrainingEksClusterProps(
                cluster_name=config.name,
                vpc=network.network.vpc,
                subnets=subnets,
                node_security_group=network.node_security_group.security_group,
                # A node launched as a fallback type needs its device plugins as much as one of the first choice.
                instance_types=sorted(
                    {t for g in config.cluster.instance_groups for t in (g.instance_type, *g.fallback_instance_types)}
                ),
                neuron_resource=eks_rules.neuron_resource(teams=config.teams is not None),
                node_tolerations=[t.toleration() for g in config.cluster.instance_groups for t in g.taints],
                kubernetes_version=eks_config.kubernetes_version,
                endpoint_access=eks_config.endpoint_access,
                public_access_cidrs=eks_config.public_access_cidrs,
                admin_role_arns=eks_config.admin_role_arns,
                addon_versions=eks_rules.serving_addon_versions(eks_config.addon_versions)
                if config.serving is not None
                else eks_config.addon_versions,
                container_insights=eks_config.container_insights,
                hyperpod_chart_directory=str(eks_config.hyperpod_chart_path),
            ),
        )
        cluster = self.training_cluster.cluster
        lustre = storage.lustre
        self.volume = LustreVolume(
            self,
            "LustreVolume",
            LustreVolumeProps(
                cluster=cluster,
                file_system_id=lustre.file_system_id,
                dns_name=lustre.dns_name,
                mount_name=lustre.mount_name,
                storage_capacity_gib=config.storage.lustre.storage_capacity_gib,
                namespace=eks_config.namespace,
            ),
        )
        # The driver must exist before a pod can mount the volume; the claim itself only needs the API.
        self.volume.node.add_dependency(self.training_cluster.addons["aws-fsx-csi-driver"])
        # Each team's claim is in the cluster stack, after task governance creates the team's namespace
        # (stacks/hyperpod_eks_stack.py).
        CfnOutput(self, "EksClusterName", value=cluster.cluster_name)
        CfnOutput(self, "EksClusterArn", value=cluster.cluster_arn)
        CfnOutput(
            self,
            "KubeconfigCommand",
            value=f"aws eks update-kubeconfig --region {config.region} --name {cluster.cluster_name}",
        )
        CfnOutput(self, "FsxClaim", value=f"{self.volume.namespace}/{self.volume.claim_name}")
        self.observability = None
        if config.observability.enabled:
            self.observability = add_observability(
                self,
                config,
                cluster_arn=cluster.cluster_arn,
                subnets=subnets,
                security_group=network.node_security_group.security_group,
            )
