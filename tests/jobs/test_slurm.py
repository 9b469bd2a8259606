"""The Slurm batch script: golden files, spec validation, and runs on a real two-node Slurm.

The cluster tests start a private Slurm 22.05 (munged, slurmctld, slurmd for node1 and
node2 on this machine; see slurm_harness.py) once for the module and run the rendered
``--local`` script with the tiny MoE on 2 nodes x 1 task (expert parallel 2, gloo).
Regenerate the golden files with ``UPDATE_GOLDEN=1 pytest tests/test_slurm.py -k golden``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_cdk.cli.main import main
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.jobs.slurm_job import SlurmJobSpec, enroot_image, job_spec_from_config, render_sbatch, team_path
from moe_cdk.schema.config import load_config
from moe_cdk.training.checkpoints.manager import CheckpointManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ports import free_port  # noqa: E402
from slurm_harness import Rejected, SlurmCluster, SlurmUnavailable  # noqa: E402
from trainer_runs import MEGATRON_REJECTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PYTHON = sys.executable
TINY = ROOT / "training/configs/tiny.yaml"
CORPUS = ROOT / "training/configs/tiny-corpus.txt"

# What `moe-cdk slurm render --config config/default.yaml --image ...` renders (tests/cli/test_cli.py).
DEFAULT_SPEC = job_spec_from_config(
    load_config(ROOT / "config/default.yaml"), image="123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:latest"
)
LOCAL_SPEC = SlurmJobSpec(
    job_name="moe-tiny",
    nodes=2,
    tasks_per_node=1,
    partition="ci",
    time_limit="00:10:00",
    local=True,
    train_config="training/configs/tiny.yaml",
    train_args=("--set", "parallel.expert=2", "--max-steps", "40"),
)


# -- golden files -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "spec"), [("sbatch-default.sh", DEFAULT_SPEC), ("sbatch-local.sh", LOCAL_SPEC)])
def test_golden_sbatch_script(name, spec):
    rendered = render_sbatch(spec)
    if os.environ.get("UPDATE_GOLDEN"):
        (GOLDEN / name).write_text(rendered)
    assert rendered == (GOLDEN / name).read_text(), f"tests/golden/{name} differs (UPDATE_GOLDEN=1 regenerates it)"


@pytest.mark.parametrize("spec", [DEFAULT_SPEC, LOCAL_SPEC], ids=["default", "local"])
def test_rendered_script_is_valid_bash(spec, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(spec))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).stderr == ""
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", "-S", "warning", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def test_local_script_has_no_gpus_container_or_efa():
    text = render_sbatch(dataclasses.replace(LOCAL_SPEC, gpus_per_node=4))
    assert "--gpus-per-node" not in text and "--container" not in text and "efa_env_file" not in text
    assert f"{LOCAL_SPEC.python} -m moe_cdk.cli.train" in text


def test_enroot_image_separates_the_registry_with_a_hash():
    assert (
        enroot_image("123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:latest")
        == "123456789012.dkr.ecr.us-east-2.amazonaws.com#moe:latest"
    )
    assert enroot_image("nvcr.io/nvidia/pytorch:24.07-py3") == "nvcr.io#nvidia/pytorch:24.07-py3"
    for unchanged in ("ubuntu:22.04", "library/ubuntu", "/fsx/images/moe.sqsh", "nvcr.io#nvidia/pytorch:24.07-py3"):
        assert enroot_image(unchanged) == unchanged


# -- validation -----------------------------------------------------------------------------------


def test_spec_problems_are_keyed_and_all_reported():
    bad = SlurmJobSpec(
        job_name="a b",
        nodes=0,
        tasks_per_node=0,
        time_limit="48h",
        signal_lead_seconds=0,
        container_image="img",
        local=True,
        train_config="c.yaml",
        master_port=70000,
    )
    with pytest.raises(ValueError) as raised:
        render_sbatch(bad)
    lines = [line.strip() for line in str(raised.value).splitlines()[1:]]
    keys = [line.split(":", 1)[0] for line in lines]
    assert keys == [
        "job_name",
        "nodes",
        "tasks_per_node",
        "time_limit",
        "signal_lead_seconds",
        "container_image",
        "master_port",
    ]
    assert "nodes: too few (got 0; allowed 1 or more)" in lines
    assert all(re.fullmatch(r"\w+: .+ \(got .+; allowed .+\)", line) for line in lines), lines


def test_spec_needs_a_container_or_local():
    spec = SlurmJobSpec(job_name="j", nodes=1, tasks_per_node=1, time_limit="10", train_config="c.yaml")
    assert [p.key for p in spec.problems()] == ["container_image"]


def test_spec_takes_a_profile_path_or_its_text_not_both():
    both = dataclasses.replace(LOCAL_SPEC, train_profile="max_steps: 1\n")
    neither = dataclasses.replace(LOCAL_SPEC, train_config=None)
    assert [p.key for p in both.problems()] == [p.key for p in neither.problems()] == ["train_config"]


def test_a_carried_profile_reaches_the_file_whatever_its_lines(tmp_path):
    text = "max_steps: 1\nMOE_CDK_PROFILE\n# 'quotes' $HOME `date` \\ end"
    spec = dataclasses.replace(LOCAL_SPEC, train_config=None, train_profile=text, profile_dir=str(tmp_path / "p q"))
    script = render_sbatch(spec)
    start, end = script.index("mkdir -p"), script.index('log "training profile')
    shell = "log() { :; }\nSLURM_JOB_ID=7\n" + script[start:end] + 'printf %s "$train_config"'
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], capture_output=True, text=True, check=True)
    assert done.stdout == f"{tmp_path}/p q/train-7.yaml"
    assert Path(done.stdout).read_text() == text + "\n"


@pytest.mark.parametrize("limit", ["10", "10:00", "48:00:00", "2-00", "2-12:30", "2-12:30:00", "UNLIMITED"])
def test_spec_accepts_slurm_time_formats(limit):
    assert (
        SlurmJobSpec(
            job_name="j",
            nodes=1,
            tasks_per_node=1,
            time_limit=limit,
            train_config="c.yaml",
            local=True,
            signal_lead_seconds=1,
        ).problems()
        == []
    )


def test_spec_signal_lead_must_fit_in_the_time_limit():
    spec = SlurmJobSpec(job_name="j", nodes=1, tasks_per_node=1, time_limit="5", train_config="c.yaml", local=True)
    assert [str(p) for p in spec.problems()] == [
        "signal_lead_seconds: not shorter than time_limit (got 300; allowed less than 300 (time_limit '5'))"
    ]


# -- a real two-node Slurm -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm():
    """A private two-node Slurm for the module; its daemons are stopped even when a test fails."""
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmUnavailable as error:
        cluster.stop()
        pytest.skip(f"no Slurm here: {error}")
    except BaseException:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


class TinyJob:
    """The rendered --local script for the tiny MoE on ``nodes`` nodes x 1 task (the experts
    split over the ranks), with its files in ``root``."""

    def __init__(self, root: Path, *, max_steps: int, extra_args: tuple[str, ...] = (), nodes: int = 2, **spec_fields):
        self.root = root
        self.metrics = root / "metrics.jsonl"
        self.checkpoints = root / "checkpoints"
        spec = SlurmJobSpec(
            job_name="moe-tiny",
            nodes=nodes,
            tasks_per_node=1,
            time_limit="00:10:00",
            local=True,
            python=PYTHON,
            train_profile=TINY.read_text(),
            profile_dir=str(root / "checkpoints"),
            output=str(root / "job-%j.out"),
            master_port=free_port(),
            train_args=(
                "--set",
                f"parallel.expert={nodes}",
                "--set",
                f"data.prefixes=[{root / 'data' / 'tiny_text_document'}]",
                "--set",
                f"data.prepare_from=[{CORPUS}]",
                "--max-steps",
                str(max_steps),
                "--save-interval",
                "5",
                "--checkpoint-dir",
                str(self.checkpoints),
                "--metrics-file",
                str(self.metrics),
                *extra_args,
            ),
            **spec_fields,
        )
        self.spec = spec
        self.script = root / "job.sh"
        self.script.write_text(render_sbatch(spec))

    def steps(self) -> list[int]:
        if not self.metrics.exists():
            return []
        return [json.loads(line)["step"] for line in self.metrics.read_text().splitlines() if line.strip()]

    def log(self, job_id: str) -> str:
        path = self.root / f"job-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_steps(self, slurm: SlurmCluster, job_id: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.steps()) < count:
            state = slurm.job_state(job_id)
            assert state.state in ("PENDING", "RUNNING"), f"job {job_id} is {state.state}:\n{self.log(job_id)}"
            assert time.monotonic() < deadline, f"fewer than {count} steps after {timeout}s:\n{self.log(job_id)}"
            time.sleep(0.2)


def _wait_completed(slurm: SlurmCluster, job: TinyJob, job_id: str, timeout: float):
    try:
        return slurm.wait_for(job_id, {"COMPLETED"}, timeout=timeout)
    except (AssertionError, TimeoutError) as error:
        raise AssertionError(f"{error}\n--- job log ---\n{job.log(job_id)[-6000:]}\n{slurm.log_tail(20)}") from None


def _resumed_step(log: str) -> int:
    found = re.findall(r"resumed from \S*/step-(\d+)", log)
    assert len(found) == 1, f"expected one 'resumed from' line:\n{log[-6000:]}"
    return int(found[0])


def _runs(steps: list[int]) -> list[list[int]]:
    """The metrics file's steps split where a run restarts (the step number goes down)."""
    runs: list[list[int]] = []
    for step in steps:
        if not runs or step <= runs[-1][-1]:
            runs.append([])
        runs[-1].append(step)
    return runs


