"""The Slurm node setup over every variant AWS's sources leave open, each run for real.

AWS's sources disagree or say nothing about four facts of a HyperPod Slurm node, so each is
varied and every combination (16) runs the whole lifecycle (on_create.sh) on a controller and a
compute node against a real Slurm 22.05 laid out as HyperPod's (tests/slurm_harness.py,
configless):

- ``SlurmUser``: ``root``, or ``slurm`` (AWS's HyperPod accounting scripts write SlurmUser=slurm);
- Slurm ``up`` before the lifecycle, or ``late``: its daemons start a minute after it began
  ("OnInitComplete and lifecycle scripts can run before or in parallel with Slurm service
  startup", AWS's detect-node README);
- enroot and pyxis ``present`` (the AMI installed them), or ``absent`` (the node installs them
  from node_packages.txt: here stand-ins, tests/lifecycle_scripts/node_packages.py);
- pyxis ``registered`` in the controller's plugstack.conf already, or ``unregistered``.

A combination passes when both nodes' lifecycles exit 0 with a step record "ok" for every step,
and then every feature works: the compute node's Slurm features are set and survive
``scontrol reconfigure`` (through the trigger the controller registered as SlurmUser; the controller
itself reconfigures only a slurmctld that read the old plugstack.conf),
``srun --container-image`` on both nodes reaches the plugin, and enroot runs. The combinations
run side by side (each its own cluster, ports and sandbox), so the minute of the late ones is
paid once. Each test below reads one property of one combination from that shared run.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from node_packages import enroot_debs, pyxis_repo, spank_standin  # noqa: E402
from slurm_harness import SlurmCluster, SlurmUnavailable  # noqa: E402
from test_lifecycle_scripts import Sandbox  # noqa: E402

COMPUTE, CONTROLLER = "10.0.64.11", "10.0.64.10"  # gpu-1 and controller-1 in resource_config()
LATE_START_S = 60.0
FEATURES = "efa,p5en,gpu"
IMAGE = "123456789012.dkr.ecr.us-east-2.amazonaws.com#moe:1"
ALL_STEPS = ["validate", "node_info", "efa_env", "mount_fsx", "setup_pyxis", "slurm_features", "teams", "observability"]


@dataclass(frozen=True)
class Variant:
    slurm_user: str
    start: str
    containers: str
    registration: str

    @property
    def id(self) -> str:
        return f"SlurmUser={self.slurm_user}-{self.start}-{self.containers}-{self.registration}"


VARIANTS = [
    Variant(*combination)
    for combination in itertools.product(
        ("root", "slurm"), ("up", "late"), ("present", "absent"), ("registered", "unregistered")
    )
]


@dataclass
class Outcome:
    """What one variant's run observed."""

    runs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    records: dict[str, list[dict]] = field(default_factory=dict)
    slurm_user: str = ""
    features_after_setup: str = ""
    features_after_reconfigure: str = ""
    srun: subprocess.CompletedProcess | None = None
    enroot: subprocess.CompletedProcess | None = None
    error: str = ""

    def explain(self) -> str:
        parts = [self.error] if self.error else []
        for node, run in self.runs.items():
            parts.append(f"--- {node}: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        return "\n".join(parts)


def _node(box: Sandbox, address: str, path: str, slurm: SlurmCluster) -> subprocess.Popen:
    """Start on_create.sh as the node with this address. Both nodes share the one sandbox (one machine)
    and may run at once, so each finds itself by its address (node_info.py's `hostname -I` path), not
    by the shared DMI asset tag."""
    env = box.env(PATH=path, SLURM_CONF=str(slurm.conf), MOE_STUB_HOSTNAME="node1", MOE_STUB_IPS=address)
    return subprocess.Popen(
        ["bash", str(box.lc / "on_create.sh")],
        cwd=box.base,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n(killed after {timeout}s: the lifecycle hung)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _wait_for_log(box: Sandbox, text: str, proc: subprocess.Popen, timeout: float) -> None:
    log = box.root / "var/log/provision/moe-cdk-lifecycle.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.5)


def _features(slurm: SlurmCluster) -> str:
    return slurm.run("sinfo", "-h", "-n", "node1", "-o", "%f").stdout.strip()


def _run_variant(variant: Variant, base: Path, plugin: Path, packages: tuple) -> Outcome:
    outcome = Outcome()
    box = Sandbox(base / variant.id, instance_id=None)
    for name in ("scontrol", "strigger"):
        (box.bin / name).unlink()
    (box.root / "opt/slurm/etc").mkdir(parents=True)
    path = box.env()["PATH"]
    if variant.containers == "present":
        box.write("usr/local/share/pyxis/pyxis.conf", f"required {plugin}\n")
    else:
        path = box.without("enroot")
        (box.root / "usr/local/share/pyxis/pyxis.conf").unlink()
        (box.root / "usr/local/lib/slurm/spank_pyxis.so").unlink()
        (box.root / "opt/slurm/include").symlink_to("/usr/include")
        box.pin_packages(enroot=packages[0], pyxis=packages[1])
    if variant.registration == "registered":
        link = box.root / "opt/slurm/etc/plugstack.conf.d/pyxis.conf"
        link.parent.mkdir(parents=True)
        link.symlink_to(box.root / "usr/local/share/pyxis/pyxis.conf")
        box.write("opt/slurm/etc/plugstack.conf", f"include {link}\n")
    late = LATE_START_S if variant.start == "late" else None
    try:
        with SlurmCluster(
            configless=True, etc_dir=box.root / "opt/slurm/etc", slurm_user=variant.slurm_user, launch_after_s=late
        ) as slurm:
            controller = _node(box, CONTROLLER, path, slurm)
            if late:
                # The compute node starts while the controller waits for Slurm (its install work done),
                # so both wait for the late daemons, as a real cluster's nodes run side by side.
                _wait_for_log(box, "] waiting for ", controller, timeout=60)
                compute = _node(box, COMPUTE, path, slurm)
                outcome.runs["controller"] = _finish(controller, timeout=300)
                outcome.runs["compute"] = _finish(compute, timeout=300)
            else:
                outcome.runs["controller"] = _finish(controller, timeout=300)
                outcome.runs["compute"] = _finish(_node(box, COMPUTE, path, slurm), timeout=300)
            slurm.wait_launched()
            outcome.records = {node: box.records(run) for node, run in outcome.runs.items()}
            config = slurm.run("scontrol", "show", "config").stdout
            outcome.slurm_user = next(
                (
                    line.split("=")[1].split("(")[0].strip()
                    for line in config.splitlines()
                    if line.startswith("SlurmUser")
                ),
                "",
            )
            outcome.features_after_setup = _features(slurm)
            slurm.run("scontrol", "reconfigure")
            deadline = time.monotonic() + 90  # slurmctld runs its triggers about every 15 s
            while _features(slurm) != FEATURES and time.monotonic() < deadline:
                time.sleep(1)
            outcome.features_after_reconfigure = _features(slurm)
            outcome.srun = slurm.run(
                "srun", "-N2", f"--container-image={IMAGE}", "printenv", "MOE_STANDIN_IMAGE", timeout=60
            )
            outcome.enroot = subprocess.run(
                ["enroot", "version"], env=box.env(PATH=path), capture_output=True, text=True
            )
    except (SlurmUnavailable, OSError, subprocess.SubprocessError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
    return outcome


@pytest.fixture(scope="module")
def matrix() -> dict[str, Outcome]:
    # The trigger program runs as SlurmUser, which must read the sandbox: not under pytest's 0700 tmp_path.
    base = Path(tempfile.mkdtemp(prefix="moeci-matrix-"))
    base.chmod(0o755)
    try:
        shared = base / "shared"
        shared.mkdir()
        plugin = spank_standin(shared)
        packages = (enroot_debs(shared / "enroot"), pyxis_repo(shared / "pyxis"))
        lock = threading.Lock()
        outcomes: dict[str, Outcome] = {}

        def run(variant: Variant) -> None:
            outcome = _run_variant(variant, base, plugin, packages)
            with lock:
                outcomes[variant.id] = outcome

        with ThreadPoolExecutor(max_workers=len(VARIANTS)) as pool:
            list(pool.map(run, VARIANTS))
        yield outcomes
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_both_nodes_come_up_with_every_step_ok(matrix, variant):
    outcome = matrix[variant.id]
    assert not outcome.error and {n: r.returncode for n, r in outcome.runs.items()} == {
        "controller": 0,
        "compute": 0,
    }, outcome.explain()
    for node, records in outcome.records.items():
        expected = ALL_STEPS if node == "controller" else ALL_STEPS[:4] + ["setup_enroot"] + ALL_STEPS[4:]
        assert [(r["step"], r["outcome"]) for r in records] == [(s, "ok") for s in expected], node


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_slurm_runs_as_the_varied_user(matrix, variant):
    assert matrix[variant.id].slurm_user == variant.slurm_user, matrix[variant.id].explain()


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_features_are_set_and_survive_reconfigure(matrix, variant):
    outcome = matrix[variant.id]
    assert (outcome.features_after_setup, outcome.features_after_reconfigure) == (FEATURES, FEATURES), outcome.explain()


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_srun_container_image_reaches_the_plugin_on_both_nodes(matrix, variant):
    srun = matrix[variant.id].srun
    assert srun is not None and srun.returncode == 0, matrix[variant.id].explain() + (srun.stderr if srun else "")
    assert srun.stdout.split() == [IMAGE, IMAGE]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_enroot_runs(matrix, variant):
    enroot = matrix[variant.id].enroot
    assert enroot is not None and enroot.returncode == 0 and enroot.stdout.strip(), matrix[variant.id].explain()


UNREGISTERED = [v for v in VARIANTS if v.registration == "unregistered"]


@pytest.mark.parametrize("variant", UNREGISTERED, ids=lambda v: v.id)
def test_the_controller_reconfigures_only_a_slurmctld_that_read_the_old_plugstack(matrix, variant):
    # A late slurmctld reads the new plugstack.conf at its start: a reconfigure then would reach only the
    # slurmd daemons starting with it, which Slurm 22.05 can crash (SIGSEGV, seen here in CI).
    controller = matrix[variant.id].runs["controller"].stdout
    reconfigured = "scontrol reconfigure: the nodes fetch the new plugstack.conf" in controller
    skipped = "after plugstack.conf changed: the nodes fetch the new file from it; no reconfigure" in controller
    assert (reconfigured, skipped) == (variant.start == "up", variant.start == "late"), controller[-3000:]
