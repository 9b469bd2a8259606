"""The Grafana dashboard (charts/moe-training/dashboards/moe-training.json) against the trainer's real exporter.

A dashboard that queries a metric or label the trainer no longer exports shows "No data" and nobody notices.
These tests feed a record with exactly the trainer's keys (read from trainer.py and MoEProbe.collect) through
``MetricsSink.prometheus_text()`` and check the dashboard's queries against what comes out.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from grafana_dashboards import expressions, panels

from moe_cdk.training.metrics import MetricsSink

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts/moe-training/dashboards/moe-training.json"
SCRAPE_LABELS = {"job", "instance", "namespace", "pod"}  # added by the Prometheus scraper, not the exporter

# One step's record as the trainer writes it on a GPU (mfu known), 2 MoE layers of 4 experts.
RECORD = {
    "step": 20,
    "loss": 2.5,
    "lm_loss": 2.5,
    "load_balancing_loss": [1.02, 1.05],
    "z_loss": [0.3, 0.31],
    "tokens_per_expert": [[100, 120, 90, 90], [80, 100, 110, 110]],
    "expert_imbalance": [1.2, 1.1],
    "router_entropy": [1.3, 1.35],
    "router_entropy_max": 1.38629,
    "dispatch_time_s": 0.05,
    "lr": 3e-4,
    "grad_norm": 0.8,
    "step_time_s": 1.2,
    "tokens_per_s": 54613.33,
    "mfu": 0.31,
    "peak_memory_gib": 61.2,
}


def _dict_keys(path: Path, marker: str) -> list[str | None]:
    """Keys of the dict literal in ``path`` that has the key ``marker`` (None for a ``**`` unpacking)."""
    found = [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == marker for k in node.keys)
    ]
    assert len(found) == 1, f"expected one dict literal with {marker!r} in {path}"
    return [k.value if isinstance(k, ast.Constant) else None for k in found[0].keys]


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _dashboard_metrics(dashboard: dict) -> set[str]:
    return {name for expr in expressions(dashboard) for name in re.findall(r"\bmoe_train_\w+", expr)}


def _exported() -> dict[str, set[str]]:
    """Metric name -> label names, from the exporter's text for RECORD."""
    sink = MetricsSink(rank=0, max_steps=10)
    sink.latest = RECORD
    series: dict[str, set[str]] = {}
    for line in sink.prometheus_text().splitlines():
        if line.startswith("#"):  # prometheus_client's # HELP and # TYPE lines
            continue
        name, labels = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line).groups()
        series.setdefault(name, set()).update(re.findall(r'(\w+)="', labels or ""))
    return series


def test_record_has_exactly_the_keys_the_trainer_writes():
    trainer_keys = _dict_keys(ROOT / "training/step/trainer.py", "tokens_per_s")
    probe_keys = _dict_keys(ROOT / "training/metrics.py", "tokens_per_expert")
    assert trainer_keys.count(None) == 1, "the trainer's record should unpack MoEProbe.collect() once"
    expected = [k for k in trainer_keys if k is not None] + probe_keys
    assert sorted(RECORD) == sorted(expected)


def test_every_dashboard_metric_is_exported(dashboard):
    unknown = _dashboard_metrics(dashboard) - _exported().keys()
    assert not unknown, f"the dashboard queries metrics the trainer does not export: {sorted(unknown)}"


def test_dashboard_label_matchers_are_exported_labels(dashboard):
    exported = _exported()
    for expr in expressions(dashboard):
        for name, matchers in re.findall(r"\b(moe_train_\w+)\{([^}]*)\}", expr):
            labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers)) - SCRAPE_LABELS
            assert labels <= exported.get(name, set()), f"{name} has no label(s) {sorted(labels)}: {expr}"


def test_required_moe_metrics_are_on_the_dashboard(dashboard):
    required = {
        "tokens_per_expert",
        "expert_imbalance",
        "router_entropy",
        "router_entropy_max",
        "dispatch_time_s",
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "loss",
        "lm_loss",
        "load_balancing_loss",
        "z_loss",
        "peak_memory_gib",
        "grad_norm",
        "lr",
    }
    missing = {f"moe_train_{key}" for key in required} - _dashboard_metrics(dashboard)
    assert not missing, f"missing from the dashboard: {sorted(missing)}"


def test_panel_ids_are_unique(dashboard):
    ids = [p["id"] for p in panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))


def test_every_query_uses_the_datasource_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    queried = [p for p in panels(dashboard["panels"]) if p.get("targets")]
    queried += [t for p in queried for t in p["targets"]]
    queried += [v for v in variables.values() if v["type"] == "query"]
    assert queried and all(q["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for q in queried)
