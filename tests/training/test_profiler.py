"""The profiler on CPU: a tiny EP2 run over gloo writes a Chrome trace per rank, its records say where each
profiled step went, the plot draws it, and a bad --profile-steps is one line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
import torch
from trainer_runs import ENV, ROOT, TINY, data_prefix, records, run_training  # noqa: F401 (fixture)

from moe_cdk.training.metrics_plot import breakdown, render
from moe_cdk.training.profiler import CATEGORIES, summarize


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory, data_prefix):
    """3 steps on two ranks with expert parallelism 2, steps 2 and 3 profiled."""
    run_dir = tmp_path_factory.mktemp("profiled")
    result = run_training(
        run_dir, data_prefix, "--max-steps", "3", "--save-interval", "100", "--set", "parallel.expert=2",
        "--profile-steps", "2:3", nproc=2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_each_rank_writes_a_chrome_trace_holding_the_all_to_alls(profiled_run):
    for rank in (0, 1):
        path = profiled_run / f"profile/rank-{rank}-steps-2-3.pt.trace.json.gz"
        trace = json.loads(gzip.decompress(path.read_bytes()))
        names = {event.get("name") for event in trace["traceEvents"]}
        assert {"c10d::alltoall_base_", "moe_train/dispatch", "moe_train/combine"} <= names
        assert {"moe_train/step 2", "moe_train/step 3"} <= names


def test_each_profiled_step_has_every_ranks_shares_adding_up_to_the_step(profiled_run):
    by_step = {r["step"]: r for r in records(profiled_run)}
    assert "profile" not in by_step[1]
    for step in (2, 3):
        summaries = by_step[step]["profile"]
        assert [s["rank"] for s in summaries] == [0, 1] and all(s["step"] == step for s in summaries)
        for summary in summaries:
            assert list(summary["seconds"]) == list(CATEGORIES)
            assert sum(summary["share"].values()) == pytest.approx(1.0, abs=0.01)
            assert all(summary["seconds"][c] > 0 for c in ("dispatch", "combine", "experts", "attention", "optimizer"))
        # Rank 0's step, as the profiler saw it, is the step the record times.
        assert sum(summaries[0]["seconds"].values()) == pytest.approx(by_step[step]["step_time_s"], rel=0.05)


def test_the_plot_draws_the_breakdown_of_the_profiled_steps(profiled_run, tmp_path):
    runs = records(profiled_run)
    steps, shares = breakdown(runs)
    assert steps == [2, 3]
    expected = sum(s["share"]["dispatch"] for s in runs[2]["profile"]) / 2
    assert shares["dispatch"][1] == pytest.approx(expected)
    done = subprocess.run(
        [sys.executable, "-m", "moe_cdk.cli.train", "plot", str(profiled_run / "metrics.jsonl"), "--output",
         str(tmp_path / "run.png")], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    unprofiled = render([{**r, "profile": []} for r in runs], tmp_path / "plain.png", title="t")
    # The breakdown is a fourth panel: the figure is taller.
    assert (tmp_path / "run.png").stat().st_size > unprofiled.stat().st_size


def test_a_backward_pass_counts_in_the_range_whose_forward_built_it():
    # The backward of the matmul run in moe_train/experts is expert time, though no range is around it.
    from torch.profiler import ProfilerActivity, profile, record_function

    weight = torch.randn(512, 512, requires_grad=True)
    x = torch.randn(512, 512)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("moe_train/step 1"):
            with record_function("moe_train/experts"):
                y = x @ weight
            loss = y.sum()
            loss.backward()
    (summary,) = summarize(prof.profiler.kineto_results, rank=0)
    backward_node = [e for e in prof.events() if e.name == "autograd::engine::evaluate_function: MmBackward0"]
    forward_range = [e for e in prof.events() if e.name == "moe_train/experts"]
    experts_s = (backward_node[0].time_range.elapsed_us() + forward_range[0].time_range.elapsed_us()) / 1e6
    # The backward (one matmul, as long as the forward's within a few times) is far more than the 2 % allowed.
    assert summary["seconds"]["experts"] == pytest.approx(experts_s, rel=0.02)


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("3:x", "  --profile-steps: not a step range (got '3:x'; allowed A:B with whole steps 1 <= A <= B"),
        ("4:2", "  --profile-steps: not a step range (got '4:2';"),
        ("5:60", "  profile.last_step: the run ends before this step (got 60; allowed a step up to max_steps (50))"),
    ],
)
def test_a_bad_profile_steps_is_one_line_and_exit_2(value, line):
    done = subprocess.run(
        [sys.executable, "-m", "moe_cdk.cli.train", "--config", str(TINY), "--profile-steps", value],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    problems = [text for text in done.stderr.splitlines() if text.startswith("  ")]
    assert len(problems) == 1 and problems[0].startswith(line), done.stderr
    assert "Traceback" not in done.stderr
