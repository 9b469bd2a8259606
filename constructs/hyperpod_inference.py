"""HyperPod's inference operator on an EKS cluster: the add-on that runs ``InferenceEndpointConfig`` (rules/serving.py),
the add-ons it needs, and their roles, each with least privilege.

In AWS's order ([HP-INF] in rules/eks.py; aws/sagemaker-hyperpod-cluster-setup, eks/cloudformation/
main-stack-inference-operator-addon-template.yaml, and awslabs/awsome-distributed-ai@95b939c, the Terraform module
hyperpod_inference_operator): the cluster's IAM OIDC provider, the roles, the S3 CSI driver and metrics-server
add-ons, then the inference add-on, which installs the AWS Load Balancer Controller and KEDA itself and creates its
namespace, ``hyperpod-inference-system``. cert-manager and the FSx CSI driver are add-ons of every cluster
(constructs/training_eks_cluster.py), pinned at the operator's minimum builds when serving (rules/eks.py,
SERVING_PINS). The construct belongs after the HyperPod cluster: the add-on names it, and its pods need nodes.

Every role is assumed through the cluster's OIDC provider (IRSA), as AWS's templates do, by the one service account
that uses it: the inference add-on's configuration takes role ARNs for the operator, the load balancer controller
and KEDA, not Pod Identity associations. ``AWS::EKS::Addon`` waits for the add-on to stabilize but accepts
``DEGRADED`` as done (hashicorp/terraform-provider-aws#44669, comparing the CloudFormation handler with its own);
AWS's CloudFormation wraps the add-on in a Lambda that waits for ACTIVE or DEGRADED too, and reports success either
way. So a deploy that succeeds does not prove the operator runs: ``kubectl get pods -n hyperpod-inference-system``
does (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from moe_cdk.constructs.nag import managed_policy_finding, nag_text
from moe_cdk.constructs.training_eks_cluster import eks_addon
from moe_cdk.constructs.validation import Problem, problem, raise_if_any
from moe_cdk.rules import eks as eks_rules, serving

NAMESPACE = "hyperpod-inference-system"
# The service accounts AWS's templates trust (aws/sagemaker-hyperpod-cli@011ca92, helm_chart/HyperPodHelmChart/charts/
# inference-operator: the add-on's controller is hyperpod-inference-controller-manager, which its Helm-to-add-on
# migration rewrites the Helm chart's name to; the AWS Load Balancer Controller's and KEDA's own names).
OPERATOR_SERVICE_ACCOUNT = "hyperpod-inference-controller-manager"
ALB_SERVICE_ACCOUNT = "aws-load-balancer-controller"
KEDA_SERVICE_ACCOUNT = "keda-operator"
S3_CSI_SERVICE_ACCOUNT = ("kube-system", "s3-csi-driver-sa")
EXECUTION_POLICY = "AmazonSageMakerHyperPodInferenceAccess"
CLUSTER_TAG = "elbv2.k8s.aws/cluster"
"""The tag the load balancer controller puts on what it creates, and its role's writes are limited to."""


@dataclass(frozen=True, kw_only=True)
class HyperPodInferenceProps:
    eks_cluster: eks.Cluster
    """The EKS cluster the HyperPod cluster's nodes join. Required."""
    hyperpod_cluster_arn: str
    """The HyperPod cluster the endpoints run on. Required."""
    execution_role_name: str
    """The operator's execution role; must start with ``SageMakerHyperPodInference``. Required."""
    tls_bucket_name: str
    """The bucket the operator writes certificates to (``hyperpod-tls*``). Required."""
    model_bucket_name: str
    """The bucket endpoints may load models from (the data repository's). Required."""
    model_prefixes: Sequence[str]
    """Its prefixes the S3 CSI driver may read, each ending in ``/``. Required."""
    addon_versions: Mapping[str, str] = field(default_factory=dict)
    """Pinned add-on versions by name. Default: rules/eks.py's builds (``serving_addon_versions``)."""
    prometheus_workspace_arn: str | None = None
    """The Managed Prometheus workspace KEDA may query for autoscaling. Default: the account's workspaces in the
    Region."""