def test_slurm_local_script_trains_on_two_nodes(slurm, tmp_path):
    job = TinyJob(tmp_path, max_steps=40)
    job_id = slurm.submit(job.script)
    assert not isinstance(job_id, Rejected), job_id
    state = _wait_completed(slurm, job, job_id, timeout=120)
    assert (state.state, state.restart_count, state.exit_code) == ("COMPLETED", 0, "0:0")
    assert state.fields["NodeList"] == "node[1-2]" and state.fields["NumTasks"] == "2"
    log = job.log(job_id)
    assert job.steps() == list(range(1, 41))
    assert re.search(r"rank0 INFO .*step 40/40", log)
    assert f"rendezvous 127.0.0.1:{job.spec.master_port} (node1)" in log
    assert "SLURM_RESTART_COUNT=0" in log and "resumed from" not in log
    # Both ranks wrote their shards of the last checkpoint: the world had 2 processes.
    shards = {p.name.split("_")[2] for p in (job.checkpoints / "step-40").glob("__*_*.distcp")}
    assert shards == {"0", "1"}
    # ... and trained the profile the script carried, from the copy it wrote beside the checkpoints.
    assert (job.checkpoints / f"train-{job_id}.yaml").read_text() == TINY.read_text()
    assert f"training profile: {job.checkpoints}/train-{job_id}.yaml" in log


