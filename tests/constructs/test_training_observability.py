"""TrainingObservability: Managed Prometheus fed by a managed scraper, read by Managed Grafana."""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import pytest
import yaml
from aws_cdk import aws_ec2 as ec2, aws_iam as iam
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from moe_cdk.constructs.training_observability import (
    TrainingObservability,
    TrainingObservabilityProps,
    scrape_configuration,
)
from moe_cdk.core.problems import ConfigError
from moe_cdk.rules.eks import dcgm_exporter_values, node_exporter_values

ARN = "arn:aws:eks:us-east-2:123456789012:cluster/t"
ROOT = Path(__file__).resolve().parents[2]


def _build(**overrides):
    app = cdk.App()
    stack = cdk.Stack(app, "T", env=cdk.Environment(region="us-east-2"))
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Vpc",
        vpc_id="vpc-0123456789abcdef0",
        availability_zones=["us-east-2a", "us-east-2b"],
        private_subnet_ids=["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
    )
    group = ec2.SecurityGroup.from_security_group_id(stack, "Sg", "sg-0123456789abcdef0")
    props = dict(name="t", cluster_arn=ARN, subnets=vpc.private_subnets, security_group=group) | overrides
    observability = TrainingObservability(stack, "Observability", TrainingObservabilityProps(**props))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack, observability


@pytest.fixture(scope="module")
def template():
    app, stack, _ = _build()
    app.synth()  # fails on any unacknowledged cdk-nag finding
    return Template.from_stack(stack)


def test_scraper_reads_the_cluster_and_writes_the_workspace(template):
    (scraper,) = template.find_resources("AWS::APS::Scraper").values()
    props = scraper["Properties"]
    assert props["Source"]["EksConfiguration"]["ClusterArn"] == ARN
    assert props["Destination"]["AmpConfiguration"]["WorkspaceArn"]["Fn::GetAtt"][1] == "Arn"


def test_scrape_configuration_is_base64_of_the_yaml(template):
    (scraper,) = template.find_resources("AWS::APS::Scraper").values()
    blob = scraper["Properties"]["ScrapeConfiguration"]["ConfigurationBlob"]
    assert yaml.safe_load(blob["Fn::Base64"]) == scrape_configuration(30)


def test_annotated_pods_and_node_metrics_are_scraped():
    config = scrape_configuration(30)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"kubernetes-pods", "kubelet", "cadvisor"}
    keep = jobs["kubernetes-pods"]["relabel_configs"][0]
    assert (keep["action"], keep["source_labels"], keep["regex"]) == (
        "keep",
        ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
        "true",
    )
    assert config["global"]["scrape_interval"] == "30s"


def test_grafana_may_query_only_this_workspace(template):
    policies = template.find_resources("AWS::IAM::Policy")
    statements = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]
    query = next(s for s in statements if "aps:QueryMetrics" in s["Action"])
    assert query["Resource"]["Fn::GetAtt"][1] == "Arn"
    template.has_resource_properties(
        "AWS::Grafana::Workspace",
        {"PermissionType": "CUSTOMER_MANAGED", "AccountAccessType": "CURRENT_ACCOUNT", "DataSources": ["PROMETHEUS"]},
    )


def test_scrape_interval_below_the_minimum_is_refused():
    with pytest.raises(ConfigError) as error:
        _build(scrape_interval_s=10)
    assert error.value.errors == ["scrape_interval_s: below the managed scraper's minimum (got 10; allowed 30 or more)"]


# -- Slurm: no managed scraper; the nodes remote-write ---------------------------------------------------

RULES = """groups:
  - name: t
    rules:
      - alert: Up
        expr: up == 0
"""
DASHBOARD = '{"uid": "d", "title": "D", "templating": {"list": [{"type": "datasource", "name": "datasource"}]}}'


@pytest.fixture(scope="module")
def slurm_template():
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-2"))
    observability = TrainingObservability(
        stack,
        "Observability",
        TrainingObservabilityProps(name="s", alert_rules=RULES, dashboards={"d.json": DASHBOARD}),
    )
    nodes = iam.Role(stack, "Nodes", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    observability.grant_remote_write(nodes)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()
    return Template.from_stack(stack), observability


def test_without_a_cluster_there_is_no_scraper(slurm_template):
    template, observability = slurm_template
    assert template.find_resources("AWS::APS::Scraper") == {} and observability.scraper is None


def test_the_rules_file_is_the_workspaces_rule_groups_namespace(slurm_template):
    template, _ = slurm_template
    (namespace,) = template.find_resources("AWS::APS::RuleGroupsNamespace").values()
    assert namespace["Properties"]["Data"] == RULES
    assert namespace["Properties"]["Workspace"]["Fn::GetAtt"][1] == "Arn"


def test_nodes_may_only_remote_write_to_the_workspace(slurm_template):
    template, _ = slurm_template
    statements = [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    (write,) = [s for s in statements if "aps:RemoteWrite" in str(s["Action"])]
    assert write["Action"] == "aps:RemoteWrite" and write["Resource"]["Fn::GetAtt"][1] == "Arn"


def test_remote_write_url_is_the_query_endpoint_plus_the_api_path(slurm_template):
    _, observability = slurm_template
    resolved = cdk.Stack.of(observability).resolve(observability.remote_write_url)
    assert resolved["Fn::Join"][1][-1] == "api/v1/remote_write"


def test_dashboards_are_provisioned_into_a_grafana_that_has_service_accounts(slurm_template):
    template, _ = slurm_template
    template.has_resource_properties("AWS::Grafana::Workspace", {"GrafanaVersion": "10.4"})
    assert len(template.find_resources("Custom::GrafanaDashboards")) == 1


def test_scraper_props_without_a_cluster_are_refused():
    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(region="us-east-2"))
    group = ec2.SecurityGroup.from_security_group_id(stack, "Sg", "sg-0123456789abcdef0")
    with pytest.raises(ConfigError) as error:
        TrainingObservability(stack, "O", TrainingObservabilityProps(name="s", security_group=group))
    assert error.value.errors == [
        "security_group: only used with cluster_arn (the managed scraper) (got 'set'; allowed unset)"
    ]


def test_trainer_and_exporter_pods_are_scraped_as_the_jobs_the_alert_rules_select():
    (pods,) = [j for j in scrape_configuration(30)["scrape_configs"] if j["job_name"] == "kubernetes-pods"]
    trainer, exporters = [r for r in pods["relabel_configs"] if r.get("target_label") == "job"]
    assert trainer["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
    assert (trainer["regex"], trainer["replacement"]) == ("moe-training", "moe-trainer")
    # Prometheus turns the annotation moe-cdk/job into this meta label (every other character becomes _).
    assert exporters["source_labels"] == ["__meta_kubernetes_pod_annotation_moe_cdk_job"]
    jobs = {
        values(specs=[])["podAnnotations"]["moe-cdk/job"] for values in (dcgm_exporter_values, node_exporter_values)
    }
    rules = (ROOT / "observability/alerts/moe-training.rules.yaml").read_text()
    assert jobs == {"dcgm", "node"} and all(f'job="{job}"' in rules for job in jobs)
