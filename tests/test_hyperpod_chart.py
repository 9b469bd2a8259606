"""`make hyperpod-chart`: staging AWS's HyperPod dependencies chart with real git and helm,
from a local repository laid out like aws/sagemaker-hyperpod-cli (CI cannot reach GitHub)."""

from __future__ import annotations

import subprocess

import pytest

from moe_cdk.constructs import cluster_software
from moe_cdk.stacks import hyperpod_chart

from conftest import ROOT


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A git repository with the chart at cluster_software.HYPERPOD_CHART_PATH; returns (url, commit)."""
    repo = tmp_path_factory.mktemp("hyperpod-cli")
    chart = repo / cluster_software.HYPERPOD_CHART_PATH
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: hyperpod-helm-chart\nversion: 0.1.0\n")
    (chart / "templates/namespace.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: aws-hyperpod\n")
    git("init", "--quiet", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "--allow-empty", "-m", "base", cwd=repo)
    git("add", ".", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", "chart", cwd=repo)
    git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=repo)
    return f"file://{repo}", git("rev-parse", "HEAD", cwd=repo)


def test_chart_is_staged_at_the_pinned_commit(upstream, tmp_path):
    url, commit = upstream
    staged = hyperpod_chart.stage(tmp_path / "chart", repository=url, ref=commit)
    assert (staged / "Chart.yaml").is_file() and (staged / "templates/namespace.yaml").is_file()
    assert (staged / ".moe-cdk-ref").read_text() == f"{url} {commit}\n"


def test_a_failed_fetch_leaves_the_previous_chart_alone(upstream, tmp_path):
    url, _ = upstream
    previous = tmp_path / "chart"
    previous.mkdir()
    (previous / "Chart.yaml").write_text("kept\n")
    with pytest.raises(subprocess.CalledProcessError):
        hyperpod_chart.stage(previous, repository=url, ref="0" * 40)
    assert (previous / "Chart.yaml").read_text() == "kept\n"


def test_non_eks_configurations_stage_nothing(capsys):
    assert hyperpod_chart.main(["--config", str(ROOT / "config/default.yaml")]) == 0
    assert "no HyperPod dependencies chart to stage" in capsys.readouterr().out


def test_a_bad_configuration_is_reported_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    assert hyperpod_chart.main(["--config", str(bad)]) == 2
    assert "region: required key is missing" in capsys.readouterr().err
