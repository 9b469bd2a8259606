"""Shared helpers for the bench/ scripts: a single-process megatron set-up, the one measuring
method (paired rounds after a warm-up, the order alternating, reported as min, median and max), a table, a JSON file."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def init_single_process() -> None:
    """A one-rank gloo (CPU) or NCCL (GPU) group with megatron's parallel state, as the trainer sets it up."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from moe_cdk.training.step import cpu_compat

    if not torch.cuda.is_available():
        cpu_compat.activate()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 500))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)


def timed(fn, *, warmup: int, iters: int) -> float:
    """Mean seconds per call of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters


def spread(values: list[float]) -> dict:
    """min, median and max of ``values``: the median is the figure; a wide range means a noisy run."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def paired(sides: dict[str, Callable[[], float]], *, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run every side once per round, in turn, after ``warmup`` untimed rounds, the order
    reversed every other round (A B, B A, A B ...) so that neither side always runs in the
    state the other leaves behind; each call returns its own measurement. Returns every
    round's figure per side."""
    for _ in range(warmup):
        for measure in sides.values():
            measure()
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(repeats):
        for name in in_turn(list(sides), round_):
            runs[name].append(sides[name]())
    return runs


def in_turn(sides: list, round_: int) -> list:
    """``sides`` in the order round ``round_`` runs them: as given, reversed every other round."""
    return sides if round_ % 2 == 0 else sides[::-1]


def ratios(numerator: list[float], denominator: list[float]) -> dict:
    """The spread of the round-by-round ratios numerator / denominator."""
    return spread([a / b for a, b in zip(numerator, denominator)])


def report(name: str, rows: list[dict], extra: dict) -> Path:
    """Print ``rows`` as a table and write them, with ``extra`` and the machine, to bench/results/<name>.json."""
    columns = list(rows[0])
    widths = [max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(_fmt(row[c]).ljust(w) for c, w in zip(columns, widths)))
    for key, value in extra.items():
        if key != "runs":
            print(f"{key}: {_fmt(value)}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    machine = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    path.write_text(json.dumps({"benchmark": name, "machine": machine, "rows": rows, **extra}, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def _fmt(value) -> str:
    if isinstance(value, dict) and set(value) == {"min", "median", "max"}:
        return f"{_fmt(value['median'])} (min {_fmt(value['min'])}, max {_fmt(value['max'])})"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)
