"""The AMP alert rules (observability/alerts/moe-training.rules.yaml) under promtool, and against the trainer.

``promtool check rules`` proves the file is a valid Prometheus 2.x rules file, the format an
``AWS::APS::RuleGroupsNamespace`` takes. ``promtool test rules`` runs moe-training.test.yaml, which has a firing
and a quiet case for every alert; these tests also check that both cases exist, that changing a threshold or a
``for`` of any alert makes those tests fail, and that the metrics and labels the rules read are the ones
training/metrics.py exports. promtool comes from Debian's ``prometheus`` package (``make system-packages``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from moe_cdk.training.metrics import _HELP, _PREFIX, MetricsSink

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "observability/alerts"
RULES = ALERTS / "moe-training.rules.yaml"
RULE_TESTS = ALERTS / "moe-training.test.yaml"
PROMTOOL_TIMEOUT_S = 60


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _alert_names() -> list[str]:
    return [rule["alert"] for rule in _rules()]


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("promtool is not installed and installing it needs root: run `make system-packages` as root")
    pytest.fail(
        "promtool is not installed. Run `make system-packages` as root, or "
        "`apt-get install -y --no-install-recommends prometheus` (Debian's package carries promtool)."
    )


def _run(promtool: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S, check=False
    )


def test_rules_pass_promtool_check(promtool):
    done = _run(promtool, "check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_rule_unit_tests_pass(promtool):
    done = _run(promtool, "test", "rules", RULE_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr


def _write_copy(tmp_path: Path, rules: list[dict]) -> Path:
    """A copy of the unit tests in ``tmp_path``, beside a copy of the rules file with ``rules`` in its groups."""
    document = yaml.safe_load(RULES.read_text())
    by_alert = {rule["alert"]: rule for rule in rules}
    for group in document["groups"]:
        group["rules"] = [by_alert[rule["alert"]] for rule in group["rules"]]
    (tmp_path / RULES.name).write_text(yaml.safe_dump(document, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    return tmp_path / RULE_TESTS.name


def test_rewritten_copy_still_passes(promtool, tmp_path):
    """The control for the mutation test below: the copy as written back by yaml passes unchanged."""
    done = _run(promtool, "test", "rules", _write_copy(tmp_path, _rules()))
    assert done.returncode == 0, done.stdout + done.stderr


# One threshold (or window) and one `for` of each alert, each moved so that a fixture of the unit tests lands on
# the other side of it; then the rules' guards and label matching, dropped or loosened (the naive `absent()`
# fires on an idle cluster). None replaces the whole field.
MUTATIONS = [
    ("MoEExpertImbalanceHigh", "expr", "> 2", "> 2.7"),
    ("MoEExpertImbalanceHigh", "for", "15m", "10m"),
    ("MoERouterEntropyCollapse", "expr", "< 0.5", "< 0.4"),
    ("MoERouterEntropyCollapse", "for", "30m", "20m"),
    ("MoERouterEntropyCollapse", "expr", "ignoring(layer)", "on(job)"),
    ("MoEAllToAllShareHigh", "expr", "> 0.25", "> 0.35"),
    ("MoEAllToAllShareHigh", "for", "15m", "10m"),
    (
        "MoEAllToAllShareHigh",
        "expr",
        '(moe_train_step_time_s{job="moe-trainer"} > 0)',
        'moe_train_step_time_s{job="moe-trainer"}',
    ),
    ("MoETrainingStalled", "expr", "[15m]) == 0", "[10m]) == 0"),
    ("MoETrainingStalled", "for", "5m", "1m"),
    ("MoETrainingStalled", "expr", "offset 15m", "offset 1m"),
    ("MoETrainingMetricsVanished", "expr", '"}[1h])\n  unless moe_train_step{', '"}[2h])\n  unless moe_train_step{'),
    # Without the finished-run guard, a run that reached its max_steps alerts as vanished.
    ("MoETrainingMetricsVanished", "expr", ">= max_over_time", "> max_over_time"),
    ("MoETrainingMetricsVanished", "for", "5m", "2m"),
    ("MoETrainingMetricsVanished", "expr", 'unless moe_train_step{job="moe-trainer"}', ""),
    ("MoETrainingMetricsVanished", "expr", None, 'absent(moe_train_step{job="moe-trainer"})'),
    ("GpuXidError", "expr", "> 0", "> 79"),
    ("GpuXidError", "for", "0m", "2m"),
    ("FsxLustreLowFreeSpace", "expr", "< 0.10", "< 0.12"),
    ("FsxLustreLowFreeSpace", "for", "15m", "10m"),
    (
        "FsxLustreLowFreeSpace",
        "expr",
        None,
        'node_filesystem_avail_bytes{job="node", fstype="lustre", mountpoint="/fsx"}'
        ' / node_filesystem_size_bytes{job="node", fstype="lustre", mountpoint="/fsx"} < 0.10',
    ),
    (
        "FsxLustreLowFreeSpace",
        "expr",
        None,
        'node_filesystem_avail_bytes{job="node"} / node_filesystem_size_bytes{job="node"} < 0.10',
    ),
]


@pytest.mark.parametrize(
    ("alert", "field", "old", "new"), MUTATIONS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTATIONS)]
)
def test_changed_rule_fails_the_unit_tests(promtool, tmp_path, alert, field, old, new):
    rules = _rules()
    (rule,) = [r for r in rules if r["alert"] == alert]
    if old is None:
        rule[field] = new
    else:
        assert str(rule[field]).count(old) == 1, f"{alert}.{field} no longer holds {old!r} once: {rule[field]!r}"
        rule[field] = str(rule[field]).replace(old, new)
    done = _run(promtool, "test", "rules", _write_copy(tmp_path, rules))
    assert done.returncode != 0, f"the unit tests still pass with {alert}.{field} {old!r} -> {new!r}"
    # promtool names the alert whose expected alerts differ, or the rule whose evaluation failed.
    output = done.stdout + done.stderr
    assert f"alertname: {alert}," in output or f"rule: {alert}," in output, output


def _cases() -> dict[str, set[bool]]:
    """For each alert the unit tests evaluate: whether they expect it firing (True) or quiet (False), or both."""
    found: dict[str, set[bool]] = {}
    for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            found.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    return found


@pytest.mark.parametrize("alert", _alert_names())
def test_every_alert_has_a_firing_and_a_quiet_case(alert):
    assert _cases().get(alert) == {True, False}


def test_unit_tests_name_only_alerts_that_exist():
    """promtool reports no error for an alertname the rules lack: a renamed alert would leave its tests vacuous."""
    assert sorted(set(_cases()) - set(_alert_names())) == []


@pytest.mark.parametrize("alert", _alert_names())
def test_every_alert_has_severity_summary_description_and_for(alert):
    (rule,) = [r for r in _rules() if r["alert"] == alert]
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert set(rule["annotations"]) == {"summary", "description"}
    assert re.fullmatch(r"\d+[mh]", rule["for"])


def _trainer_fields() -> set[str]:
    """Record fields of the trainer's metrics the rules read (``moe_train_<field>``)."""
    return {field for rule in _rules() for field in re.findall(rf"\b{_PREFIX}(\w+)", rule["expr"])}


def test_rules_read_only_metrics_the_trainer_exports():
    fields = _trainer_fields()
    assert fields, f"no {_PREFIX}* metric found in {RULES.name}"
    assert sorted(fields - set(_HELP)) == []


def test_entropy_ratio_labels_match_the_exporter():
    """MoERouterEntropyCollapse divides ``ignoring(layer) group_left``: the entropy must carry ``layer`` and its
    maximum no label at all, as the exporter writes them."""
    sink = MetricsSink(rank=0, max_steps=10)
    sink.write(
        {
            "step": 5,
            "loss": 2.5,
            "expert_imbalance": [None, 1.4],
            "router_entropy": [None, 1.3],
            "router_entropy_max": 1.38629,
            "tokens_per_s": 1000.0,
            "dispatch_time_s": 0.01,
        }
    )
    text = sink.prometheus_text()
    sink.close()
    assert re.findall(rf"^{_PREFIX}router_entropy(?:\{{(.*)\}})? ", text, re.MULTILINE) == ['layer="1"']
    assert re.findall(rf"^{_PREFIX}router_entropy_max(?:\{{(.*)\}})? ", text, re.MULTILINE) == [""]
