"""The lifecycle's Slurm steps, and the batch script's HyperPod path, run for real against a
Slurm laid out as HyperPod's.

The cluster (slurm_harness.SlurmCluster) keeps slurm.conf and plugstack.conf in the node
sandbox's ``opt/slurm/etc``, as HyperPod's nodes keep them under /opt/slurm, and runs
configless: each slurmd starts with ``--conf-server`` and caches what slurmctld sends, as
AWS's start_slurm.sh starts them. Both virtual nodes share the one sandbox (one machine), so a
step run "on the controller" and "on a compute node" changes the same files. Only ``hostname``
and the lustre/AWS commands stay stubbed; ``scontrol`` and ``strigger`` are Slurm's own.

pyxis is not packaged for Debian, so a stand-in SPANK plugin (tests/fixtures/spank_standin.c,
built here from libslurm-dev's spank.h) takes its place in the plugstack: it adds the
``--container-image`` option and passes the value to each task.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from node_packages import spank_standin  # noqa: E402
from slurm_harness import TERMINAL_STATES, SlurmCluster, SlurmUnavailable  # noqa: E402
from test_lifecycle_scripts import Sandbox, succeeded  # noqa: E402

from moe_cdk.jobs.slurm_job import SlurmJobSpec, render_sbatch  # noqa: E402

SPANK_HEADER = Path("/usr/include/slurm/spank.h")
COMPUTE, CONTROLLER = "i-0456", "i-0123"  # instance ids of gpu-1 and controller-1 in resource_config()


def node_sandbox(base: Path, instance_id: str) -> Sandbox:
    """A node sandbox whose Slurm commands are the real ones."""
    box = Sandbox(base, instance_id=instance_id)
    for name in ("scontrol", "strigger"):
        (box.bin / name).unlink()
    return box


def as_node(box: Sandbox, instance_id: str) -> None:
    box.write("sys/devices/virtual/dmi/id/board_asset_tag", instance_id + "\n")


def step(box: Sandbox, slurm: SlurmCluster, script: str) -> subprocess.CompletedProcess:
    """Run one lifecycle script on the node as node1 (the compute node's Slurm name)."""
    return succeeded(box.run("bash", str(box.lc / script), SLURM_CONF=str(slurm.conf), MOE_STUB_HOSTNAME="node1"))


def features(slurm: SlurmCluster, node: str) -> str:
    return slurm.run("sinfo", "-h", "-n", node, "-o", "%f").stdout.strip()


@pytest.fixture
def box(tmp_path) -> Sandbox:
    return node_sandbox(tmp_path / "node", COMPUTE)


@pytest.fixture
def slurm(box):
    try:
        with SlurmCluster(configless=True, etc_dir=box.root / "opt/slurm/etc") as cluster:
            yield cluster
    except SlurmUnavailable as error:
        pytest.fail(f"a real Slurm is needed for this test: {error}")


def test_features_survive_reconfigure_through_the_controllers_trigger(box, slurm):
    step(box, slurm, "slurm_features.sh")
    assert features(slurm, "node1") == "efa,p5en,gpu"
    # The finding: scontrol reconfigure resets features set with scontrol to slurm.conf's.
    assert slurm.run("scontrol", "reconfigure").returncode == 0
    assert features(slurm, "node1") == "efa,cpu"
    as_node(box, CONTROLLER)
    step(box, slurm, "slurm_features.sh")
    assert "slurm_features.sh --reapply" in slurm.run("strigger", "--get").stdout
    assert slurm.run("scontrol", "reconfigure").returncode == 0
    deadline = time.monotonic() + 90  # slurmctld checks its triggers about every 15 s
    while features(slurm, "node1") != "efa,p5en,gpu":
        assert time.monotonic() < deadline, f"features not restored: {features(slurm, 'node1')}\n{slurm.log_tail(20)}"
        time.sleep(1)
    assert features(slurm, "node2") == "efa,cpu"  # a node without our Extra is left alone


def test_features_reset_before_the_trigger_existed_are_restored_by_the_controllers_step(box, slurm):
    # The nodes' lifecycles run side by side: a compute node can set its features before the
    # controller's setup_pyxis reconfigures and before its slurm_features step sets the trigger.
    step(box, slurm, "slurm_features.sh")
    assert slurm.run("scontrol", "reconfigure").returncode == 0
    assert features(slurm, "node1") == "efa,cpu"
    as_node(box, CONTROLLER)
    step(box, slurm, "slurm_features.sh")
    assert features(slurm, "node1") == "efa,p5en,gpu"


@pytest.fixture
def standin_plugin(tmp_path) -> Path:
    if not SPANK_HEADER.is_file():
        install = [
            "apt-get",
            "-o",
            "DPkg::Lock::Timeout=300",
            "install",
            "-y",
            "--no-install-recommends",
            "libslurm-dev",
        ]
        subprocess.run(install, capture_output=True, check=False)
    assert SPANK_HEADER.is_file(), "libslurm-dev (Slurm's spank.h) is needed: make system-packages installs it"
    return spank_standin(tmp_path)


def register_standin_pyxis(box: Sandbox, slurm: SlurmCluster, plugin: Path) -> None:
    """Install the stand-in as pyxis's shipped pyxis.conf, then run setup_pyxis.sh on the controller."""
    box.write("usr/local/share/pyxis/pyxis.conf", f"required {plugin}\n")
    as_node(box, CONTROLLER)
    step(box, slurm, "setup_pyxis.sh")


def test_pyxis_registered_on_the_controller_loads_on_every_configless_node(box, slurm, standin_plugin):
    before = slurm.run("srun", "-N2", "--container-image=x", "true", timeout=60)
    assert before.returncode != 0 and "unrecognized option" in before.stderr
    register_standin_pyxis(box, slurm, standin_plugin)
    job = slurm.run(
        "srun",
        "-N2",
        "--container-image=123456789012.dkr.ecr.us-east-2.amazonaws.com#moe:1",
        "printenv",
        "MOE_STANDIN_IMAGE",
        timeout=60,
    )
    assert job.returncode == 0, job.stderr + slurm.log_tail(20)
    assert job.stdout.split() == ["123456789012.dkr.ecr.us-east-2.amazonaws.com#moe:1"] * 2


def test_batch_script_asks_for_auto_resume_on_hyperpod_nodes_only(tmp_path, box, slurm, standin_plugin):
    # Slurm 22.05 has no --auto-resume (HyperPod's srun adds it), so srun refusing the option
    # shows it was passed; without the HyperPod marker the step gets past option parsing.
    register_standin_pyxis(box, slurm, standin_plugin)
    marker = tmp_path / "sagemaker_cluster"
    marker.mkdir()
    logs = {}
    for name, folder in (("hyperpod", marker), ("elsewhere", tmp_path / "absent")):
        spec = SlurmJobSpec(
            job_name=name,
            nodes=2,
            tasks_per_node=1,
            partition="ci",
            time_limit="00:10:00",
            container_image="localhost:5000/moe:1",
            train_config="moe.yaml",
            requeue=False,
            hyperpod_marker=str(folder),
        )
        script = tmp_path / f"{name}.sh"
        script.write_text(render_sbatch(spec))
        job = slurm.submit(script)
        slurm.wait_for(job, TERMINAL_STATES, timeout=60)
        logs[name] = (tmp_path / f"{name}-{job}.out").read_text()
    assert "srun --auto-resume=1" in logs["hyperpod"] and "unrecognized option '--auto-resume=1'" in logs["hyperpod"]
    assert "auto-resume" not in logs["elsewhere"] and "trainer exited with" in logs["elsewhere"]
