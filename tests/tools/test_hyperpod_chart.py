"""`make hyperpod-chart`: staging AWS's HyperPod dependencies chart with real git and helm,
from a local repository laid out like aws/sagemaker-hyperpod-cli (CI cannot reach GitHub)."""

from __future__ import annotations

import subprocess

import pytest

from moe_cdk.rules import eks as eks_rules
from moe_cdk.tools import hyperpod_chart


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A git repository with the chart at eks_rules.HYPERPOD_CHART_PATH; returns (url, commit)."""
    repo = tmp_path_factory.mktemp("hyperpod-cli")
    chart = repo / eks_rules.HYPERPOD_CHART_PATH
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: hyperpod-helm-chart\nversion: 0.1.0\n")
    (chart / "templates/namespace.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: aws-hyperpod\n"
    )
    git("init", "--quiet", cwd=repo)
    git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.com",
        "commit",
        "--quiet",
        "--allow-empty",
        "-m",
        "base",
        cwd=repo,
    )
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
