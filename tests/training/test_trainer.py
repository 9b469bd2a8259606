"""The trainer end to end on CPU: real megatron-core, gloo, real checkpoints and signals."""

from __future__ import annotations

import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from survivors import alive, descendants
from trainer_runs import (  # noqa: F401 (fixture)
    ENV,
    ROOT,
    TINY,
    data_prefix,
    final_parameters,
    rank_env,
    records,
    run_training,
    train_command,
)

from moe_cdk.training.checkpoints.manager import MARKER, CheckpointManager


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, data_prefix) -> Path:
    """20 uninterrupted steps on one process, checkpointing every 4."""
    run_dir = tmp_path_factory.mktemp("single")
    result = run_training(run_dir, data_prefix, "--max-steps", "20", "--save-interval", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir / "stderr.txt").write_text(result.stderr)
    return run_dir


def test_a_run_logs_no_megatron_warnings_and_one_line_on_absent_kernels(single_run):
    log = (single_run / "stderr.txt").read_text()
    assert "Warning" not in log and "warnings.warn" not in log and "Rerun State Machine" not in log, log[:3000]
    assert "RerunStateMachine" not in log and " WARNING " not in log, log[:3000]
    assert log.count("Transformer Engine and Apex absent: megatron-core uses its local layers") == 1


def test_single_process_loss_falls(single_run):
    losses = [r["loss"] for r in records(single_run)]
    assert len(losses) == 20 and losses[-1] < losses[0] - 1.0


def test_every_record_has_step_and_loss(single_run):
    assert [r["step"] for r in records(single_run)] == list(range(1, 21))


def test_metrics_hold_tokens_per_expert_for_every_layer(single_run):
    record = records(single_run)[-1]
    # 8 samples x 64 tokens x top-2 routing, per layer, 2 layers of 4 experts.
    assert [sum(layer) for layer in record["tokens_per_expert"]] == [8 * 64 * 2] * 2
    assert all(len(layer) == 4 for layer in record["tokens_per_expert"])


def test_moe_figures_are_per_step_when_records_are_sparse(tmp_path, data_prefix, single_run):
    # Records every 2 steps: expert load is the average over the 2 steps (each expert's count
    # rounded), so it reads as it would with a record at every step, not twice as high.
    result = run_training(
        tmp_path, data_prefix, "--max-steps", "4", "--save-interval", "4", "--set", "metrics.log_interval=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sparse = records(tmp_path)
    assert [r["step"] for r in sparse] == [2, 4]
    assert all(abs(sum(layer) - 8 * 64 * 2) <= 2 for r in sparse for layer in r["tokens_per_expert"])


def test_metrics_hold_router_entropy_and_imbalance(single_run):
    record = records(single_run)[-1]
    assert len(record["router_entropy"]) == 2
    assert all(0 < e <= record["router_entropy_max"] for e in record["router_entropy"])
    assert all(1.0 <= i <= 4.0 for i in record["expert_imbalance"])


def test_metrics_hold_aux_losses_and_throughput(single_run):
    record = records(single_run)[-1]
    assert len(record["load_balancing_loss"]) == 2 and len(record["z_loss"]) == 2
    assert record["tokens_per_s"] > 0 and record["dispatch_time_s"] > 0 and record["peak_memory_gib"] > 0


def test_only_the_last_two_complete_checkpoints_are_kept(single_run):
    assert sorted(p.name for p in (single_run / "ckpt").glob("step-*")) == ["step-16", "step-20"]
    assert (single_run / "ckpt/step-20" / MARKER).is_file()


EXPERT_PARALLEL_2 = (
    "--max-steps",
    "10",
    "--save-interval",
    "5",
    "--set",
    "parallel.expert=2",
    "--set",
    "data.num_workers=1",
)


@pytest.fixture(scope="module")
def expert_parallel_run(tmp_path_factory, data_prefix, single_run) -> Path:
    """10 steps on two processes with expert parallelism 2, checkpointing at steps 5 and 10, started by torchrun
    (docs/training.md: "torchrun works too"; the other multi-rank runs use the node launcher)."""
    run_dir = tmp_path_factory.mktemp("expert-parallel-2")
    result = run_training(run_dir, data_prefix, *EXPERT_PARALLEL_2, nproc=2, torchrun=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_two_processes_with_expert_parallel_2_train(expert_parallel_run):
    losses = [r["loss"] for r in records(expert_parallel_run)]
    assert len(losses) == 10 and losses[-1] < losses[0] - 0.5


def test_a_flipped_byte_in_one_ranks_file_makes_every_rank_fall_back(tmp_path, data_prefix, expert_parallel_run):
    # Rank 1 reads the flipped file; rank 0 must learn of it and load the same earlier step.
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(expert_parallel_run), str(run_dir)], check=True)
    shard = run_dir / "ckpt/step-10/__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x20
    shard.write_bytes(raw)
    result = run_training(run_dir, data_prefix, *EXPERT_PARALLEL_2, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert (
            f"rank{rank} WARNING moe_cdk.training.checkpoints.manager: skipping checkpoint {run_dir / 'ckpt/step-10'}: "
            in (result.stderr)
        )
    assert f"resumed from {run_dir / 'ckpt/step-5'}" in result.stderr
    assert records(run_dir)[-1]["loss"] == records(expert_parallel_run)[-1]["loss"]


def test_kubeflow_pod_starts_one_rank_per_device_and_trains(tmp_path, data_prefix, single_run):
    # What a PyTorchJob pod with nprocPerNode: "2" sees: one process, the node described by PET_*.
    pod_env = {
        **ENV,
        "PET_NPROC_PER_NODE": "2",
        "PET_NNODES": "1",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(29600 + random.randint(301, 600)),
    }
    result = subprocess.run(
        train_command(tmp_path, data_prefix, "--max-steps", "4", "--save-interval", "4", "--set", "parallel.expert=2"),
        cwd=ROOT,
        env=pod_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3, 4]


def test_one_process_trains_while_something_else_listens_on_its_master_port(tmp_path, data_prefix, single_run):
    # A world of one has nobody to meet: a port chosen before megatron's import could be taken by
    # then (CI, stop 49: EADDRINUSE on the port the run had picked), so it must not bind one at all.
    with socket.create_server(("", 0)) as taken:
        env = {**ENV, "MASTER_PORT": str(taken.getsockname()[1])}
        command = train_command(tmp_path, data_prefix, "--max-steps", "1", "--save-interval", "1")
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in records(tmp_path)] == [1]


