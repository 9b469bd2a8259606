"""The Amazon EKS cluster that orchestrates a HyperPod cluster, with the software training needs.

``aws_eks_v2`` without Auto Mode and without node groups: HyperPod brings the nodes. The API
endpoint is private, or public only to the given CIDRs; every control-plane log type is on;
Kubernetes secrets are encrypted with a rotating KMS key. The EKS add-ons and the pinned Helm
charts of ``rules.eks`` are installed, with the device plugins scheduled only on the
instance types that have the device. cdk-nag's EKS rules do not look at ``aws_eks_v2``
clusters, so ``tests/test_training_eks_cluster.py`` asserts the same properties.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam, aws_kms as kms, aws_s3_assets as s3_assets
from aws_cdk.lambda_layer_kubectl_v33 import KubectlV33Layer
from constructs import Construct

from moe_cdk.constructs.nag import managed_policy_finding, nag_text
from moe_cdk.constructs.validation import Problem, problem, raise_if_any
from moe_cdk.core import catalog
from moe_cdk.rules import eks as eks_rules
from moe_cdk.rules.eks import (
    EndpointAccess,
    addon_version_problems,
    endpoint_problems,
    kubernetes_version_problem,
)

# The construct, its props, and the value types its props take: those are defined in rules/ with
# their checks, which the configuration applies too.
__all__ = [
    "TrainingEksCluster",
    "TrainingEksClusterProps",
    "EndpointAccess",
    "eks_addon",
    "pod_identity_role",
]


@dataclass(frozen=True, kw_only=True)
class TrainingEksClusterProps:
    cluster_name: str
    """EKS cluster name. Required."""
    vpc: ec2.IVpc
    """The training VPC. Required."""
    subnets: Sequence[ec2.ISubnet]
    """Private subnets for the control plane's network interfaces, in at least two zones. Required."""
    node_security_group: ec2.ISecurityGroup
    """The HyperPod nodes' security group; the control plane and the nodes may reach each other. Required."""
    instance_types: Sequence[str]
    """Every instance type the HyperPod groups use; the device plugins follow them. Required."""
    neuron_resource: str = eks_rules.NEURON_RESOURCE
    """The name the Neuron device plugin registers Trainium chips under, the one the jobs ask for:
    ``aws.amazon.com/neuron``, or ``aws.amazon.com/neurondevice`` where task governance's queues must count them
    (rules/eks.py, [NEURON-TEAMS]). Default: ``aws.amazon.com/neuron``."""
    node_tolerations: Sequence[Mapping[str, str]] = ()
    """Tolerations for the taints the HyperPod groups carry, added to every device plugin and exporter. Default:
    none."""
    kubernetes_version: str = eks_rules.DEFAULT_KUBERNETES_VERSION
    """A Kubernetes version HyperPod supports. Default: ``eks_rules.DEFAULT_KUBERNETES_VERSION``."""
    endpoint_access: EndpointAccess = EndpointAccess.PRIVATE
    """Private only, or also public to ``public_access_cidrs``. Default: private."""
    public_access_cidrs: Sequence[str] = ()
    """IPv4 ranges allowed to the public endpoint; required with PUBLIC_AND_PRIVATE. Default: none."""
    admin_role_arns: Sequence[str] = ()
    """IAM roles given cluster-admin access entries (the people who run kubectl). Default: none."""
    addon_versions: Mapping[str, str] = field(default_factory=dict)
    """Pinned versions by add-on name. Default: EKS's default version for the cluster version."""
    container_insights: bool = False
    """Install the CloudWatch Observability add-on (Container Insights). Default: False."""
    hyperpod_chart_directory: str
    """AWS's HyperPod dependencies chart, as ``make hyperpod-chart`` stages it. Required: HyperPod needs it on
    every cluster created through the APIs."""


