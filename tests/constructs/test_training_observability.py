"""TrainingObservability: Managed Prometheus fed by a managed scraper, read by Managed Grafana."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
import yaml
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from moe_cdk.constructs.training_observability import (
    TrainingObservability,
    TrainingObservabilityProps,
    scrape_configuration,
)
from moe_cdk.core.problems import ConfigError

ARN = "arn:aws:eks:us-east-2:123456789012:cluster/t"


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
