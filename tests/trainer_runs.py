"""Running moe-train and the probes from the tests (one process, the node launcher or torchrun), and reading
what a run left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ports import free_port
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "training/configs/tiny.yaml"
LOCAL_RANKS = ROOT / "tests/local_ranks.py"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


# Our configuration check lets this through; megatron-core's TransformerConfig refuses it
# (transformer_config.py: "moe_act in recompute_modules is only supported with moe_grouped_gemm").
MEGATRON_REJECTS = ("--set", "recompute.granularity=selective", "--set", "recompute.modules=[moe_act]")


@pytest.fixture(scope="module")
def data_prefix(tmp_path_factory) -> str:
    """Where a test module's runs tokenize the bundled corpus, once per module."""
    return str(tmp_path_factory.mktemp("data") / "tiny_text_document")


def probe_result(script: Path, *args: str) -> dict:
    """Run a probe script of tests/ in one process; the JSON its last line prints."""
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def python(nproc: int = 1) -> list[str]:
    """The interpreter, or ``nproc`` of it started by moe-train's node launcher (tests/local_ranks.py) with a free
    master port; a script or ``-m module`` follows."""
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, str(LOCAL_RANKS), str(nproc), str(free_port()), sys.executable]


def under_torchrun(nproc: int) -> list[str]:
    """torchrun with ``nproc`` processes on a free master port; a script or ``-m module`` follows."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}"]


def train_command(run_dir: Path, data_prefix: str, *extra: str, nproc: int = 1, torchrun: bool = False) -> list[str]:
    """moe-train on the tiny profile; ``nproc`` ranks on this machine started by its node launcher
    (``--nproc-per-node``, as the quick start, SageMaker and Kubeflow start them), or by torchrun."""
    if torchrun:
        start = [*under_torchrun(nproc), "-m", "moe_cdk.cli.train"]
    else:
        start = [sys.executable, "-m", "moe_cdk.cli.train", *(("--nproc-per-node", str(nproc)) if nproc > 1 else ())]
    return [
        *start,
        "--config",
        str(TINY),
        "--checkpoint-dir",
        str(run_dir / "ckpt"),
        "--metrics-file",
        str(run_dir / "metrics.jsonl"),
        "--set",
        f"data.prefixes=[{data_prefix}]",
        "--set",
        f"data.prepare_from=[{ROOT / 'training/configs/tiny-corpus.txt'}]",
        *extra,
    ]


def rank_env() -> dict[str, str]:
    """ENV with a free rendezvous port (``MASTER_PORT``) for the ranks of one run; a world of one binds none."""
    return {**ENV, "MASTER_PORT": str(free_port())}


def run_training(
    run_dir: Path, data_prefix: str, *extra: str, nproc: int = 1, torchrun: bool = False
) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_command(run_dir, data_prefix, *extra, nproc=nproc, torchrun=torchrun),
        cwd=ROOT,
        env=rank_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_parameters(checkpoint: Path, out: Path) -> dict[str, torch.Tensor]:
    """Every model tensor of a checkpoint, whole (dist_checkpointing stores global tensors)."""
    dcp_to_torch_save(str(checkpoint), str(out))
    state = torch.load(out, weights_only=False)
    return {
        k: v
        for k, v in state.items()
        if k.startswith(("decoder.", "embedding.", "output_layer.")) and isinstance(v, torch.Tensor)
    }
