"""MetricsSink: the JSONL file, the Prometheus endpoint and the probe files."""

from __future__ import annotations

import json
import urllib.request

import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from moe_cdk.training.metrics import MetricsSink, peak_tflops_for

RECORD = {
    "step": 3,
    "loss": 2.5,
    "tokens_per_s": 1000.0,
    "dispatch_time_s": 0.01,
    "mfu": None,
    "tokens_per_expert": [[10, 30], [20, 20]],
    "expert_imbalance": [1.5, 1.0],
    "router_entropy": [0.6, 0.69],
}


def _sink(tmp_path, rank=0, **kwargs) -> MetricsSink:
    return MetricsSink(rank=rank, **({"max_steps": 10} | kwargs))


def test_records_are_appended_as_json_lines(tmp_path):
    sink = _sink(tmp_path, jsonl=str(tmp_path / "m.jsonl"))
    sink.write(RECORD)
    sink.write({**RECORD, "step": 4})
    sink.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [3, 4]


def test_prometheus_endpoint_serves_the_latest_record(tmp_path):
    port = free_port()
    sink = _sink(tmp_path, prometheus_port=port)
    try:
        sink.write(RECORD)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        sink.close()
    lines = body.splitlines()
    assert "moe_train_loss 2.5" in lines
    # prometheus_client writes labels in name order and every value as a float: {expert="1",layer="0"} 30.0.
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert samples[("moe_train_tokens_per_expert", (("expert", "1"), ("layer", "0")))] == 30
    assert 'moe_train_expert_imbalance{layer="0"} 1.5' in lines
    assert not any(line.startswith("moe_train_mfu") for line in lines)


def test_prometheus_text_has_gauges_with_help_and_nothing_before_the_first_record(tmp_path):
    sink = _sink(tmp_path)
    assert sink.prometheus_text() == ""
    sink.write({**RECORD, "load_balancing_loss": [], "expert_imbalance": [None, 1.0]})
    families = {f.name: f for f in text_string_to_metric_families(sink.prometheus_text())}
    assert {f.type for f in families.values()} == {"gauge"} and all(f.documentation for f in families.values())
    assert "moe_train_mfu" not in families and "moe_train_load_balancing_loss" not in families
    assert [(s.labels, s.value) for s in families["moe_train_expert_imbalance"].samples] == [({"layer": "1"}, 1.0)]
    assert len(families["moe_train_tokens_per_expert"].samples) == 4


def test_probe_files_are_touched_on_every_rank(tmp_path):
    sink = _sink(
        tmp_path, rank=1, readiness_file=str(tmp_path / "probe/ready"), liveness_file=str(tmp_path / "probe/alive")
    )
    sink.write(RECORD)
    assert (tmp_path / "probe/ready").is_file() and (tmp_path / "probe/alive").is_file()


def test_other_ranks_write_no_records(tmp_path):
    sink = _sink(tmp_path, rank=1, jsonl=str(tmp_path / "m.jsonl"))
    sink.write(RECORD)
    assert not (tmp_path / "m.jsonl").exists()


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("Tesla T4", None),
    ],
)
def test_peak_figure_matches_the_part_not_a_substring_of_it(name, tflops):
    # An H100 PCIe or NVL part must not get the SXM part's 989 TFLOP/s.
    assert peak_tflops_for(name) == tflops


def test_the_step_line_has_lr_grad_norm_step_time_and_an_eta(tmp_path, caplog):
    sink = _sink(tmp_path)
    with caplog.at_level("INFO", logger="moe_cdk.training.metrics"):
        sink.write({**RECORD, "lr": 3e-4, "grad_norm": 1.25, "step_time_s": 0.5})
    assert caplog.messages == [
        "step 3/10 loss 2.5000 tokens/s 1000 imbalance 1.50 dispatch 10.0ms "
        "lr 0.0003 grad_norm 1.250 step_time 0.50s eta 0:00:04"
    ]


def test_the_eta_follows_the_mean_pace_since_the_first_record(tmp_path, caplog, monkeypatch):
    clock = iter([100.0, 110.0])
    monkeypatch.setattr("moe_cdk.training.metrics.time.monotonic", lambda: next(clock))
    sink = _sink(tmp_path)
    with caplog.at_level("INFO", logger="moe_cdk.training.metrics"):
        sink.write({**RECORD, "step_time_s": 0.5})
        sink.write({**RECORD, "step": 5, "step_time_s": 0.5})  # 10 s for 2 steps: 5 s each, 5 steps left
    assert caplog.messages[-1].endswith("step_time 0.50s eta 0:00:25")
