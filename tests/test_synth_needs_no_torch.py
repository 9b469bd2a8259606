"""A platform engineer's first commands, `make synth` and `moe-cdk plan`, need no trainer: no torch is installed
for synthesis, and neither synthesis nor plan imports it (issue 42)."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import PYTHON, ROOT, without_torch


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a Python that runs as on a machine without torch."""
    return subprocess.run(
        [PYTHON, "-c", code], cwd=ROOT, env=without_torch(), capture_output=True, text=True, timeout=300
    )


def test_make_synth_installs_no_extra():
    # Not the calling make's flags: the Makefile's own commands, every target remade (-B) as on a fresh machine.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "-n", "-B", "synth"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    installs = [line for line in done.stdout.splitlines() if "pip install" in line]
    assert installs and not [line for line in installs if "[" in line or "torch" in line], installs


def test_plan_runs_without_torch():
    done = _run(
        "import sys; from moe_cdk.cli.main import main; "
        "sys.exit(main(['plan', '--config', 'config/default.yaml', '--json']))"
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_apps_environment_of_the_suites_cdk_cli_synths_has_no_torch():
    # tests/stacks/test_stacks.py synthesizes every shipped configuration through the CDK CLI in this environment
    # (conftest.py cdk_cli_synth), so each of those synths shows that the app needs no torch.
    done = _run("import torch")
    assert done.returncode == 1 and "import of torch halted" in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("config, checked", [("config/parallelcluster.yaml", True), ("config/default.yaml", False)])
def test_make_synth_checks_a_parallelcluster_cluster_with_parallelclusters_code_only(config, checked):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "-n", "-B", "synth", f"CONFIG={config}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    lines = done.stdout.splitlines()
    assert any("--no-deps aws-parallelcluster==3.16.1" in line for line in lines) is checked
    assert any(line.endswith(f"parallelcluster-check --config {config} --cdk-out cdk.out") for line in lines) is checked
    assert not [line for line in lines if "pip install" in line and "torch" in line]