def test_slurm_constraint_efa_runs_and_unknown_feature_is_rejected(slurm, tmp_path):
    # /bin/true stands in for the interpreter: the rendered script runs end to end in a second.
    spec = SlurmJobSpec(
        job_name="efa-check",
        nodes=2,
        tasks_per_node=1,
        constraint="efa",
        time_limit="1",
        signal_lead_seconds=10,
        local=True,
        python="/bin/true",
        train_config="none.yaml",
        output=str(tmp_path / "job-%j.out"),
    )
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(spec))
    job_id = slurm.submit(script)
    assert not isinstance(job_id, Rejected), job_id
    state = slurm.wait_for(job_id, {"COMPLETED"}, timeout=30)
    assert (state.fields["Features"], state.fields["NodeList"]) == ("efa", "node[1-2]")

    rejected = slurm.submit(script, ["--constraint=nosuchfeature"])
    assert isinstance(rejected, Rejected) and rejected.rc != 0
    assert "Invalid feature specification" in rejected.stderr


def test_slurm_permanent_failure_is_not_requeued(slurm, tmp_path):
    # The trainer's "bad configuration" exit, from both ranks, but seconds apart as ranks finish their checks: srun
    # TERMs the slower one when the first fails (--kill-on-bad-exit), and exits with that one's 143.
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\n[ "$SLURM_PROCID" = 1 ] || sleep 20\nexit 2\n')
    fake.chmod(0o755)
    spec = SlurmJobSpec(
        job_name="bad-config",
        nodes=2,
        tasks_per_node=1,
        time_limit="1",
        signal_lead_seconds=10,
        local=True,
        python=str(fake),
        train_config="none.yaml",
        output=str(tmp_path / "job-%j.out"),
    )
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(spec))
    job_id = slurm.submit(script)
    state = slurm.wait_for(job_id, {"FAILED"}, timeout=30)
    log = (tmp_path / f"job-{job_id}.out").read_text()
    assert (state.restart_count, state.exit_code) == (0, "2:0"), log
    assert "a task exited with 2; srun's 143 is the other tasks stopped after it" in log
    assert "permanent failure (exit 2" in log