def test_allgather_dispatcher_with_capacity_factor_trains(tmp_path, data_prefix, single_run):
    result = run_training(
        tmp_path,
        data_prefix,
        "--max-steps",
        "3",
        "--save-interval",
        "3",
        "--set",
        "moe.token_dispatcher=allgather",
        "--set",
        "moe.capacity_factor=1.0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3]


def test_core_attention_recompute_with_dropout_trains_the_same_losses(tmp_path, data_prefix):
    # Recompute restores the generator before the recomputed forward (cpu_compat on CPU), so the
    # recomputed attention dropout draws the same mask and the step is the same.
    common = ("--max-steps", "3", "--save-interval", "3", "--set", "model.dropout=0.1")
    plain = run_training(tmp_path / "plain", data_prefix, *common)
    recomputed = run_training(
        tmp_path / "recompute",
        data_prefix,
        *common,
        "--set",
        "recompute.granularity=selective",
        "--set",
        "recompute.modules=[core_attn]",
    )
    assert plain.returncode == recomputed.returncode == 0, recomputed.stderr[-3000:]
    assert [r["loss"] for r in records(tmp_path / "recompute")] == pytest.approx(
        [r["loss"] for r in records(tmp_path / "plain")], rel=1e-6
    )


def test_sigkill_and_resume_is_bitwise_identical(tmp_path, data_prefix, single_run):
    kill_after = random.Random().randint(6, 17)
    command = train_command(tmp_path, data_prefix, "--max-steps", "20", "--save-interval", "4")
    process = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    metrics = tmp_path / "metrics.jsonl"
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= kill_after:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, f"the run ended before the kill at step {kill_after}"

    resumed = run_training(tmp_path, data_prefix, "--max-steps", "20", "--save-interval", "4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    assert records(tmp_path)[-1]["loss"] == records(single_run)[-1]["loss"]
    reference = final_parameters(single_run / "ckpt/step-20", tmp_path / "reference.pt")
    interrupted = final_parameters(tmp_path / "ckpt/step-20", tmp_path / "interrupted.pt")
    assert reference.keys() == interrupted.keys() and reference
    assert all(torch.equal(reference[k], interrupted[k]) for k in reference)


def test_a_rank_saving_synchronously_starts_no_helper_process(tmp_path, data_prefix):
    # A save every step: megatron's save, left to itself, starts a manager process for its writer's results at the
    # first one (training/checkpoints/manager.py).
    command = train_command(tmp_path, data_prefix, "--max-steps", "200", "--save-interval", "1")
    process = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, helpers = tmp_path / "metrics.jsonl", set()
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        helpers |= descendants(process.pid)
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    helpers |= descendants(process.pid)
    process.kill()
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it had saved 3 steps"
    assert not helpers, f"started {sorted(helpers)}"


# moe-train as `python -m` runs it, saying how many objects the garbage collector was told to leave: once megatron-core
# is imported (which freezes what the import built), and at the exit.
FREEZE_PROBE = """
import atexit, gc, runpy, sys
from moe_cdk.training.step import _megatron
_megatron.import_core()
print("frozen by the import:", gc.get_freeze_count(), file=sys.stderr)
atexit.register(lambda: print("frozen at the exit:", gc.get_freeze_count(), file=sys.stderr))
runpy.run_module("moe_cdk.cli.train", run_name="__main__", alter_sys=True)
"""


def test_a_rank_freezes_what_setup_built_so_no_collection_walks_it_again(tmp_path, data_prefix):
    command = train_command(tmp_path, data_prefix, "--max-steps", "2")
    assert command[1:3] == ["-m", "moe_cdk.cli.train"]
    done = subprocess.run(
        [sys.executable, "-c", FREEZE_PROBE, *command[3:]], cwd=ROOT, env=ENV, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    by_import, at_exit = (int(n) for n in re.findall(r"^frozen .*: (\d+)$", done.stderr, re.MULTILINE))
    assert at_exit - by_import > 50_000, (by_import, at_exit)  # dynamo's modules, the model, the optimizer


# An async save's writer manager (GPU only, so started here by hand), in a rank that handles the stop signals as
# the trainer does: a TERM to its whole process group, as Slurm's scancel sends it, reaches the manager too.
WRITER_MANAGER_PROBE = """
import os, signal, time
from moe_cdk.training.stop import StopRequested
stop = StopRequested()
from moe_cdk.training.step._megatron import import_core
import_core()
from moe_cdk.training.checkpoints import manager
from megatron.core.dist_checkpointing.strategies import filesystem_async
manager._prepare_results_queue(async_save=True)
print(manager._writer_manager._process.pid, flush=True)
os.killpg(0, signal.SIGTERM)
time.sleep(1)
filesystem_async._results_queue.put("served")
print(filesystem_async._results_queue.get(timeout=60), stop.signal == signal.SIGTERM, flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def writer_manager(tmp_path_factory):
    """What the probe's queue answered after the group TERM, the probe's stderr, and whether its manager was gone
    within 10 s of the SIGKILL of the rank that started it (a manager left behind is killed here)."""
    log = tmp_path_factory.mktemp("writer-manager") / "stderr.txt"
    with log.open("w") as stderr:  # a file: a manager left behind would hold a pipe open
        process = subprocess.Popen([sys.executable, "-c", WRITER_MANAGER_PROBE], cwd=ROOT, env=ENV, text=True,
                                   stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)  # fmt: skip
    try:
        pid = int(process.stdout.readline() or 0)
        answer = process.stdout.readline().split()
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
    deadline = time.time() + 10
    while pid and alive({pid}) and time.time() < deadline:
        time.sleep(0.1)
    gone = bool(pid) and not alive({pid})
    if pid and not gone:
        os.kill(pid, signal.SIGKILL)
    return answer, log.read_text(), gone


def test_an_async_saves_writer_manager_serves_after_a_term_to_the_whole_process_group(writer_manager):
    answer, stderr, _ = writer_manager
    assert answer == ["served", "True"], stderr[-3000:]


def test_an_async_saves_writer_manager_dies_with_its_rank_killed_by_sigkill(writer_manager):
    _, stderr, gone = writer_manager
    assert gone, stderr[-3000:]


def test_truncated_latest_checkpoint_is_skipped_for_the_previous_one(tmp_path, data_prefix, single_run):
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(single_run), str(run_dir)], check=True)
    shard = max((run_dir / "ckpt/step-20").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    result = run_training(run_dir, data_prefix, "--max-steps", "20", "--save-interval", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"skipping checkpoint {run_dir / 'ckpt/step-20'}: {shard.name} has" in result.stderr
    assert f"resumed from {run_dir / 'ckpt/step-16'}" in result.stderr


def _flip_one_byte(step_dir: Path) -> tuple[Path, str]:
    """Flip one bit of a random byte of a random data file; returns the file and how it was chosen."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    shard = rng.choice(sorted(step_dir.glob("*.distcp")))
    raw = bytearray(shard.read_bytes())
    at = rng.randrange(len(raw))
    raw[at] ^= 1 << rng.randrange(8)
    shard.write_bytes(raw)
    return shard, f"seed {seed}: {shard.name} byte {at}"


def test_a_flipped_byte_in_the_latest_checkpoint_falls_back_to_the_step_before(tmp_path, data_prefix, single_run):
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(single_run), str(run_dir)], check=True)
    shard, chosen = _flip_one_byte(run_dir / "ckpt/step-20")
    result = run_training(run_dir, data_prefix, "--max-steps", "20", "--save-interval", "4")
    assert result.returncode == 0, f"{chosen}\n{result.stderr[-3000:]}"
    assert f"skipping checkpoint {run_dir / 'ckpt/step-20'}: {shard.name}: the " in result.stderr, chosen
    assert f"resumed from {run_dir / 'ckpt/step-16'}" in result.stderr, chosen
    assert records(run_dir)[-1]["loss"] == records(single_run)[-1]["loss"], chosen


def test_no_intact_checkpoint_left_stops_the_run_with_a_permanent_error(tmp_path, data_prefix, single_run):
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(single_run), str(run_dir)], check=True)
    chosen = [_flip_one_byte(run_dir / f"ckpt/step-{step}")[1] for step in (16, 20)]
    result = run_training(run_dir, data_prefix, "--max-steps", "20", "--save-interval", "4")
    assert result.returncode == 2, f"{chosen}\n{result.stderr[-3000:]}"
    assert f"checkpoint.dir: no intact checkpoint is left in {run_dir / 'ckpt'}" in result.stderr, chosen
    assert "starting at step 0" not in result.stderr


