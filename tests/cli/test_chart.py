"""``make hyperpod-chart``'s command line: nothing to stage outside EKS, and a bad file reported by key."""

from __future__ import annotations

from conftest import ROOT

from moe_cdk.cli import chart


def test_non_eks_configurations_stage_nothing(capsys):
    assert chart.main(["--config", str(ROOT / "config/default.yaml")]) == 0
    assert "no HyperPod dependencies chart to stage" in capsys.readouterr().out


def test_a_bad_configuration_is_reported_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    assert chart.main(["--config", str(bad)]) == 2
    assert "region: required key is missing" in capsys.readouterr().err