def test_slurm_layout_megatron_rejects_fails_once_with_exit_2(slurm, tmp_path):
    job = TinyJob(tmp_path, max_steps=4, extra_args=MEGATRON_REJECTS)
    job_id = slurm.submit(job.script)
    assert not isinstance(job_id, Rejected), job_id
    state = slurm.wait_for(job_id, {"FAILED"}, timeout=90)
    log = job.log(job_id)
    assert (state.restart_count, state.exit_code) == (0, "2:0"), log[-4000:]
    assert "permanent failure (exit 2" in log and "retryable failure" not in log
    reasons = [line for line in log.splitlines() if "TransformerConfig rejects" in line]
    assert len(reasons) == 1 and "moe_act in recompute_modules" in reasons[0], log[-4000:]
    assert "Traceback" not in log and job.steps() == []


def _stopped_at(log: str) -> int:
    """The step at which every rank saved and stopped, from the ranks' own lines."""
    found = set(re.findall(r"stopped by signal \d+ at step (\d+) after saving a checkpoint", log))
    assert len(found) == 1, f"expected the ranks to stop at one step:\n{log[-6000:]}"
    return int(found.pop())


def test_slurm_scontrol_requeue_mid_run_resumes_at_the_step_after_its_stop(slurm, tmp_path):
    job = TinyJob(tmp_path, max_steps=24)
    job_id = slurm.submit(job.script)
    assert not isinstance(job_id, Rejected), job_id
    job.wait_for_steps(slurm, job_id, 12, timeout=90)
    slurm.requeue(job_id)
    state = _wait_completed(slurm, job, job_id, timeout=120)
    assert (state.state, state.restart_count) == ("COMPLETED", 1)
    log = job.log(job_id)
    first_run, second_run = log.split("SLURM_RESTART_COUNT=1", 1)
    # Slurm's TERM reached every process of the step: the ranks saved where they stopped.
    assert "Slurm is requeueing the job itself (restart 1)" in first_run, first_run[-4000:]
    assert _resumed_step(second_run) == _stopped_at(first_run) >= 12
    assert job.steps() == list(range(1, 25))


@pytest.mark.parametrize("nodes", [1, 2], ids=["1-rank", "2-ranks"])
def test_slurm_scancel_saves_the_stop_step_and_a_new_submission_resumes_after_it(slurm, tmp_path, nodes):
    # scancel TERMs every process of every step, the batch shell and srun included.
    job = TinyJob(tmp_path, max_steps=400, nodes=nodes)
    job_id = slurm.submit(job.script)
    assert not isinstance(job_id, Rejected), job_id
    job.wait_for_steps(slurm, job_id, 6, timeout=90)
    assert slurm.run("scancel", job_id).returncode == 0
    state = slurm.wait_for(job_id, {"CANCELLED"}, timeout=60)
    log = job.log(job_id)
    assert state.restart_count == 0, log[-4000:]
    stopped_at = _stopped_at(log)
    assert log.count("Exited with exit code 143") == nodes and "Traceback" not in log, log[-4000:]
    assert "Slurm is ending the job (JobState COMPLETING: scancel, or its time limit): not requeueing" in log
    assert CheckpointManager.problem_with(job.checkpoints / f"step-{stopped_at}") is None

    short = TinyJob(tmp_path, max_steps=stopped_at + 2, nodes=nodes)
    again = slurm.submit(short.script)
    _wait_completed(slurm, short, again, timeout=120)
    assert _resumed_step(short.log(again)) == stopped_at
    assert job.steps()[-2:] == [stopped_at + 1, stopped_at + 2]


def test_slurm_scancel_signal_term_to_the_steps_saves_requeues_and_resumes_after_it(slurm, tmp_path):
    job = TinyJob(tmp_path, max_steps=24)
    job_id = slurm.submit(job.script)
    assert not isinstance(job_id, Rejected), job_id
    job.wait_for_steps(slurm, job_id, 12, timeout=90)
    # --signal without --batch: every process of the job's steps, not the batch shell.
    assert slurm.run("scancel", "--signal=TERM", job_id).returncode == 0
    state = _wait_completed(slurm, job, job_id, timeout=120)
    assert (state.state, state.restart_count) == ("COMPLETED", 1)
    first_run, second_run = job.log(job_id).split("SLURM_RESTART_COUNT=1", 1)
    assert "retryable failure (exit 143): requeueing, restart 1 of 10" in first_run, first_run[-4000:]
    assert _resumed_step(second_run) == _stopped_at(first_run) >= 12
    assert job.steps() == list(range(1, 25))


