"""Where an MoE run's metrics go: Amazon Managed Service for Prometheus with the alert rules, fed by a
managed scraper inside an EKS cluster or by the agent the Slurm lifecycle scripts start, and an Amazon
Managed Grafana workspace that reads it, with the dashboards provisioned (constructs/grafana_dashboards.py).

On EKS (``cluster_arn`` set) the scraper (``AWS::APS::Scraper``) discovers pods through Kubernetes and keeps the ones
annotated ``prometheus.io/scrape: "true"``: the trainer (``moe-cdk eks render`` and the
Helm chart annotate it), the DCGM exporter and the node exporter. It also scrapes every
node's kubelet and cAdvisor. With the cluster's API authentication mode, EKS gives the scraper its access
entry itself (Amazon Managed Service for Prometheus User Guide, "Using an AWS managed
collector"). On Slurm there is no managed scraper for the nodes (AMP's collectors read EKS and
MSK only), so the nodes' agent remote-writes (``remote_write_url``) with the role that
``grant_remote_write`` allows.

The alert rules are one Prometheus rules file, deployed as an AMP rule groups namespace (AMP User
Guide, "Managing and using rules"; its ``Data`` is the rules file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aws_cdk as cdk
import yaml
from aws_cdk import aws_aps as aps, aws_ec2 as ec2, aws_grafana as grafana, aws_iam as iam
from constructs import Construct

from moe_cdk.constructs.grafana_dashboards import GrafanaDashboards, GrafanaDashboardsProps
from moe_cdk.constructs.validation import Problem, problem, raise_if_any

# AMP User Guide, "Scraper configuration": the scrape interval is at least 30 seconds.
MIN_SCRAPE_INTERVAL_S = 30


# What the Slurm nodes' agent needs on the workspace (AMP User Guide, "Ingest Prometheus metrics to the workspace").
REMOTE_WRITE = ["aps:RemoteWrite"]


@dataclass(frozen=True, kw_only=True)
class TrainingObservabilityProps:
    name: str
    """Prefix of the workspace names. Required."""
    cluster_arn: str | None = None
    """The EKS cluster a managed scraper collects from. Default: none, for a Slurm cluster whose nodes
    remote-write."""
    subnets: Sequence[ec2.ISubnet] = ()
    """Subnets the scraper reaches the cluster from (1 to 5), with ``cluster_arn``."""
    security_group: ec2.ISecurityGroup | None = None
    """Security group of the scraper's network interfaces, with ``cluster_arn``; it must reach the pods."""
    scrape_interval_s: int = 30
    """How often every target is scraped, in seconds (at least 30). Default: 30."""
    alert_rules: str | None = None
    """A Prometheus rules file (YAML) for the workspace's rule groups namespace. Default: no rules."""
    dashboards: Mapping[str, str] = field(default_factory=dict)
    """File name -> Grafana dashboard JSON, provisioned into the Grafana workspace. Default: none."""


def scrape_configuration(scrape_interval_s: int) -> dict:
    """The Prometheus configuration the managed scraper runs."""
    keep_annotated = [
        {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
        {
            "source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
            "action": "replace",
            "regex": r"([^:]+)(?::\d+)?;(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
        {
            "source_labels": ["__meta_kubernetes_pod_label_training_kubeflow_org_job_name"],
            "target_label": "training_job",
        },
        # The job names the alert rules and dashboards select, as the Slurm agent names its targets: the
        # trainer's pods by their label (jobs/eks_job.py), the exporters by the moe-cdk/job annotation
        # their chart values give them (rules/eks.py).
        {
            "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
            "regex": "moe-training",
            "target_label": "job",
            "replacement": "moe-trainer",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_moe_cdk_job"],
            "regex": "(.+)",
            "target_label": "job",
        },
    ]
    node = {
        "scheme": "https",
        "bearer_token_file": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "tls_config": {"ca_file": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "insecure_skip_verify": True},
        "kubernetes_sd_configs": [{"role": "node"}],
    }
    return {
        "global": {"scrape_interval": f"{scrape_interval_s}s", "external_labels": {"source": "moe-cdk"}},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "kubernetes_sd_configs": [{"role": "pod"}],
                "relabel_configs": keep_annotated,
            },
            {"job_name": "kubelet", **node},
            {"job_name": "cadvisor", "metrics_path": "/metrics/cadvisor", **node},
        ],
    }


