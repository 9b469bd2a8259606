"""The HyperPod cluster whose nodes join the EKS stack's cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from moe_cdk.constructs.hyperpod_eks_cluster import HyperPodEksCluster, HyperPodEksClusterProps, provisioning_parameters
from moe_cdk.constructs.hyperpod_inference import HyperPodInference, HyperPodInferenceProps
from moe_cdk.constructs.lustre_volume import LustreVolume, LustreVolumeProps
from moe_cdk.rules import eks as eks_rules
from moe_cdk.rules.teams import team_namespace
from moe_cdk.schema.config import Config
from moe_cdk.stacks._shared import data_bucket_name, hyperpod_synthesizer, lifecycle_scripts

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
        self.team_volumes = self._team_volumes(config, storage, eks_stack)
        self.inference = None
        if config.serving is not None:
            # After the HyperPod cluster: the add-on names it, and its controllers need the nodes.
            observability = eks_stack.observability
            self.inference = HyperPodInference(
                self,
                "Inference",
                HyperPodInferenceProps(
                    eks_cluster=eks_stack.training_cluster.cluster,
                    hyperpod_cluster_arn=self.cluster.cluster_arn,
                    execution_role_name=config.execution_role_name,
                    tls_bucket_name=storage.tls_bucket_name,
                    # This deployment's data bucket, or the one of the deployment that trained the models.
                    model_bucket_name=data_bucket_name(config, deployment=config.serving.models_from).replace(
                        "${AWS::AccountId}", self.account
                    ),
                    model_prefixes=config.serving.model_prefixes,
                    addon_versions=config.eks.addon_versions,
                    prometheus_workspace_arn=observability.workspace.attr_arn if observability else None,
                ),
            )
            self.inference.addon.node.add_dependency(self.cluster)
        CfnOutput(self, "ClusterArn", value=self.cluster.cluster_arn)
        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)

    def _team_volumes(self, config: Config, storage: StorageStack, eks_stack: EksStack) -> list[LustreVolume]:
        """The file system claimed in each team's namespace, where task governance runs the team's jobs: a team's
        volume is its own folder teams/<team> (constructs/lustre_volume.py). In AWS's order: the add-on, the
        scheduler configuration, the team's quota (which creates the namespace ``hyperpod-ns-<team>``), then the
        claim in it (aws/sagemaker-hyperpod-cli@011ca92, examples/end_to_end_walkthrough/00-getting-started/
        00-setup.md, "Configuration" then "Making FSx available to Task Governance namespaces")."""
        quotas = {q.node.id: q for q in self.cluster.team_quotas}
        lustre = storage.lustre
        volumes = []
        for team in config.teams.teams if config.teams else ():
            volume = LustreVolume(
                self,
                f"LustreVolume-{team.name}",
                LustreVolumeProps(
                    cluster=eks_stack.training_cluster.cluster,
                    file_system_id=lustre.file_system_id,
                    dns_name=lustre.dns_name,
                    mount_name=lustre.mount_name,
                    storage_capacity_gib=config.storage.lustre.storage_capacity_gib,
                    namespace=team_namespace(team.name),
                    team=team.name,
                ),
            )
            volume.node.add_dependency(eks_stack.training_cluster.addons["aws-fsx-csi-driver"])
            volume.node.add_dependency(quotas[f"Quota-{team.name}"])
            volumes.append(volume)
        return volumes
