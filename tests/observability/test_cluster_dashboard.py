"""The HyperPod cluster dashboard (observability/dashboards/hyperpod-cluster.json) against what the exporters export.

A query naming a metric no exporter has shows "No data", and nobody notices. The metric names below
are the exporters' own:

* moe-cdk's Slurm exporter (job ``slurm``): ``moe_slurm_*``.
* NVIDIA's DCGM exporter (job ``dcgm``) with the field list HyperPod's observability uses:
  aws-samples/awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/
  base-config/observability/dcgm_metrics_config/dcgm-metrics-basic.csv at
  7217859f67bc693c52ff175ccc6082c41dbd7a1b (each of the five names below is a line of that file).
* AWS's node_exporter build with the ``amazonefa`` collector (job ``efa``): the same repository at the
  same commit, 4.validation_and_observability/3.efa-node-exporter/amazon_efa_linux.go, which names each
  counter ``node_amazonefa_<counter>`` (namespace ``node``, subsystem ``amazonefa``) with labels
  ``device`` and ``port``; EFA_COUNTERS lists the counters that file pushes.
* node_exporter (job ``node``).

Every target also carries ``job``, ``instance``, ``node`` (the Slurm node name) and ``instance_type``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from grafana_dashboards import expressions, panels

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability/dashboards/hyperpod-cluster.json"

SLURM = {
    "moe_slurm_nodes",
    "moe_slurm_jobs",
    "moe_slurm_node_gpus_total",
    "moe_slurm_node_gpus_allocated",
    "moe_slurm_account_gpus",
}
DCGM = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_XID_ERRORS",
}
# The counters amazon_efa_linux.go pushes with pushCounter (its descriptions map, less "info").
EFA_COUNTERS = {
    "alloc_pd_err",
    "alloc_ucontext_err",
    "cmds_err",
    "completed_cmds",
    "create_ah_err",
    "create_cq_err",
    "create_qp_err",
    "impaired_remote_conn_events",
    "keep_alive_rcvd",
    "lifespan",
    "mmap_err",
    "no_completion_cmds",
    "rdma_read_bytes",
    "rdma_read_resp_bytes",
    "rdma_read_wr_err",
    "rdma_read_wrs",
    "rdma_write_bytes",
    "rdma_write_recv_bytes",
    "rdma_write_wr_err",
    "rdma_write_wrs",
    "recv_bytes",
    "recv_wrs",
    "reg_mr_err",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "rx_bytes",
    "rx_drops",
    "rx_pkts",
    "send_bytes",
    "send_wrs",
    "submitted_cmds",
    "tx_bytes",
    "tx_pkts",
    "unresponsive_remote_events",
}
EFA = {f"node_amazonefa_{counter}" for counter in EFA_COUNTERS}
NODE = {
    "node_cpu_seconds_total",
    "node_memory_MemAvailable_bytes",
    "node_memory_MemTotal_bytes",
    "node_filesystem_avail_bytes",
    "node_filesystem_size_bytes",
}
# Prometheus's own per-target series, for the node variable.
SCRAPE = {"up"}
JOB_OF = {**dict.fromkeys(SLURM, "slurm"), **dict.fromkeys(DCGM, "dcgm"), **dict.fromkeys(EFA, "efa")}
JOB_OF |= dict.fromkeys(NODE, "node")

# PromQL words that are not metric names: aggregation modifiers, binary operators and the like.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def metric_names(expr: str) -> set[str]:
    """The metric names in one PromQL expression (or label_values query)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # range selectors
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)  # label lists
    bare = re.sub(r"label_values\(([^,()]*),[^)]*\)", r"(\1)", bare)  # label_values(metric, label)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        followed_by_call = bare[match.end() :].lstrip().startswith("(")
        if not followed_by_call and match.group() not in PROMQL_WORDS:
            names.add(match.group())
    return names


def _selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric, {label: value}) for every selector with matchers in ``expr``."""
    return [
        (name, dict(re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers)))
        for name, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr)
    ]


def test_metric_names_are_found_and_functions_are_not():
    expr = 'sum by (node) (rate(node_amazonefa_rx_bytes{job="efa",node=~"$node"}[$__rate_interval])) / on (node) up'
    assert metric_names(expr) == {"node_amazonefa_rx_bytes", "up"}
    assert metric_names("label_values(up, node)") == {"up"}


def test_queries_use_only_the_exporters_metrics(dashboard):
    used = {name for expr in expressions(dashboard) for name in metric_names(expr)}
    unknown = used - (SLURM | DCGM | EFA | NODE | SCRAPE)
    assert used and not unknown, f"the dashboard queries metrics no exporter exports: {sorted(unknown)}"


def test_every_required_metric_is_on_the_dashboard(dashboard):
    used = {name for expr in expressions(dashboard) for name in metric_names(expr)}
    required = SLURM | DCGM | NODE | {"node_amazonefa_rx_bytes", "node_amazonefa_tx_bytes"}
    assert not required - used, f"missing from the dashboard: {sorted(required - used)}"
    assert any(name.endswith(("_err", "_drops", "_events")) for name in used & EFA), "no EFA error counter"


def test_each_query_pins_the_job_of_its_metric(dashboard):
    # The EFA exporter is a node_exporter build: without job="node", node_* metrics would count twice.
    for expr in expressions(dashboard):
        for name, labels in _selectors(expr):
            assert labels.get("job") == JOB_OF[name], f"{name} needs job={JOB_OF[name]!r}: {expr}"
        for name in metric_names(expr) - SCRAPE:
            assert any(selected == name for selected, _ in _selectors(expr)), f"{name} without matchers: {expr}"


def test_fsx_space_is_read_at_the_fsx_mountpoint(dashboard):
    for expr in expressions(dashboard):
        for name, labels in _selectors(expr):
            if name.startswith("node_filesystem_"):
                assert labels.get("mountpoint") == "/fsx", expr


def test_rows_in_order(dashboard):
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Slurm", "GPUs", "EFA", "Node"]


def test_panels_lie_in_the_grid_below_their_row(dashboard):
    row_y = None
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert set(grid) == {"x", "y", "w", "h"} and all(isinstance(v, int) for v in grid.values()), panel["title"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            row_y = grid["y"]
        else:
            assert row_y is not None and grid["y"] > row_y, f"{panel['title']} is above its row"


def test_dashboard_shape(dashboard):
    assert isinstance(dashboard["uid"], str) and 0 < len(dashboard["uid"]) <= 40  # Grafana's uid limit
    assert dashboard["title"] and isinstance(dashboard["schemaVersion"], int) and dashboard["id"] is None
    for panel in panels(dashboard["panels"]):
        assert isinstance(panel["id"], int) and panel["type"] and panel["title"], panel
        if panel["type"] != "row":
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), panel["title"]
            assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def test_panel_ids_are_unique(dashboard):
    ids = [p["id"] for p in panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))


def test_every_query_uses_the_datasource_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    queried = [p for p in panels(dashboard["panels"]) if p["type"] != "row"]
    queried += [t for p in queried for t in p["targets"]]
    queried += [v for v in variables.values() if v["type"] == "query"]
    assert queried and all(q["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for q in queried)


def test_node_variable_lists_the_node_label_of_up(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    node = variables["node"]
    assert (node["type"], node["query"], node["multi"], node["includeAll"]) == (
        "query",
        "label_values(up, node)",
        True,
        True,
    )