def test_moe_checkpoint_verify_names_the_flipped_file_and_passes_the_rest(tmp_path, single_run, capsys):
    from moe_cdk.cli.checkpoint import main

    ckpt = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(single_run / "ckpt"), str(ckpt)], check=True)
    shard, chosen = _flip_one_byte(ckpt / "step-20")
    assert main(["verify", str(ckpt)]) == 1, chosen
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{ckpt / 'step-20'}: NOT INTACT", chosen
    assert out[1].startswith(f"  {shard.name}: the "), chosen
    assert out[2:] == [f"{ckpt / 'step-16'}: intact"], chosen
    assert main(["verify", str(ckpt), "--step", "16"]) == 0


def test_a_flipped_byte_in_a_small_file_fails_the_markers_checksum(tmp_path, single_run):
    # common.pt, metadata.json and .metadata have no record of their own: the marker holds their CRC32C
    step = tmp_path / "step-20"
    subprocess.run(["cp", "-r", str(single_run / "ckpt/step-20"), str(step)], check=True)
    raw = bytearray((step / ".metadata").read_bytes())
    raw[len(raw) // 2] ^= 0x08
    (step / ".metadata").write_bytes(raw)
    assert CheckpointManager.problem_with(step).startswith(".metadata has CRC32C ")


def test_moe_checkpoint_verify_of_a_folder_without_steps_names_it(tmp_path, capsys):
    from moe_cdk.cli.checkpoint import main

    assert main(["verify", str(tmp_path)]) == 2
    assert f"CKPT_DIR: holds no step-N folder (got {str(tmp_path)!r}" in capsys.readouterr().err


def test_sigterm_saves_a_checkpoint_and_exits_retryable(tmp_path, data_prefix, single_run):
    command = train_command(tmp_path, data_prefix, "--max-steps", "1000", "--save-interval", "1000")
    process = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr[-3000:]
    last_step = records(tmp_path)[-1]["step"]
    assert CheckpointManager.problem_with(tmp_path / f"ckpt/step-{last_step}") is None


def _stop_group_after(tmp_path, data_prefix, signum, *, records_before: int, save_interval: int = 1000):
    """Start a run in a session of its own, send ``signum`` to its whole process group (what
    ``kill -- -PGID``, Slurm and a terminal's Ctrl-C do) once ``records_before`` steps are
    recorded; its exit code and stderr."""
    command = train_command(tmp_path, data_prefix, "--max-steps", "1000", "--save-interval", str(save_interval))
    process = subprocess.Popen(
        command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= records_before:
            break
        time.sleep(0.02)
    os.killpg(process.pid, signum)
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


def _assert_saved_at_last_step_and_resumes_after_it(tmp_path, data_prefix, stderr):
    stopped_at = records(tmp_path)[-1]["step"]
    assert f"at step {stopped_at} after saving a checkpoint" in stderr, stderr[-3000:]
    assert CheckpointManager.problem_with(tmp_path / f"ckpt/step-{stopped_at}") is None
    resumed = run_training(tmp_path, data_prefix, "--max-steps", str(stopped_at + 2), "--save-interval", "1000")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {tmp_path / 'ckpt'}/step-{stopped_at} " in resumed.stderr
    assert [r["step"] for r in records(tmp_path)][-2:] == [stopped_at + 1, stopped_at + 2]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_a_stop_signal_to_the_whole_process_group_saves_and_resumes_at_the_next_step(tmp_path, data_prefix, signum):
    # Slurm's scancel, a preemption and kill -- -PGID reach every process of the group.
    returncode, stderr = _stop_group_after(tmp_path, data_prefix, signum, records_before=3)
    assert returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    _assert_saved_at_last_step_and_resumes_after_it(tmp_path, data_prefix, stderr)


def test_a_group_term_while_a_save_is_written_still_saves_the_stop_step(tmp_path, data_prefix):
    # A save every step: the signal lands in a save, or right next to one.
    returncode, stderr = _stop_group_after(tmp_path, data_prefix, signal.SIGTERM, records_before=4, save_interval=1)
    assert returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    _assert_saved_at_last_step_and_resumes_after_it(tmp_path, data_prefix, stderr)


def test_ctrl_c_to_the_terminals_process_group_saves_says_one_line_and_exits_130(tmp_path, data_prefix):
    returncode, stderr = _stop_group_after(tmp_path, data_prefix, signal.SIGINT, records_before=3)
    assert returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.count("interrupted: saving a checkpoint at the end of this step, then stopping") == 1
    _assert_saved_at_last_step_and_resumes_after_it(tmp_path, data_prefix, stderr)


def test_two_local_ranks_stopped_by_a_group_term_save_and_exit_143(tmp_path, data_prefix):
    # moe-train --nproc-per-node 2: the node launcher starts the ranks and exits with their code.
    command = train_command(tmp_path, data_prefix, "--max-steps", "1000", "--save-interval", "1000",
                            "--set", "parallel.expert=2", nproc=2)  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, env=rank_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    metrics, deadline = tmp_path / "metrics.jsonl", time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr[-3000:]
    stopped_at = records(tmp_path)[-1]["step"]
    assert stderr.count(f"at step {stopped_at} after saving a checkpoint") == 2, stderr[-3000:]
    assert CheckpointManager.problem_with(tmp_path / f"ckpt/step-{stopped_at}") is None


def test_a_term_while_starting_stops_before_the_first_step_and_exits_143(tmp_path, data_prefix):
    command = train_command(tmp_path, data_prefix, "--max-steps", "1000")
    process = subprocess.Popen(
        command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    # The handler is in place once the rank logs; megatron's import and the model build follow.
    for line in process.stderr:
        if "Transformer Engine and Apex absent" in line or "layout:" in line:
            break
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr[-3000:]
    assert "stopped by signal 15 before the first step; the next run starts at step 0" in stderr
    assert not (tmp_path / "metrics.jsonl").exists() or records(tmp_path) == []


def test_a_checkpoint_dir_that_is_a_file_exits_2_with_one_line(tmp_path, data_prefix):
    result = run_training(tmp_path, data_prefix, "--checkpoint-dir", str(ROOT / "README.md"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"  checkpoint.dir: is a file, not a folder (got '{ROOT / 'README.md'}';" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("nproc", [1, 2], ids=["1-rank", "2-ranks"])
def test_resuming_with_another_model_shape_names_the_tensor_and_exits_2_once(tmp_path, data_prefix, single_run, nproc):
    shutil.copytree(single_run / "ckpt", tmp_path / "ckpt")
    extra = ("--set", "model.hidden_size=128", "--max-steps", "24")
    result = run_training(tmp_path, data_prefix, *extra, nproc=nproc)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "skipping checkpoint" not in result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("  checkpoint.dir: ")]
    assert len(problems) == 1, result.stderr[-3000:]
    assert re.search(r"step-20 holds (\S+) of shape \[64\], and this model's \1 has shape \[128\]", problems[0])
    # The checkpoints are those of another model, not damaged ones: every one is still there.
    assert CheckpointManager.problem_with(tmp_path / "ckpt/step-20") is None


def test_a_save_that_fails_on_a_file_size_limit_keeps_the_last_complete_step_and_exits_2(tmp_path, data_prefix):
    first = run_training(tmp_path, data_prefix, "--max-steps", "4", "--save-interval", "4")
    assert first.returncode == 0, first.stderr[-3000:]

    def limited():  # each tensor shard of the next save is over 1 MiB; everything else is under 512 KiB
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 << 10, 512 << 10))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    command = train_command(tmp_path, data_prefix, "--max-steps", "8", "--save-interval", "4")
    failed = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600, preexec_fn=limited)
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    assert (
        f"checkpoint.dir: saving step-8 failed: File too large ({tmp_path / 'ckpt/step-8'}); step-4, the last "
        "complete checkpoint, is kept; no retry can help until that is fixed" in failed.stderr
    )
    assert CheckpointManager.problem_with(tmp_path / "ckpt/step-8") is not None
    resumed = run_training(tmp_path, data_prefix, "--max-steps", "8", "--save-interval", "4")
    assert resumed.returncode == 0 and f"resumed from {tmp_path / 'ckpt'}/step-4 " in resumed.stderr


def test_configuration_error_exits_2_with_keyed_lines(tmp_path, data_prefix):
    result = run_training(tmp_path, data_prefix, "--set", "moe.top_k=9", "--set", "model.hidden_size=63")
    assert result.returncode == 2
    assert "  moe.top_k: out of range (got 9; allowed 1 to num_experts (4))" in result.stderr
    assert "  model.num_attention_heads: must divide hidden_size (got 4; allowed a divisor of 63)" in result.stderr
    assert "Traceback" not in result.stderr


def test_layout_that_does_not_fit_the_world_size_exits_2(tmp_path, data_prefix):
    result = run_training(tmp_path, data_prefix, "--set", "optim.global_batch_size=6")
    assert result.returncode == 2
    assert "optim.global_batch_size: must be a multiple of micro_batch_size x data-parallel size" in result.stderr


def test_missing_dataset_and_tokenizer_exit_2_before_training(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "moe_cdk.cli.train",
            "--config",
            str(TINY),
            "--set",
            f"data.prefixes=[{tmp_path / 'absent_document'}]",
            "--set",
            "data.prepare_from=[]",
            "--set",
            f"data.tokenizer={tmp_path / 'tokenizer.json'}",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"  data.tokenizer: no such file (got '{tmp_path / 'tokenizer.json'}';" in result.stderr
    assert (
        f"  data.prefixes[0]: dataset files missing (.bin, .idx) (got '{tmp_path / 'absent_document'}';"
        in result.stderr
    )


def test_deepseek_style_routing_trains_and_moves_the_expert_bias(tmp_path, data_prefix, single_run):
    # Sigmoid scores, aux-loss-free expert bias, a shared expert and group-limited routing
    # (test_train_config.DEEPSEEK_ROUTER), all megatron-core's own, on CPU.
    from test_train_config import DEEPSEEK_ROUTER

    overrides = [arg for option in DEEPSEEK_ROUTER for arg in ("--set", option)]
    result = run_training(tmp_path, data_prefix, "--max-steps", "20", "--save-interval", "20", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [r["loss"] for r in records(tmp_path)]
    assert len(losses) == 20 and losses[-1] < losses[0] - 1.0
    parameters = final_parameters(tmp_path / "ckpt/step-20", tmp_path / "final.pt")
    (bias,) = [v for k, v in parameters.items() if k.endswith("router.expert_bias")]  # layers stacked
    assert bias.shape == (2, 8) and bool((bias.abs().sum(dim=1) > 0).all()), bias  # moved from 0 in both layers
    assert any(".shared_experts." in k for k in parameters)
    assert _parameter_count(parameters) == _planned_parameters(parameters, *DEEPSEEK_ROUTER)


def test_planned_parameter_count_is_megatrons(single_run, tmp_path):
    parameters = final_parameters(single_run / "ckpt/step-20", tmp_path / "final.pt")
    assert _parameter_count(parameters) == _planned_parameters(parameters)


def _parameter_count(parameters: dict) -> int:
    """Trainable parameters in a checkpoint: without the router's expert-bias buffer."""
    return sum(v.numel() for k, v in parameters.items() if not k.endswith("expert_bias"))


def _planned_parameters(parameters: dict, *overrides: str, config: Path = TINY) -> int:
    """``parameter_counts`` (what moe-cdk plan and the MFU figure use) of ``config`` with ``overrides``,
    for the checkpoint's vocabulary."""
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.step.sizes import parameter_counts

    vocab = parameters["embedding.word_embeddings.weight"].shape[0]
    return parameter_counts(load_train_config(config, list(overrides)), vocab).total


def _shrunk(profile: str, out: Path) -> Path:
    """``profile``'s model and MoE sections at a CPU size, in tiny.yaml's run settings: the routing
    (experts, top-k, score function, bias, groups, shared expert) and the attention options
    (query/key norms, multi-latent attention) and the dense first layers stay."""
    import yaml

    tiny, source = yaml.safe_load(TINY.read_text()), yaml.safe_load((ROOT / profile).read_text())
    model = source["model"] | {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "ffn_hidden_size": 32,
        "seq_length": 64,
    }
    if model.get("multi_latent_attention"):
        # Query/key heads wider than the value heads, as in the profile.
        model |= {"kv_lora_rank": 32, "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16}
    else:
        model["num_query_groups"] = 2
    if "kv_channels" in model:
        model["kv_channels"] = 32  # wider than hidden / heads, as in the profile
    model.pop("vocab_size", None)  # the byte tokenizer's 256 rows
    if model.get("dense_layers"):
        model["dense_ffn_hidden_size"] = 96  # wider than the experts, as in the profile
    moe = source["moe"] | (
        {"shared_expert_ffn_hidden_size": 64} if "shared_expert_ffn_hidden_size" in source["moe"] else {}
    )
    out.write_text(yaml.safe_dump(tiny | {"model": model, "moe": moe}))
    return out


@pytest.mark.parametrize(
    "profile", ["training/configs/qwen3-30b-a3b.yaml", "training/configs/deepseek-v3-style-16b.yaml"]
)
def test_a_shrunk_copy_of_each_modern_profile_trains(tmp_path, data_prefix, single_run, profile):
    config = _shrunk(profile, tmp_path / "shrunk.yaml")
    result = run_training(tmp_path, data_prefix, "--config", str(config), "--max-steps", "20", "--save-interval", "20")
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [r["loss"] for r in records(tmp_path)]
    assert len(losses) == 20 and losses[-1] < losses[0] - 1.0
    parameters = final_parameters(tmp_path / "ckpt/step-20", tmp_path / "final.pt")
    assert _parameter_count(parameters) == _planned_parameters(parameters, config=config)


def test_rerunning_a_finished_run_says_there_is_nothing_left_to_train(tmp_path, data_prefix, single_run):
    shutil.copytree(single_run / "ckpt", tmp_path / "ckpt")
    rerun = run_training(tmp_path, data_prefix, "--max-steps", "20")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "is at step 20 and max_steps is 20: nothing left to train" in rerun.stderr
    assert not (tmp_path / "metrics.jsonl").exists() or records(tmp_path) == []


def test_a_real_runs_metrics_plot_as_a_png(single_run, tmp_path):
    out = tmp_path / "run.png"
    command = [
        sys.executable,
        "-m",
        "moe_cdk.cli.train",
        "plot",
        str(single_run / "metrics.jsonl"),
        "--output",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