class HyperPodInference(Construct):
    """The inference operator add-on, with the S3 CSI driver and metrics-server add-ons and the roles they use."""

    def __init__(self, scope: Construct, id: str, props: HyperPodInferenceProps) -> None:
        super().__init__(scope, id)
        raise_if_any("HyperPodInference", self._problems(props))
        self.props = props
        self._stack = cdk.Stack.of(self)
        # The cluster's IAM OIDC provider, native (AWS::IAM::OIDCProvider, no custom resource), here rather than as the
        # cluster's own (aws_eks_v2 creates that only when asked): the roles' trust conditions split its ARN, which
        # must not come from another stack (a weak reference in a Join, which CloudFormation's linter refuses).
        self.provider = iam.OidcProviderNative(
            self,
            "OidcProvider",
            url=props.eks_cluster.cluster_open_id_connect_issuer_url,
            client_ids=["sts.amazonaws.com"],
        )
        versions = eks_rules.serving_addon_versions(props.addon_versions)
        self.execution_role = self._execution_role()
        self.s3_csi_role = self._s3_csi_role()
        self.load_balancer_role = self._load_balancer_role()
        self.keda_role = self._keda_role()
        cluster = props.eks_cluster.cluster_name
        s3_csi = eks_addon(
            self,
            cluster,
            eks_rules.S3_CSI_DRIVER,
            versions[eks_rules.S3_CSI_DRIVER.name],
            service_account_role_arn=self.s3_csi_role.role_arn,
        )
        metrics_server = eks_addon(self, cluster, eks_rules.METRICS_SERVER, versions[eks_rules.METRICS_SERVER.name])
        configuration = {
            "executionRoleArn": self.execution_role.role_arn,
            "tlsCertificateS3Bucket": props.tls_bucket_name,
            "hyperpodClusterArn": props.hyperpod_cluster_arn,
            "alb": {"enabled": True, "serviceAccount": {"create": True, "roleArn": self.load_balancer_role.role_arn}},
            "keda": {"enabled": True, "auth": {"aws": {"irsa": {"enabled": True, "roleArn": self.keda_role.role_arn}}}},
        }
        self.addon = eks_addon(
            self,
            cluster,
            eks_rules.INFERENCE_OPERATOR,
            versions[eks_rules.INFERENCE_OPERATOR.name],
            configuration_values=self._stack.to_json_string(configuration),
        )
        self.addon.node.add_dependency(
            s3_csi, metrics_server, self.execution_role, self.load_balancer_role, self.keda_role
        )

    # -- roles ---------------------------------------------------------------------------------------

    def _service_account_principal(self, id: str, namespace: str, name: str) -> iam.IPrincipal:
        """The one service account ``namespace/name`` of the cluster, through its OIDC provider. The condition's keys
        hold the provider's issuer, known at deploy time only, so they are a CfnJson."""
        issuer = self.provider.open_id_connect_provider_issuer
        subject = cdk.CfnJson(
            self,
            f"{id}Subject",
            value={f"{issuer}:sub": f"system:serviceaccount:{namespace}:{name}", f"{issuer}:aud": "sts.amazonaws.com"},
        )
        return iam.OpenIdConnectPrincipal(self.provider, {"StringEquals": subject})

    def _execution_role(self) -> iam.Role:
        role = iam.Role(
            self,
            "ExecutionRole",
            role_name=self.props.execution_role_name,
            assumed_by=iam.CompositePrincipal(
                iam.ServicePrincipal("sagemaker.amazonaws.com"),
                self._service_account_principal("Operator", NAMESPACE, OPERATOR_SERVICE_ACCOUNT),
            ),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(EXECUTION_POLICY)],
            description="HyperPod inference operator: endpoints, their load balancers, certificates and scaling",
        )
        cdk.Validations.of(role.node.default_child).acknowledge(
            cdk.Acknowledgment(
                id=managed_policy_finding(EXECUTION_POLICY),
                reason="The policy AWS publishes for the inference operator's execution role, the one its add-on "
                "documents; it writes certificates only to hyperpod-tls* buckets and passes only "
                "SageMakerHyperPodInference* roles.",
            )
        )
        return role

    def _s3_csi_role(self) -> iam.Role:
        namespace, name = S3_CSI_SERVICE_ACCOUNT
        bucket = f"arn:{cdk.Aws.PARTITION}:s3:::{self.props.model_bucket_name}"
        role = iam.Role(
            self,
            "S3CsiRole",
            assumed_by=self._service_account_principal("S3Csi", namespace, name),
            description="Mountpoint for S3 CSI driver: reads the models endpoints load",
        )
        prefixes = list(self.props.model_prefixes)
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket],
                conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
            )
        )
        objects = [f"{bucket}/{p}*" for p in prefixes]
        role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=objects))
        self._acknowledge(
            role,
            [f"Resource::{nag_text(self._stack, arn)}" for arn in objects],
            "The S3 CSI driver mounts models from any folder under the model prefixes (serving.model_prefixes), "
            "read-only.",
        )
        return role

    def _keda_role(self) -> iam.Role:
        role = iam.Role(
            self,
            "KedaRole",
            assumed_by=self._service_account_principal("Keda", NAMESPACE, KEDA_SERVICE_ACCOUNT),
            description="KEDA: reads the metrics endpoints scale on",
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics", "cloudwatch:ListMetrics"],
                resources=["*"],
            )
        )
        workspaces = self.props.prometheus_workspace_arn or self._stack.format_arn(
            service="aps", resource="workspace", resource_name="*"
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["aps:QueryMetrics", "aps:GetLabels", "aps:GetSeries", "aps:GetMetricMetadata"],
                resources=[workspaces],
            )
        )
        findings = ["Resource::*"]
        if self.props.prometheus_workspace_arn is None:
            findings.append(f"Resource::{nag_text(self._stack, workspaces)}")
        self._acknowledge(
            role,
            findings,
            "CloudWatch's metric reads have no resource-level permissions (Service Authorization Reference, "
            "Amazon CloudWatch); without observability the Prometheus workspace an endpoint scales on is named in "
            "its InferenceEndpointConfig, so KEDA may query this account's workspaces in this Region.",
        )
        return role

    def _load_balancer_role(self) -> iam.Role:
        """The AWS Load Balancer Controller's: what it reads, and writes only to load balancers, target groups and
        security groups it tagged as its own (the controller's published policy, written here in fewer
        statements; its WAF, Shield and Cognito calls are left out, since endpoints use none)."""
        role = iam.Role(
            self,
            "LoadBalancerControllerRole",
            assumed_by=self._service_account_principal("LoadBalancer", NAMESPACE, ALB_SERVICE_ACCOUNT),
            description="AWS Load Balancer Controller: the endpoints' load balancers",
        )
        stack = self._stack
        owned = {"Null": {f"aws:ResourceTag/{CLUSTER_TAG}": "false"}}
        requested = {"Null": {f"aws:RequestTag/{CLUSTER_TAG}": "false"}}
        balancers = [
            stack.format_arn(service="elasticloadbalancing", resource=kind, resource_name="*")
            for kind in ("loadbalancer/app", "loadbalancer/net", "targetgroup")
        ]
        listeners = [
            stack.format_arn(service="elasticloadbalancing", resource=kind, resource_name="*")
            for kind in ("listener/app", "listener/net", "listener-rule/app", "listener-rule/net")
        ]
        groups = stack.format_arn(service="ec2", resource="security-group", resource_name="*")
        vpc = stack.format_arn(service="ec2", resource="vpc", resource_name="*")
        statements = [
            iam.PolicyStatement(
                actions=["iam:CreateServiceLinkedRole"],
                resources=["*"],
                conditions={"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}},
            ),
            iam.PolicyStatement(
                actions=[
                    "ec2:DescribeAccountAttributes",
                    "ec2:DescribeAddresses",
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeInternetGateways",
                    "ec2:DescribeVpcs",
                    "ec2:DescribeVpcPeeringConnections",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeInstances",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeTags",
                    "ec2:DescribeCoipPools",
                    "ec2:GetCoipPoolUsage",
                    "ec2:GetSecurityGroupsForVpc",
                    "elasticloadbalancing:Describe*",
                    "acm:ListCertificates",
                    "acm:DescribeCertificate",
                ],
                resources=["*"],
            ),
            iam.PolicyStatement(actions=["ec2:CreateSecurityGroup"], resources=[groups, vpc]),
            iam.PolicyStatement(
                actions=["ec2:CreateTags"],
                resources=[groups],
                conditions={"StringEquals": {"ec2:CreateAction": "CreateSecurityGroup"}, **requested},
            ),
            iam.PolicyStatement(
                actions=[
                    "ec2:AuthorizeSecurityGroupIngress",
                    "ec2:RevokeSecurityGroupIngress",
                    "ec2:DeleteSecurityGroup",
                    "ec2:CreateTags",
                    "ec2:DeleteTags",
                ],
                resources=[groups],
                conditions=owned,
            ),
            iam.PolicyStatement(
                actions=["elasticloadbalancing:CreateLoadBalancer", "elasticloadbalancing:CreateTargetGroup"],
                resources=["*"],
                conditions=requested,
            ),
            iam.PolicyStatement(
                actions=["elasticloadbalancing:AddTags"],
                resources=balancers,
                conditions={
                    "StringEquals": {"elasticloadbalancing:CreateAction": ["CreateTargetGroup", "CreateLoadBalancer"]},
                    **requested,
                },
            ),
            iam.PolicyStatement(
                actions=[
                    "elasticloadbalancing:ModifyLoadBalancerAttributes",
                    "elasticloadbalancing:SetIpAddressType",
                    "elasticloadbalancing:SetSecurityGroups",
                    "elasticloadbalancing:SetSubnets",
                    "elasticloadbalancing:DeleteLoadBalancer",
                    "elasticloadbalancing:ModifyTargetGroup",
                    "elasticloadbalancing:ModifyTargetGroupAttributes",
                    "elasticloadbalancing:DeleteTargetGroup",
                    "elasticloadbalancing:AddTags",
                    "elasticloadbalancing:RemoveTags",
                ],
                resources=balancers,
                conditions=owned,
            ),
            iam.PolicyStatement(
                actions=[
                    "elasticloadbalancing:CreateListener",
                    "elasticloadbalancing:DeleteListener",
                    "elasticloadbalancing:CreateRule",
                    "elasticloadbalancing:DeleteRule",
                    "elasticloadbalancing:ModifyListener",
                    "elasticloadbalancing:ModifyRule",
                    "elasticloadbalancing:AddListenerCertificates",
                    "elasticloadbalancing:RemoveListenerCertificates",
                    "elasticloadbalancing:AddTags",
                    "elasticloadbalancing:RemoveTags",
                ],
                resources=[*balancers[:2], *listeners],
            ),
            iam.PolicyStatement(
                actions=["elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"],
                resources=[balancers[2]],
            ),
        ]
        for statement in statements:
            role.add_to_policy(statement)
        self._acknowledge(
            role,
            [
                "Resource::*",
                "Action::elasticloadbalancing:Describe*",
                *(f"Resource::{nag_text(stack, arn)}" for arn in [*balancers, *listeners, groups, vpc]),
            ],
            "The load balancer controller creates the endpoints' load balancers, target groups, listeners and "
            "security groups at run time, so their ARNs are unknown here: writes are limited to what carries its "
            f"{CLUSTER_TAG} tag, and the rest are reads (Describe and List calls take no resource).",
        )
        return role

    def _acknowledge(self, role: iam.Role, findings: Sequence[str], reason: str) -> None:
        policy = role.node.find_child("DefaultPolicy").node.default_child
        cdk.Validations.of(policy).acknowledge(
            *(cdk.Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason) for finding in findings)
        )

    @staticmethod
    def _problems(props: HyperPodInferenceProps) -> list[Problem]:
        found: list[Problem] = []
        if p := serving.execution_role_problem(props.execution_role_name):
            found.append(p.at("execution_role_name"))
        if p := serving.tls_bucket_problem(props.tls_bucket_name):
            found.append(p.at("tls_bucket_name"))
        if not props.model_prefixes:
            found.append(problem("needs a prefix", got=[], allowed="e.g. checkpoints/").at("model_prefixes"))
        return found