def test_slurm_usr1_to_batch_shell_checkpoints_and_requeues(slurm, tmp_path):
    job = TinyJob(tmp_path, max_steps=24)
    job_id = slurm.submit(job.script)
    assert not isinstance(job_id, Rejected), job_id
    job.wait_for_steps(slurm, job_id, 12, timeout=90)
    # What --signal=B:USR1@N does at the end of the time limit, delivered now.
    done = slurm.run("scancel", "--batch", "--signal=USR1", job_id)
    assert done.returncode == 0, done.stderr
    state = _wait_completed(slurm, job, job_id, timeout=120)
    assert (state.state, state.restart_count) == ("COMPLETED", 1)
    log = job.log(job_id)
    first_run, second_run = log.split("SLURM_RESTART_COUNT=1", 1)
    assert "got USR1: asking the trainer to save a checkpoint and stop" in first_run
    # The ranks saved a checkpoint at the step the signal reached them and exited 143.
    assert "retryable failure (exit 143): requeueing, restart 1 of 10" in first_run, first_run[-4000:]
    assert re.search(r"step 1\d/24", first_run) and "step 24/24" not in first_run
    stopped_at = int(re.findall(r"step (\d+)/24", first_run)[-1])
    assert _resumed_step(second_run) == stopped_at >= 12
    # The second run starts right after the step the first one stopped at: no step repeats.
    assert job.steps() == list(range(1, 25))


# -- enroot's ECR credentials ---------------------------------------------------------------------

REGISTRY = "123456789012.dkr.ecr.us-east-2.amazonaws.com"


def _write_credentials(home: Path, path: str) -> Path:
    """Run the rendered script's write_enroot_credentials for REGISTRY with HOME=home."""
    script = render_sbatch(DEFAULT_SPEC)
    function = re.search(r"^write_enroot_credentials\(\) \{\n.*?^\}\n", script, re.MULTILINE | re.DOTALL).group(0)
    subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{function}write_enroot_credentials {REGISTRY} us-east-2"],
        env={"HOME": str(home), "PATH": path},
        check=True,
    )
    return home / ".config/enroot/.credentials"


def test_enroot_credentials_give_curl_the_ecr_token(tmp_path):
    # enroot hands the credentials file to curl's netrc reader (src/docker.sh: --netrc-file)
    # after echoing each line whose password starts with "$" through the shell (src/common.sh,
    # common::evalnetrc; NVIDIA/enroot at 8ea147d).
    # Here `aws` prints a token (no AWS account), the shell runs it as enroot would, and a
    # real curl must then send the registry "AWS:<token>" as basic auth.
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text('#!/bin/sh\n[ "$*" = "ecr get-login-password --region us-east-2" ] && echo tok3n\n')
    (bin_dir / "aws").chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    credentials = _write_credentials(tmp_path / "home", path)
    assert credentials.stat().st_mode & 0o777 == 0o600
    evaluated = tmp_path / "netrc"
    line = credentials.read_text()
    evaluated.write_text(
        subprocess.run(
            ["sh", "-c", f"echo {line}"], env={"PATH": path}, capture_output=True, text=True, check=True
        ).stdout
    )
    seen = []

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.handle_request, daemon=True).start()
    port = server.server_address[1]
    subprocess.run(
        [
            "curl",
            "-sf",
            "--netrc-file",
            str(evaluated),
            "--resolve",
            f"{REGISTRY}:{port}:127.0.0.1",
            f"http://{REGISTRY}:{port}/v2/",
        ],
        check=True,
        timeout=30,
    )
    server.server_close()
    assert seen == ["Basic " + base64.b64encode(b"AWS:tok3n").decode()]


def test_enroot_credentials_keep_other_registries_and_replace_their_own(tmp_path):
    home = tmp_path / "home"
    other = "machine nvcr.io login $oauthtoken password secret\n"
    (home / ".config/enroot").mkdir(parents=True)
    (home / ".config/enroot/.credentials").write_text(other + f"machine {REGISTRY} login AWS password old\n")
    credentials = _write_credentials(home, "/usr/bin:/bin")
    _write_credentials(home, "/usr/bin:/bin")
    assert credentials.read_text() == other + (
        f"machine {REGISTRY} login AWS password $(sudo -n /usr/local/bin/moe-ecr-password us-east-2 2>/dev/null "
        "|| aws ecr get-login-password --region us-east-2)\n"
    )


