"""The default (Slurm) deployment's observability: Managed Prometheus with the alert rules, Managed Grafana with
the dashboards, and what the nodes need to remote-write, wired through the configuration without a value typed twice."""

from __future__ import annotations

import json

from conftest import ROOT, resources_of_type

from moe_cdk.stacks._shared import remote_write_parameter_name
from moe_cdk.training.config import load_train_config


def _cluster(default_synth) -> dict:
    return default_synth[1]["moe-cluster"]


def _parameters(default_synth) -> dict:
    (found,) = default_synth[0].glob("asset.*/provisioning_parameters.json")
    return json.loads(found.read_text())


def test_the_shipped_rules_file_is_deployed_as_is(default_synth):
    (namespace,) = resources_of_type(_cluster(default_synth), "AWS::APS::RuleGroupsNamespace").values()
    assert namespace["Properties"]["Data"] == (ROOT / "observability/alerts/moe-training.rules.yaml").read_text()


def test_the_moe_and_cluster_dashboards_are_provisioned(default_synth):
    (dashboards,) = resources_of_type(_cluster(default_synth), "Custom::GrafanaDashboards").values()
    shipped = {
        "moe-training.json": ROOT / "charts/moe-training/dashboards/moe-training.json",
        "hyperpod-cluster.json": ROOT / "observability/dashboards/hyperpod-cluster.json",
    }
    deployed = dashboards["Properties"]["Dashboards"]
    assert sorted(deployed) == sorted(shipped)
    for name, path in shipped.items():
        assert json.loads(deployed[name]) == json.loads(path.read_text())


def test_nodes_read_the_remote_write_url_from_the_parameter_the_stack_writes(default_synth, default_config):
    cluster = _cluster(default_synth)
    name = remote_write_parameter_name(default_config)
    ((logical, parameter),) = resources_of_type(cluster, "AWS::SSM::Parameter").items()
    assert parameter["Properties"]["Name"] == name
    assert _parameters(default_synth)["observability"] == {
        "remote_write_url_parameter": name,
        "scrape_interval_s": default_config.observability.scrape_interval_s,
        "trainer_metrics_port": load_train_config(default_config.training.path).metrics.prometheus_port,
    }
    (hyperpod,) = resources_of_type(cluster, "AWS::SageMaker::Cluster").values()
    assert logical in hyperpod["DependsOn"]


def test_the_node_role_may_remote_write_and_pull_the_exporter_images(default_synth):
    statements = [
        s
        for p in resources_of_type(_cluster(default_synth), "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    (write,) = [s for s in statements if s["Action"] == "aps:RemoteWrite"]
    assert write["Resource"]["Fn::GetAtt"][1] == "Arn"
    pulls = [r for s in statements if "ecr:BatchGetImage" in s["Action"] for r in s["Resource"]]
    assert "arn:aws:ecr:us-east-2:602401143452:repository/hyperpod/*" in pulls
