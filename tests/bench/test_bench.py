"""The benches' shared measuring method, and the GPU readiness check's parts that run here: its
Python step on CPU and its shell wrapper."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_runs import ENV, ROOT

GPU_CHECK = ROOT / "bench/gpu_check.py"
GPU_CHECK_SH = ROOT / "bench/gpu_check.sh"
sys.path.insert(0, str(ROOT / "bench"))
from _common import paired  # noqa: E402
from checkpoint_io import evict, filesystem_type  # noqa: E402
from data_prepare import write_corpus  # noqa: E402


def test_paired_rounds_reverse_the_order_every_other_round():
    calls = []

    def side(name):
        def measure():
            calls.append(name)
            return float(len(calls))

        return measure

    runs = paired({"a": side("a"), "b": side("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # the warm-up round, then A B, B A, A B
    assert runs == {"a": [3.0, 6.0, 7.0], "b": [4.0, 5.0, 8.0]}


def test_checkpoint_bench_names_the_file_system_of_a_path():
    assert filesystem_type(ROOT / "no/such/file") == filesystem_type(ROOT)  # the mount that would hold it
    assert filesystem_type(Path("/proc/self/status")) == "proc"  # the longest mount point wins over /


def test_checkpoint_bench_evicts_nothing_on_a_file_system_held_in_memory(tmp_path):
    # drop_caches there would evict only the bench's own code, not the files
    assert evict("tmpfs", tmp_path) == evict("ramfs", tmp_path) == "none (in memory)"


def test_data_prepare_bench_writes_the_same_corpus_every_time(tmp_path):
    write_corpus(tmp_path / "a.jsonl", 1)
    write_corpus(tmp_path / "b.jsonl", 1)
    corpus = (tmp_path / "a.jsonl").read_bytes()
    assert corpus == (tmp_path / "b.jsonl").read_bytes() and len(corpus) >= 2**20
    assert all(json.loads(line)["text"] for line in corpus.splitlines())


@pytest.mark.parametrize("variant", ["local", "native"])
def test_gpu_check_runs_the_trainer_step_in_smoke_mode(tmp_path, variant):
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            str(GPU_CHECK),
            "--smoke",
            "--variant",
            variant,
            "--steps",
            "1",
            "--warmup",
            "1",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["tokens_per_s"] > 0 and result["last_loss"] > 0


def test_gpu_check_plan_figures_cover_every_variant(tmp_path):
    plan = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--write-plan", str(plan)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    variants = json.loads(plan.read_text())["variants"]
    assert set(variants) == {"local", "grouped_gemm", "native"} and all(
        0 < v["total_gib"] < 131.3 for v in variants.values()
    )


def test_gpu_check_script_without_preparation_exits_2_and_names_the_make_target(tmp_path):
    done = subprocess.run(
        ["bash", str(GPU_CHECK_SH)],
        env={**ENV, "GPU_CHECK_DIR": str(tmp_path), "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "make gpu-check-prepare" in done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is installed by make test (system-packages)")
def test_gpu_check_script_passes_shellcheck():
    done = subprocess.run(["shellcheck", str(GPU_CHECK_SH)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_gpu_check_script_links_every_moe_cdk_package_the_trainer_imports():
    """The GPU machine runs the trainer from package links, not an install: a package the trainer
    imports and the script does not link fails there at the first import (as moe_cdk.core did)."""
    import ast
    import re

    imported = set()
    for path in (ROOT / "training").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            imported |= {name.split(".")[1] for name in names if name.startswith("moe_cdk.")}
    linked = set(re.search(r"^for package in ([\w ]+); do$", GPU_CHECK_SH.read_text(), re.M).group(1).split())
    assert imported <= linked, f"imported by training/ but not linked: {sorted(imported - linked)}"