def test_images_outside_ecr_get_no_credentials_step():
    script = render_sbatch(dataclasses.replace(DEFAULT_SPEC, container_image="nvcr.io/nvidia/pytorch:25.01-py3"))
    assert "write_enroot_credentials" not in script


def test_a_team_job_is_charged_to_the_teams_account_at_its_default_tier(tmp_path):
    out = tmp_path / "job.sh"
    args = [
        "slurm",
        "render",
        "--config",
        str(ROOT / "config/slurm-teams.yaml"),
        "--image",
        "img:1",
        "--team",
        "production",
    ]
    assert main([*args, "--output", str(out)]) == 0
    text = out.read_text()
    assert "#SBATCH --account=production\n" in text and "#SBATCH --qos=normal\n" in text


def test_a_team_job_keeps_its_checkpoints_metrics_and_profile_in_the_teams_folder():
    config = load_config(ROOT / "config/slurm-teams.yaml")
    spec = job_spec_from_config(config, image="img:1", team="production")
    profile = load_job_profile(config, None, ())
    own = f"/fsx/teams/production/{profile.config.checkpoint.dir.removeprefix('/fsx/')}"
    assert profile.config.checkpoint.dir.startswith("/fsx/checkpoints/") and spec.profile_dir == own
    assert spec.train_args[-4:-2] == ("--checkpoint-dir", own)
    assert spec.train_args[-2] == "--metrics-file" and spec.train_args[-1].startswith("/fsx/teams/production/")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/fsx/checkpoints/x", "/fsx/teams/research/checkpoints/x"),
        ("/fsx/teams/research/x", "/fsx/teams/research/x"),
        ("/data/x", "/data/x"),
        ("relative/x", "relative/x"),
    ],
)
def test_a_team_path_moves_only_what_is_on_the_shared_file_system(path, expected):
    assert team_path("research", path) == expected


def test_the_profile_is_written_through_an_unpredictable_name():
    script = render_sbatch(DEFAULT_SPEC)
    assert 'profile_tmp="$(mktemp "${train_config}.XXXXXX")"' in script and ".tmp" not in script


def test_slurm_render_refuses_a_tier_the_team_may_not_use(capsys):
    args = ["slurm", "render", "--config", str(ROOT / "config/slurm-teams.yaml"), "--image", "img:1"]
    assert main([*args, "--team", "research", "--qos", "gold"]) == 2
    assert "--qos: not one of team research's tiers (got 'gold'" in capsys.readouterr().err


def test_enroot_credentials_ask_the_nodes_ecr_helper_first_and_fall_back_to_the_cli(tmp_path):
    # With teams, IMDS is root's (lifecycle_scripts/imds_access.sh): the member's ECR token comes from the node's
    # root-run helper through sudo. On a node without the helper, sudo fails and the AWS CLI gives it, as before.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(
        '#!/bin/sh\n[ "$*" = "ecr get-login-password --region us-east-2" ] && echo cli-tok3n\n'
    )
    (bin_dir / "sudo").write_text(
        "#!/bin/sh\n"
        f'[ -f {tmp_path}/helper ] && [ "$*" = "-n /usr/local/bin/moe-ecr-password us-east-2" ] '
        "&& exec echo helper-tok3n\n"
        'echo "sudo: /usr/local/bin/moe-ecr-password: command not found" >&2\nexit 1\n'
    )
    for name in ("aws", "sudo"):
        (bin_dir / name).chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    line = _write_credentials(tmp_path / "home", path).read_text().strip()

    def password() -> subprocess.CompletedProcess:
        # As enroot evaluates it (common::evalnetrc): what follows "password", through sh's echo, as the member.
        rest = line.split(" ", 5)[5]
        return subprocess.run(
            ["sh", "-c", f"echo {rest}"], env={"PATH": path}, capture_output=True, text=True, check=True
        )

    assert (password().stdout, password().stderr) == ("cli-tok3n\n", "")
    (tmp_path / "helper").write_text("")
    assert (password().stdout, password().stderr) == ("helper-tok3n\n", "")