class TrainingEksCluster(Construct):
    """An EKS control plane for HyperPod nodes, with its add-ons, device plugins and operators."""

    def __init__(self, scope: Construct, id: str, props: TrainingEksClusterProps) -> None:
        super().__init__(scope, id)
        raise_if_any("TrainingEksCluster", self._problems(props))
        self.props = props
        self.specs = [catalog.lookup(t) for t in props.instance_types]

        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            enable_key_rotation=True,
            description=f"Encrypts the Kubernetes secrets of {props.cluster_name}",
        )
        self.control_plane_security_group = ec2.SecurityGroup(
            self,
            "ControlPlaneSecurityGroup",
            vpc=props.vpc,
            allow_all_outbound=False,
            description=f"EKS control plane of {props.cluster_name}: HTTPS from the HyperPod nodes",
        )
        self._connect_nodes(props.node_security_group)
        endpoint = (
            eks.EndpointAccess.PRIVATE
            if props.endpoint_access is EndpointAccess.PRIVATE
            else eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*props.public_access_cidrs)
        )
        subnets = ec2.SubnetSelection(subnets=list(props.subnets))
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=props.cluster_name,
            version=eks.KubernetesVersion.of(props.kubernetes_version),
            vpc=props.vpc,
            vpc_subnets=[subnets],
            security_group=self.control_plane_security_group,
            endpoint_access=endpoint,
            # HyperPod provides the nodes: no Auto Mode, no node group.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            # vpc-cni, kube-proxy and CoreDNS come as managed add-ons below instead.
            bootstrap_self_managed_addons=False,
            cluster_logging=[
                eks.ClusterLoggingTypes.API,
                eks.ClusterLoggingTypes.AUDIT,
                eks.ClusterLoggingTypes.AUTHENTICATOR,
                eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
                eks.ClusterLoggingTypes.SCHEDULER,
            ],
            secrets_encryption_key=self.secrets_key,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=KubectlV33Layer(self, "KubectlLayer"), private_subnets=list(props.subnets)
            ),
        )
        for i, arn in enumerate(props.admin_role_arns):
            self.cluster.grant_access(
                f"Admin{i}",
                arn,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )

        self._acknowledge_findings()
        self.addons = {a.name: self._addon(a) for a in eks_rules.ADDONS}
        if props.container_insights:
            self.addons[eks_rules.CONTAINER_INSIGHTS.name] = self._container_insights()
        self.charts = self._charts()

    def _acknowledge_findings(self) -> None:
        """cdk-nag findings on the roles and functions aws_eks_v2 creates, each with its reason."""
        stack = cdk.Stack.of(self)
        cdk.Validations.of(self.cluster.role.node.default_child).acknowledge(
            cdk.Acknowledgment(
                id=managed_policy_finding("AmazonEKSClusterPolicy"),
                reason="The EKS service role policy AWS requires on every cluster role (Amazon EKS User Guide, "
                "'Amazon EKS cluster IAM role').",
            )
        )
        provider = self.cluster.node.find_child("KubectlProvider")
        handler = provider.node.find_child("Handler")
        framework = provider.node.find_child("Provider").node.find_child("framework-onEvent")
        lambda_reason = (
            "The AWS managed Lambda execution policy for CloudWatch Logs (and VPC network interfaces): the "
            "kubectl handler and its provider framework are aws-cdk-lib's own functions and run in the "
            "VPC to reach the private API endpoint."
        )
        for function in (handler, framework):
            cdk.Validations.of(function.role.node.default_child).acknowledge(
                cdk.Acknowledgment(
                    id=managed_policy_finding("service-role/AWSLambdaBasicExecutionRole"), reason=lambda_reason
                ),
                cdk.Acknowledgment(
                    id=managed_policy_finding("service-role/AWSLambdaVPCAccessExecutionRole"), reason=lambda_reason
                ),
            )
        has_ecr_public = stack.get_logical_id(handler.node.find_child("HasEcrPublic"))
        ecr_public = (
            '{"Fn::If":["%s",{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},'
            '":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}'
        ) % has_ecr_public
        pull_reason = "Read-only image pulls that aws_eks_v2 gives its kubectl handler for Helm charts stored in ECR."
        cdk.Validations.of(handler.role.node.default_child).acknowledge(
            cdk.Acknowledgment(id=managed_policy_finding("AmazonEC2ContainerRegistryReadOnly"), reason=pull_reason),
            cdk.Acknowledgment(id=f"AwsSolutions-IAM4[Policy::{ecr_public}]", reason=pull_reason),
        )
        cdk.Validations.of(handler.node.default_child).acknowledge(
            cdk.Acknowledgment(
                id="AwsSolutions-L1",
                reason="aws-cdk-lib pins the kubectl handler's runtime to the version its bundled code is tested with; "
                "it follows aws-cdk-lib upgrades.",
            )
        )
        handler_arn = stack.get_logical_id(handler.node.default_child)
        cdk.Validations.of(framework.role.node.find_child("DefaultPolicy").node.default_child).acknowledge(
            cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::<{handler_arn}.Arn>:*]",
                reason="The provider framework may invoke every version of the one kubectl handler function (its ARN "
                "followed by :*), nothing else.",
            )
        )

    def _connect_nodes(self, nodes: ec2.ISecurityGroup) -> None:
        # Nodes call the API server on 443; the control plane calls kubelets (10250) and
        # webhooks on the nodes, so it may reach them on any port.
        ec2.CfnSecurityGroupIngress(
            self,
            "NodesToControlPlane",
            group_id=self.control_plane_security_group.security_group_id,
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            source_security_group_id=nodes.security_group_id,
            description="Kubernetes API from the HyperPod nodes",
        )
        ec2.CfnSecurityGroupIngress(
            self,
            "ControlPlaneToNodes",
            group_id=nodes.security_group_id,
            ip_protocol="-1",
            source_security_group_id=self.control_plane_security_group.security_group_id,
            description="kubelet and webhooks from the EKS control plane",
        )
        ec2.CfnSecurityGroupEgress(
            self,
            "ControlPlaneEgress",
            group_id=self.control_plane_security_group.security_group_id,
            ip_protocol="-1",
            destination_security_group_id=nodes.security_group_id,
            description="kubelet and webhooks on the HyperPod nodes",
        )

    def _addon(self, addon: eks_rules.Addon, **extra) -> eks.CfnAddon:
        version = self.props.addon_versions.get(addon.name, addon.version)
        resource = eks_addon(self, self.cluster.cluster_name, addon, version, **extra)
        resource.node.add_dependency(self.cluster)
        return resource

    def _container_insights(self) -> eks.CfnAddon:
        # [CW]: the agent's service account gets CloudWatchAgentServerPolicy through Pod Identity.
        role = pod_identity_role(
            self,
            "ContainerInsightsRole",
            "CloudWatchAgentServerPolicy",
            reason="The policy AWS documents for the CloudWatch Observability add-on's agent; it "
            "writes metrics and logs only.",
        )
        addon = self._addon(
            eks_rules.CONTAINER_INSIGHTS,
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(role_arn=role.role_arn, service_account="cloudwatch-agent")
            ],
        )
        addon.node.add_dependency(self.addons["eks-pod-identity-agent"])
        return addon

    def _charts(self) -> dict[str, eks.HelmChart]:
        specs = self.specs
        wanted = [
            (eks_rules.NVIDIA_DEVICE_PLUGIN, eks_rules.gpu_instance_types(specs), eks_rules.nvidia_plugin_values),
            (eks_rules.EFA_DEVICE_PLUGIN, eks_rules.efa_instance_types(specs), eks_rules.efa_plugin_values),
            (
                eks_rules.NEURON_DEVICE_PLUGIN,
                eks_rules.neuron_instance_types(specs),
                functools.partial(eks_rules.neuron_plugin_values, resource=self.props.neuron_resource),
            ),
            (eks_rules.DCGM_EXPORTER, eks_rules.gpu_instance_types(specs), eks_rules.dcgm_exporter_values),
            (eks_rules.NODE_EXPORTER, list(self.props.instance_types), eks_rules.node_exporter_values),
        ]
        charts = {}
        for chart, types, values in wanted:
            if not types:  # no node of this kind: nothing to advertise
                continue
            charts[chart.name] = eks.HelmChart(
                self,
                f"Chart-{chart.name}",
                cluster=self.cluster,
                chart=chart.chart,
                repository=chart.repository,
                version=chart.version,
                namespace=chart.namespace,
                release=chart.name,
                values=values(specs, self.props.node_tolerations),
                create_namespace=False,
            )
        chart_asset = s3_assets.Asset(self, "HyperPodChart", path=self.props.hyperpod_chart_directory)
        charts["hyperpod-dependencies"] = eks.HelmChart(
            self,
            "Chart-hyperpod-dependencies",
            cluster=self.cluster,
            release="hyperpod-dependencies",
            chart_asset=chart_asset,
            namespace="kube-system",
            values=eks_rules.HYPERPOD_CHART_VALUES,
            create_namespace=False,
        )
        # HelmChart grants the kubectl handler Asset.grant_read on the chart: s3:GetObject*,
        # s3:GetBucket* and s3:List* on the file-asset bucket and its objects.
        handler = self.cluster.node.find_child("KubectlProvider").node.find_child("Handler")
        reason = (
            "The kubectl handler downloads the HyperPod chart asset; aws-cdk-lib's Asset.grant_read gives it "
            "read-only access to the CDK file-asset bucket, which holds only deployment assets."
        )
        cdk.Validations.of(handler.role.node.find_child("DefaultPolicy").node.default_child).acknowledge(
            *(
                cdk.Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason)
                for finding in (
                    "Action::s3:GetObject*",
                    "Action::s3:GetBucket*",
                    "Action::s3:List*",
                    f"Resource::{nag_text(cdk.Stack.of(self), chart_asset.bucket.bucket_arn)}/*",
                )
            )
        )
        for chart in charts.values():
            # The plugins' pods need the CNI and DNS to start.
            chart.node.add_dependency(*self.addons.values())
        return charts

    @staticmethod
    def _problems(props: TrainingEksClusterProps) -> list[Problem]:
        found = endpoint_problems(props.endpoint_access, props.public_access_cidrs)
        found += addon_version_problems(props.addon_versions)
        if p := kubernetes_version_problem(props.kubernetes_version):
            found.append(p.at("kubernetes_version"))
        zones = {s.availability_zone for s in props.subnets}
        if len(props.subnets) < 2 or len(zones) < 2:
            found.append(
                problem(
                    "EKS needs subnets in at least two availability zones",
                    got=sorted(zones),
                    allowed="private subnets in two or more zones",
                ).at("subnets")
            )
        for i, name in enumerate(props.instance_types):
            if catalog.lookup(name) is None:
                found.append(catalog.unknown_instance_type(name).at(f"instance_types[{i}]"))
        names = (eks_rules.NEURON_RESOURCE, eks_rules.NEURON_DEVICE_RESOURCE)
        if props.neuron_resource not in names:
            found.append(
                problem("unknown Neuron resource", got=props.neuron_resource, allowed=" or ".join(names)).at(
                    "neuron_resource"
                )
            )
        if p := eks_rules.hyperpod_chart_problem(props.hyperpod_chart_directory):
            found.append(p.at("hyperpod_chart_directory"))
        return found


def eks_addon(
    scope: Construct, cluster_name: str, addon: eks_rules.Addon, version: str | None, **extra
) -> eks.CfnAddon:
    """``addon`` on the cluster at ``version`` (None: EKS's default), overwriting what an earlier install left."""
    return eks.CfnAddon(
        scope,
        f"Addon-{addon.name}",
        cluster_name=cluster_name,
        addon_name=addon.name,
        addon_version=version,
        resolve_conflicts="OVERWRITE",
        **extra,
    )


def pod_identity_role(scope: Construct, id: str, managed_policy: str, *, reason: str) -> iam.Role:
    """A role for one service account through EKS Pod Identity (whose principal tags its
    sessions), holding the AWS managed policy its add-on documents; ``reason`` acknowledges
    that policy in cdk-nag."""
    role = iam.Role(
        scope,
        id,
        assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(managed_policy)],
    )
    cdk.Validations.of(role.node.default_child).acknowledge(
        cdk.Acknowledgment(id=managed_policy_finding(managed_policy), reason=reason)
    )
    return role
