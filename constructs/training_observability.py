"""Where an MoE run's metrics go: Amazon Managed Service for Prometheus, fed by a managed
scraper inside the EKS cluster, and an Amazon Managed Grafana workspace that reads it.

The scraper (``AWS::APS::Scraper``) discovers pods through Kubernetes and keeps the ones
annotated ``prometheus.io/scrape: "true"``: the trainer (``moe-cdk eks render`` and the
Helm chart annotate it), the DCGM exporter and the node exporter. It also scrapes every
node's kubelet and cAdvisor. With the cluster's API authentication mode, EKS gives the scraper its access
entry itself (Amazon Managed Service for Prometheus User Guide, "Using an AWS managed
collector"). The dashboard for the trainer's metrics is
``charts/moe-training/dashboards/moe-training.json``; Grafana has no CloudFormation resource
for dashboards, so ``docs/hyperpod-eks.md`` shows the import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aws_cdk as cdk
import yaml
from aws_cdk import aws_aps as aps, aws_ec2 as ec2, aws_grafana as grafana, aws_iam as iam
from constructs import Construct

from moe_cdk.constructs.validation import Problem, problem, raise_if_any

# AMP User Guide, "Scraper configuration": the scrape interval is at least 30 seconds.
MIN_SCRAPE_INTERVAL_S = 30


@dataclass(frozen=True, kw_only=True)
class TrainingObservabilityProps:
    name: str
    """Prefix of the workspace names. Required."""
    cluster_arn: str
    """The EKS cluster to scrape. Required."""
    subnets: Sequence[ec2.ISubnet]
    """Subnets the scraper reaches the cluster from (1 to 5). Required."""
    security_group: ec2.ISecurityGroup
    """Security group of the scraper's network interfaces; it must reach the pods. Required."""
    scrape_interval_s: int = 30
    """How often every target is scraped, in seconds (at least 30). Default: 30."""


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
        self.scrape_configuration = scrape_configuration(props.scrape_interval_s)
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
            description="moe-cdk: MoE training metrics (import charts/moe-training/dashboards/moe-training.json)",
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
        if not 1 <= len(props.subnets) <= 5:
            found.append(
                problem("the scraper takes 1 to 5 subnets", got=len(props.subnets), allowed="1 to 5").at("subnets")
            )
        return found
