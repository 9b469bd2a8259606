"""Shared fixtures: the repository paths, the default configuration, and one synthesized app per run."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# A deprecated aws-cdk-lib API raises instead of printing a warning at every synth (jsii's
# JSII_DEPRECATED=fail), so every test that builds a construct checks that none is used.
os.environ.setdefault("JSII_DEPRECATED", "fail")

import aws_cdk as cdk  # noqa: E402
from survivors import mark_session, survivors  # noqa: E402

from moe_cdk.cli.image_versions import read_image_env  # noqa: E402
from moe_cdk.schema.config import Config, ConfigError, Orchestrator, load_config, parse_config  # noqa: E402
from moe_cdk.stacks.deployment import build_app  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SHIPPED_CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config").glob("*.yaml"))
SESSION = mark_session()
SURVIVOR_GRACE_S = 10.0


def pytest_report_header(config) -> str:
    """Which versions this run tests; tests/test_image_suite.py checks that they are the training image's."""
    image = read_image_env(ROOT / "training/image.env")
    found = f"Python {platform.python_version()}, torch {version('torch')}, megatron-core {version('megatron-core')}"
    return f"versions: {found} (training/image.env: {', '.join(f'{k}={v}' for k, v in image.items())})"


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if any process it started outlives it (orphaned, reparented to init)."""
    deadline = time.monotonic() + SURVIVOR_GRACE_S  # a killed rank's helpers need a moment to notice
    while (left := survivors(SESSION)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{len(left)} process(es) started by the test suite outlived it:", *(f"  {p}" for p in left)]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        else:
            print("\n".join(lines), file=sys.stderr)
        session.exitstatus = 1


@pytest.fixture(scope="session")
def default_config() -> Config:
    return load_config(ROOT / "config/default.yaml")


# Synth needs AWS's HyperPod chart for EKS configurations; only GitHub serves it (`make hyperpod-chart`).
STANDIN_CHART = ROOT / "tests/fixtures/hyperpod-chart-standin"


def with_staged_chart(config: Config) -> Config:
    """``config`` with the test stand-in as its staged HyperPod chart (EKS configurations only)."""
    if config.cluster.orchestrator is not Orchestrator.EKS:
        return config
    return dataclasses.replace(
        config, eks=dataclasses.replace(config.eks, hyperpod_chart_directory=str(STANDIN_CHART.relative_to(ROOT)))
    )


def synth(config: Config, outdir: Path) -> dict[str, dict]:
    """Synthesize ``config`` the way ``make synth`` does (cdk-nag included) and return the templates by stack name;
    an EKS configuration gets the stand-in HyperPod chart."""
    assembly = build_app(with_staged_chart(config), outdir=str(outdir), cloudformation_validation=False).synth()
    return {stack.stack_name: stack.template for stack in assembly.stacks}


CDK_CLI = ROOT / ".venv/cdk-cli/node_modules/.bin/cdk"
"""The CDK CLI that ``make setup`` installs, which ``make synth`` runs."""


def cdk_cli_synth(config_path: Path, outdir: Path) -> subprocess.CompletedProcess:
    """``make synth CONFIG=config_path`` into ``outdir``: the CDK CLI with cdk.json's context, so with
    aws-cdk-lib's built-in CloudFormation validation and cdk-nag; an EKS configuration gets the stand-in
    HyperPod chart (a copy of the file that names it, beside ``outdir``)."""
    config = load_config(config_path)
    if config.cluster.orchestrator is Orchestrator.EKS:
        document = yaml.safe_load(config_path.read_text())
        document.setdefault("eks", {})["hyperpod_chart_directory"] = str(STANDIN_CHART.relative_to(ROOT))
        config_path = outdir.parent / f"{config_path.stem}-standin-chart.yaml"
        config_path.write_text(yaml.safe_dump(document))
    return subprocess.run(
        [str(CDK_CLI), "synth", "--quiet", "-c", f"config={config_path}", "-o", str(outdir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="session")
def default_synth(default_config, tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """The default configuration synthesized once for the whole run: (cdk.out folder, templates)."""
    outdir = tmp_path_factory.mktemp("cdk.out")
    return outdir, synth(default_config, outdir)


def stack_for_test(**env) -> cdk.Stack:
    """A fresh stack in a fresh app, for single-construct tests."""
    app = cdk.App()
    return cdk.Stack(app, "Test", env=cdk.Environment(region=env.get("region", "us-east-2")))


def resources_of_type(template: dict, type_: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def config_errors(base: dict, mutate) -> list[str]:
    """The error lines of the configuration ``base`` (parsed YAML) after ``mutate(copy)``; it must be refused."""
    data = copy.deepcopy(base)
    mutate(data)
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return caught.value.errors


def assert_cfn_lint_clean(region: str, *templates: Path) -> None:
    # W3010 (hard-coded availability zone) is the design: capacity and the file system are
    # pinned to one zone on purpose. W3005 fires on DependsOn that CDK generates itself.
    result = subprocess.run(
        [
            str(ROOT / ".venv/bin/cfn-lint"),
            "--regions",
            region,
            "--ignore-checks",
            "W3010",
            "W3005",
            "--",
            *map(str, templates),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
