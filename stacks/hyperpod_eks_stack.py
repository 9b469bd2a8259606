"""The HyperPod cluster whose nodes join the EKS stack's cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from moe_cdk.constructs.hyperpod_eks_cluster import HyperPodEksCluster, HyperPodEksClusterProps, provisioning_parameters
from moe_cdk.rules import eks as eks_rules
from moe_cdk.schema.config import Config
from moe_cdk.stacks._shared import hyperpod_synthesizer, lifecycle_scripts

if TYPE_CHECKING:  # the stacks are passed in; a stack module imports no other
    from moe_cdk.stacks.eks_stack import EksStack
    from moe_cdk.stacks.network_stack import NetworkStack
    from moe_cdk.stacks.storage_stack import StorageStack


class HyperPodEksStack(Stack):
    """HyperPodEksCluster from ``config.cluster``. Like the Slurm stack, its file assets (the
    lifecycle bundle) go to the lifecycle bucket under the bundle's content hash; the EKS
    stack is separate so the kubectl layer and handlers do not land in that folder."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: Config,
        network: NetworkStack,
        storage: StorageStack,
        eks_stack: EksStack,
        **kwargs,
    ) -> None:
        groups = [g.to_eks_props() for g in config.cluster.instance_groups]
        parameters = provisioning_parameters(instance_groups=groups, region=config.region)
        super().__init__(scope, id, synthesizer=hyperpod_synthesizer(config, parameters), **kwargs)
        self.add_stack_dependency(storage)
        self.cluster = HyperPodEksCluster(
            self,
            "Cluster",
            HyperPodEksClusterProps(
                cluster_name=config.name,
                eks_cluster=eks_stack.training_cluster.cluster,
                instance_groups=groups,
                subnet=network.network.subnet_in(config.cluster.availability_zone),
                security_group=network.node_security_group.security_group,
                lifecycle_scripts_directory=str(lifecycle_scripts()),
                region=config.region,
                require_efa=config.cluster.require_efa,
                training_operator=config.eks.training_operator,
                training_operator_version=config.eks.addon_versions.get("amazon-sagemaker-hyperpod-training-operator"),
                task_governance_version=config.eks.addon_versions.get(eks_rules.TASK_GOVERNANCE.name),
                node_provisioning_mode=config.cluster.node_provisioning_mode,
                tiered_storage=config.cluster.tiered_storage,
                teams=config.teams,
            ),
        )
        # The nodes need the CNI, DNS and device plugins in place when they join.
        self.add_stack_dependency(eks_stack)
        CfnOutput(self, "ClusterArn", value=self.cluster.cluster_arn)
        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
