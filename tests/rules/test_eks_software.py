"""rules/eks.py: one place for every version, and the plugin selectors derived from the groups."""

from __future__ import annotations

from conftest import ROOT

from moe_cdk.core import catalog
from moe_cdk.rules import eks as eks_rules

SPECS = [catalog.lookup(t) for t in ("ml.m5.2xlarge", "ml.p5en.48xlarge", "ml.p5.48xlarge", "ml.trn2.48xlarge")]


def test_docs_table_is_generated_from_the_module():
    assert (ROOT / "docs/eks-software.md").read_text() == eks_rules.reference_table(), (
        "docs/eks-software.md is stale; run `make docs`"
    )


def test_every_chart_is_pinned():
    assert all(chart.version for chart in eks_rules.CHARTS)


def test_efa_selector_lists_exactly_the_efa_types():
    assert eks_rules.efa_instance_types(SPECS) == ["ml.p5.48xlarge", "ml.p5en.48xlarge", "ml.trn2.48xlarge"]


def test_gpu_and_neuron_selectors_split_by_accelerator():
    assert eks_rules.gpu_instance_types(SPECS) == ["ml.p5.48xlarge", "ml.p5en.48xlarge"]
    assert eks_rules.neuron_instance_types(SPECS) == ["ml.trn2.48xlarge"]


def test_plugins_tolerate_hyperpod_health_taint():
    for values in (
        eks_rules.nvidia_plugin_values(SPECS),
        eks_rules.efa_plugin_values(SPECS),
        eks_rules.dcgm_exporter_values(SPECS),
    ):
        assert eks_rules.HEALTH_TAINT_TOLERATION in values["tolerations"]


def test_dcgm_exporter_is_annotated_for_the_scraper():
    annotations = eks_rules.dcgm_exporter_values(SPECS)["podAnnotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9400", "moe-cdk/job": "dcgm"}


def test_plugins_tolerate_the_configured_taints():
    custom = {"key": "moe-cdk/dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
    for values in (
        eks_rules.nvidia_plugin_values(SPECS, [custom]),
        eks_rules.efa_plugin_values(SPECS, [custom]),
        eks_rules.dcgm_exporter_values(SPECS, [custom]),
    ):
        assert custom in values["tolerations"]


def test_node_exporter_runs_on_every_node_and_is_scraped():
    values = eks_rules.node_exporter_values(SPECS)
    assert values["tolerations"] == [{"operator": "Exists"}]
    assert values["podAnnotations"]["prometheus.io/scrape"] == "true"


def test_neuron_plugin_runs_on_the_trainium_types_the_chart_reads():
    # Neuron's only published chart source (neuron-helm-charts@8172e5e) takes the plugin's node affinity from
    # neuronInstances, whose default names no ml. type.
    assert eks_rules.neuron_plugin_values(SPECS)["neuronInstances"] == ["ml.trn2.48xlarge"]


def test_neuron_plugin_registers_neurondevice_only_when_asked():
    plain = eks_rules.neuron_plugin_values(SPECS)["devicePlugin"]
    teams = eks_rules.neuron_plugin_values(SPECS, resource=eks_rules.NEURON_DEVICE_RESOURCE)["devicePlugin"]
    assert "image" not in plain
    assert teams["image"] == {"tag": "2.19.16.0"}
