"""cluster_software: one place for every version, and the plugin selectors derived from the groups."""

from __future__ import annotations

from moe_cdk.constructs import cluster_software, instance_catalog

from conftest import ROOT

SPECS = [instance_catalog.lookup(t) for t in ("ml.m5.2xlarge", "ml.p5en.48xlarge", "ml.p5.48xlarge", "ml.trn2.48xlarge")]


def test_docs_table_is_generated_from_the_module():
    assert (ROOT / "docs/eks-software.md").read_text() == cluster_software.reference_table(), \
        "docs/eks-software.md is stale; run `make docs`"


def test_every_chart_is_pinned():
    assert all(chart.version for chart in cluster_software.CHARTS)


def test_efa_selector_lists_exactly_the_efa_types():
    assert cluster_software.efa_instance_types(SPECS) == ["ml.p5.48xlarge", "ml.p5en.48xlarge", "ml.trn2.48xlarge"]


def test_gpu_and_neuron_selectors_split_by_accelerator():
    assert cluster_software.gpu_instance_types(SPECS) == ["ml.p5.48xlarge", "ml.p5en.48xlarge"]
    assert cluster_software.neuron_instance_types(SPECS) == ["ml.trn2.48xlarge"]


def test_plugins_tolerate_hyperpod_health_taint():
    for values in (cluster_software.nvidia_plugin_values(SPECS), cluster_software.efa_plugin_values(SPECS),
                   cluster_software.dcgm_exporter_values(SPECS)):
        assert cluster_software.HEALTH_TAINT_TOLERATION in values["tolerations"]


def test_dcgm_exporter_is_annotated_for_the_scraper():
    annotations = cluster_software.dcgm_exporter_values(SPECS)["podAnnotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9400"}


def test_plugins_tolerate_the_configured_taints():
    custom = {"key": "moe-cdk/dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
    for values in (cluster_software.nvidia_plugin_values(SPECS, [custom]), cluster_software.efa_plugin_values(SPECS, [custom]),
                   cluster_software.dcgm_exporter_values(SPECS, [custom])):
        assert custom in values["tolerations"]


def test_node_exporter_runs_on_every_node_and_is_scraped():
    values = cluster_software.node_exporter_values(SPECS)
    assert values["tolerations"] == [{"operator": "Exists"}]
    assert values["podAnnotations"]["prometheus.io/scrape"] == "true"
