"""Shared fixtures: the repository paths, the default configuration, and one synthesized app per run."""

from __future__ import annotations

import copy
import dataclasses
import fcntl
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from xdist.scheduler import LoadFileScheduling

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


RUN_DIR = "MOE_CDK_TEST_RUN_DIR"
"""A folder of the whole run, which the pytest-xdist workers share: made by the controller before they start (they
inherit its environment) and removed after them."""


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="moe-cdk-tests-")


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(RUN_DIR), ignore_errors=True)


def pytest_collection_finish(session):
    """Freeze what collection built (``gc.freeze()``): the test modules and what they import (torch, megatron-core,
    the CDK) live as long as the worker. Left in the oldest generation, each full collection walked them again: in one
    worker running 604 tests of tests/constructs, rules, schema, stacks and cli, full collections took 4.5 s of its
    16.5 s of CPU, and 2.3 s of 14.7 s frozen. What the tests allocate is collected as before."""
    gc.freeze()


def once_per_run(name: str, compute: Callable[[], object]) -> object:
    """``compute()``'s result (JSON), computed by the first worker that asks for it and read by the others."""
    path = Path(os.environ[RUN_DIR]) / f"{name}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            path.write_text(json.dumps(compute()))
    return json.loads(path.read_text())


HF_FAMILIES = ("mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v3")

# The work units that take longest, in seconds of one worker's time in a 4-worker run on the 2-core build machine
# (2026-12-05, pytest --durations=0): `make test` starts them first, longest first, so that no worker is left
# running one of them alone at the end. The other units follow, the ones with the most tests first.
LONGEST_UNITS_S = {
    "tests/training/test_trainer.py": 370,
    "tests/lifecycle_scripts/test_teams_slurm.py": 310,
    "tests/lifecycle_scripts/test_lifecycle_scripts.py": 200,
    "tests/training/test_layout_equivalence.py": 190,
    "tests/lifecycle_scripts/test_observability.py": 190,
    "tests/training/test_hf_checkpoint.py::qwen3_moe": 170,
    "tests/training/test_hf_checkpoint.py::qwen2_moe": 160,
    "tests/jobs/test_slurm.py": 150,
    "tests/training/test_hf_checkpoint.py::mixtral": 120,
    "tests/jobs/test_preflight_job.py": 95,
    "tests/lifecycle_scripts/test_node_matrix.py": 80,
    "tests/lifecycle_scripts/test_imds_access.py": 70,
    "tests/training/test_hf_checkpoint.py::deepseek_v3": 65,
    "tests/tools/test_synth_diff.py": 60,
}


def work_unit(nodeid: str) -> str:
    """What one worker runs as a whole under ``make test`` (``--dist loadfile``): a test file, whose module fixtures
    (a Slurm cluster, a trained model) are then built once. Two files are cut finer, where their fixtures allow it:
    test_hf_checkpoint.py by model family (its module fixtures are per family), and each configuration's CDK CLI
    synth in test_stacks.py is a unit of its own (it shares nothing)."""
    path, _, name = nodeid.partition("::")
    parameter = name[name.find("[") + 1 : -1] if name.endswith("]") else ""
    if path == "tests/training/test_hf_checkpoint.py" and parameter in HF_FAMILIES:
        return f"{path}::{parameter}"
    if name.startswith("test_make_synth_passes_and_cfn_lint_is_clean["):
        return nodeid
    return path


class LongestFirst(LoadFileScheduling):
    """``--dist loadfile``, with the work units of :func:`work_unit`, the longest started first."""

    ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)

    def _assign_work_unit(self, node) -> None:
        if not self.ordered:
            units = sorted(self.workqueue.items(), key=lambda unit: (-LONGEST_UNITS_S.get(unit[0], 0), -len(unit[1])))
            self.workqueue.clear()
            self.workqueue.update(units)
            self.ordered = True
        super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config, log):
    return LongestFirst(config, log) if config.getoption("dist") == "loadfile" else None


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


WITHOUT_CLOUDFORMATION_VALIDATION = {"CDK_VALIDATION": "false"}
"""The environment that skips aws-cdk-lib's built-in CloudFormation validation
(core/lib/private/synthesis-validation.js), as ``moe-cdk diff`` does: it changes no template and costs about 6 s of
CPU a synth. For the synths that only compare templates; the CDK CLI synths of every shipped configuration
(``cdk_cli_synth``) run it."""


WITHOUT_TORCH = ROOT / "tests/without_torch"
"""A folder whose sitecustomize.py makes torch unimportable in a Python that has it on PYTHONPATH."""


def without_torch() -> dict[str, str]:
    """This process's environment for a Python that runs as on a machine without torch, as ``make synth`` sets one
    up: importing torch fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WITHOUT_TORCH), env.get("PYTHONPATH")]))
    return env


def cdk_cli_synth(config_path: Path, outdir: Path) -> subprocess.CompletedProcess:
    """``make synth CONFIG=config_path`` into ``outdir``: the CDK CLI with cdk.json's context, so with
    aws-cdk-lib's built-in CloudFormation validation and cdk-nag, and the app run as on a machine that ``make synth``
    set up, without torch (:func:`without_torch`); an EKS configuration gets the stand-in HyperPod chart (a copy of
    the file that names it, beside ``outdir``)."""
    config = load_config(config_path)
    if config.cluster.orchestrator is Orchestrator.EKS:
        document = yaml.safe_load(config_path.read_text())
        document.setdefault("eks", {})["hyperpod_chart_directory"] = str(STANDIN_CHART.relative_to(ROOT))
        config_path = outdir.parent / f"{config_path.stem}-standin-chart.yaml"
        config_path.write_text(yaml.safe_dump(document))
    return subprocess.run(
        [str(CDK_CLI), "synth", "--quiet", "-c", f"config={config_path}", "-o", str(outdir)],
        cwd=ROOT, env=without_torch(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def cdk_cli_synth_once(config_path: Path) -> tuple[int, str, Path]:
    """``cdk_cli_synth`` of a configuration under config/, once per run, for every test that reads it:
    (exit code, the end of its output, its cdk.out folder)."""
    outdir = Path(os.environ[RUN_DIR]) / "cdk-cli" / config_path.stem / "cdk.out"

    def run() -> dict:
        outdir.parent.mkdir(parents=True, exist_ok=True)
        done = cdk_cli_synth(ROOT / "config" / config_path.name, outdir)
        return {"returncode": done.returncode, "output": (done.stdout + done.stderr)[-4000:]}

    done = once_per_run(f"cdk-cli-{config_path.stem}", run)
    return done["returncode"], done["output"], outdir


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
    """cfn-lint through its Python API (cfnlint.api.lint_file: the rules and matches of its command line), so that a
    worker loads its rules and the registry schemas once, not once per call (about 1 s of CPU each)."""
    from cfnlint.api import lint_file
    from cfnlint.config import ManualArgs

    # W3010 (hard-coded availability zone) is the design: capacity and the file system are
    # pinned to one zone on purpose. W3005 fires on DependsOn that CDK generates itself.
    config = ManualArgs(regions=[region], ignore_checks=["W3010", "W3005"])
    found = [str(match) for template in templates for match in lint_file(Path(template), config=config)]
    assert not found, "\n".join(found)