class TrainingObservability(Construct):
    """A Prometheus workspace, a managed scraper on the EKS cluster, and a Grafana workspace."""

    def __init__(self, scope: Construct, id: str, props: TrainingObservabilityProps) -> None:
        super().__init__(scope, id)
        raise_if_any("TrainingObservability", self._problems(props))
        stack = cdk.Stack.of(self)
        self.workspace = aps.CfnWorkspace(self, "Prometheus", alias=f"{props.name}-training")
        # Where an agent sends samples: the query endpoint ends with a slash.
        self.remote_write_url = f"{self.workspace.attr_prometheus_endpoint}api/v1/remote_write"
        self.rules = None
        if props.alert_rules is not None:
            self.rules = aps.CfnRuleGroupsNamespace(
                self,
                "AlertRules",
                workspace=self.workspace.attr_arn,
                name=f"{props.name}-training",
                data=props.alert_rules,
            )
        self.scrape_configuration = None
        self.scraper = None
        if props.cluster_arn is not None:
            self.scrape_configuration = scrape_configuration(props.scrape_interval_s)
            self._add_scraper(props)
        self._add_grafana(props, stack)

    def grant_remote_write(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` (the Slurm nodes' role) send samples to this workspace and nothing else."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=REMOTE_WRITE, resource_arns=[self.workspace.attr_arn]
        )

    def remote_write_statement(self) -> iam.PolicyStatement:
        """The same permission, for a managed policy (ParallelCluster's nodes take their permissions as one)."""
        return iam.PolicyStatement(actions=REMOTE_WRITE, resources=[self.workspace.attr_arn])

    def _add_scraper(self, props: TrainingObservabilityProps) -> None:
        self.scraper = aps.CfnScraper(
            self,
            "Scraper",
            alias=f"{props.name}-eks",
            source=aps.CfnScraper.SourceProperty(
                eks_configuration=aps.CfnScraper.EksConfigurationProperty(
                    cluster_arn=props.cluster_arn,
                    subnet_ids=[s.subnet_id for s in props.subnets],
                    security_group_ids=[props.security_group.security_group_id],
                )
            ),
            destination=aps.CfnScraper.DestinationProperty(
                amp_configuration=aps.CfnScraper.AmpConfigurationProperty(workspace_arn=self.workspace.attr_arn)
            ),
            # The API takes the YAML base64-encoded; Fn::Base64 keeps it readable in synth diffs.
            scrape_configuration=aps.CfnScraper.ScrapeConfigurationProperty(
                configuration_blob=cdk.Fn.base64(yaml.safe_dump(self.scrape_configuration, sort_keys=False))
            ),
        )

    def _add_grafana(self, props: TrainingObservabilityProps, stack: cdk.Stack) -> None:
        # Amazon Managed Grafana User Guide, "Permissions for Amazon Managed Service for
        # Prometheus": a customer-managed role that can query this one workspace.
        self.grafana_role = iam.Role(
            self,
            "GrafanaRole",
            assumed_by=iam.ServicePrincipal(
                "grafana.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": stack.account}}
            ),
        )
        self.grafana_role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "aps:QueryMetrics",
                    "aps:GetSeries",
                    "aps:GetLabels",
                    "aps:GetMetricMetadata",
                    "aps:DescribeWorkspace",
                ],
                resources=[self.workspace.attr_arn],
            )
        )
        self.grafana_role.add_to_policy(iam.PolicyStatement(actions=["aps:ListWorkspaces"], resources=["*"]))
        cdk.Validations.of(self.grafana_role.node.find_child("DefaultPolicy").node.default_child).acknowledge(
            cdk.Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="aps:ListWorkspaces, which Grafana's data-source picker calls, has no resource-level "
                "permissions; the query actions are scoped to this one workspace.",
            )
        )
        self.grafana = grafana.CfnWorkspace(
            self,
            "Grafana",
            name=f"{props.name}-training",
            account_access_type="CURRENT_ACCOUNT",
            authentication_providers=["AWS_SSO"],
            permission_type="CUSTOMER_MANAGED",
            role_arn=self.grafana_role.role_arn,
            data_sources=["PROMETHEUS"],
            # Service accounts, with which the dashboards are provisioned, need Grafana 9 or later.
            grafana_version="10.4",
            description="moe-cdk: MoE training metrics, with the moe-cdk dashboards",
        )
        self.dashboards = None
        if props.dashboards:
            self.dashboards = GrafanaDashboards(
                self,
                "Dashboards",
                GrafanaDashboardsProps(
                    workspace_id=self.grafana.attr_id,
                    workspace_endpoint=self.grafana.attr_endpoint,
                    prometheus_endpoint=self.workspace.attr_prometheus_endpoint,
                    prometheus_region=stack.region,
                    dashboards=props.dashboards,
                ),
            )

    @staticmethod
    def _problems(props: TrainingObservabilityProps) -> list[Problem]:
        found = []
        if props.scrape_interval_s < MIN_SCRAPE_INTERVAL_S:
            found.append(
                problem(
                    "below the managed scraper's minimum",
                    got=props.scrape_interval_s,
                    allowed=f"{MIN_SCRAPE_INTERVAL_S} or more",
                ).at("scrape_interval_s")
            )
        if props.cluster_arn is not None:
            if not 1 <= len(props.subnets) <= 5:
                found.append(
                    problem("the scraper takes 1 to 5 subnets", got=len(props.subnets), allowed="1 to 5").at("subnets")
                )
            if props.security_group is None:
                found.append(
                    problem("the scraper needs a security group", got=None, allowed="a security group").at(
                        "security_group"
                    )
                )
        elif props.subnets or props.security_group is not None:
            found.append(
                problem("only used with cluster_arn (the managed scraper)", got="set", allowed="unset").at(
                    "subnets" if props.subnets else "security_group"
                )
            )
        return found
