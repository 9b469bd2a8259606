"""Benchmark (d): the trainer's tokens/s against a bare megatron-core step at equal shapes.

The trainer is ``moe-train`` itself. The bare step is the same model, DDP, optimizer,
scheduler and data (the trainer's own ``build`` and ``train_step``, which call megatron's
forward-backward schedule and optimizer) in a plain loop, without the MoE probe's hooks, the
metrics records, the JSONL file, the probe files or checkpoints.

Method: each is run as a fresh process for ``--short`` and for ``--long`` steps, ``--repeats``
times, alternating (trainer short, trainer long, bare short, bare long; then the bare side
first, and so on); each round's per-step time is (its long run's wall time - its short run's)
/ (long - short), so start-up, data preparation and the trainer's final checkpoint cancel out;
the runs write into /dev/shm where it exists, so that a slow spell of the disk cannot make
them differ.
The trainer writes a record every ``--log-interval`` steps (default 10, as the shipped
profiles do; 1 is the worst case). Reported: min, median and max of
the per-step seconds and of the round-by-round ratio; the goal is a median of at least 0.95.

    .venv/bin/python bench/trainer_overhead.py [--short 10] [--long 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import in_turn, ratios, report, spread

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "training/configs/tiny.yaml"
SHAPE = (
    "model.num_layers=4",
    "model.hidden_size=128",
    "model.ffn_hidden_size=256",
    "model.num_attention_heads=8",
    "model.seq_length=128",
    "moe.num_experts=8",
    "optim.micro_batch_size=4",
    "optim.global_batch_size=8",
)


def _overrides(data: Path, run: Path, steps: int, log_interval: int) -> list[str]:
    return [
        *SHAPE,
        f"metrics.log_interval={log_interval}",
        f"data.prefixes=[{data / 'tiny_text_document'}]",
        f"data.prepare_from=[{ROOT / 'training/configs/tiny-corpus.txt'}]",
        f"checkpoint.dir={run / 'ckpt'}",
        f"checkpoint.save_interval={steps + 1}",
        f"metrics.file={run / 'metrics.jsonl'}",
        f"max_steps={steps}",
    ]


def bare(overrides: list[str]) -> None:
    """The bare loop, in this process (``--bare``)."""
    import torch

    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.data.tokenizers import load_tokenizer
    from moe_cdk.training.launch_env import detect
    from moe_cdk.training.step import trainer

    config = load_train_config(TINY, overrides)
    runtime = trainer.setup(config, detect())
    tokenizer = load_tokenizer(None)
    trainer.prepare_data(config, tokenizer, runtime)
    trainable = trainer.build(config, runtime, tokenizer.vocab_size)
    o = config.optim
    batches = trainer.training_batches(config, runtime, tokenizer, step=0, consumed_samples=0)
    mask = trainer.causal_mask(config.model.seq_length, runtime.device)
    for chunk in trainable.chunks:
        chunk.train()
    for _ in range(config.max_steps):
        trainer.train_step(trainable, batches, runtime, mask, config.model.seq_length, o.micro_batch_size)
    torch.distributed.barrier()
    trainer.teardown()


# Runs write their checkpoint and metrics into memory where Linux offers it: a disk's slow
# spell (docs/benchmarks.md) would otherwise land on the trainer's final checkpoint at random
# and not cancel out of the short/long difference.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _wall(kind: str, steps: int, data: Path, log_interval: int) -> float:
    run = Path(tempfile.mkdtemp(prefix=f"moe-overhead-{kind}-", dir=SCRATCH))
    try:
        overrides = _overrides(data, run, steps, log_interval)
        if kind == "trainer":
            sets = [arg for value in overrides for arg in ("--set", value)]
            command = [sys.executable, "-m", "moe_cdk.cli.train", "--config", str(TINY), *sets]
        else:
            command = [sys.executable, __file__, "--bare", *overrides]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "PYTHONWARNINGS": "ignore"}
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{kind} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return elapsed
    finally:
        shutil.rmtree(run, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--log-interval",
        type=int,
        default=10,
        help="steps per metrics record (default 10, as in the shipped profiles; 1 is the worst case)",
    )
    parser.add_argument("--bare", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare is not None:
        bare(args.bare)
        return
    data = Path(tempfile.mkdtemp(prefix="moe-overhead-data-", dir=SCRATCH))
    try:
        _wall("trainer", 1, data, args.log_interval)  # tokenizes the corpus once, untimed
        walls: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.repeats):
            for kind in in_turn(["trainer", "bare"], round_):
                for steps in (args.short, args.long):
                    walls.setdefault((kind, steps), []).append(_wall(kind, steps, data, args.log_interval))
    finally:
        shutil.rmtree(data, ignore_errors=True)
    from moe_cdk.training.config import load_train_config

    config = load_train_config(TINY, list(SHAPE))
    tokens_per_step = config.optim.global_batch_size * config.model.seq_length
    steps = args.long - args.short
    # Each round's per-step time, from that round's short and long run.
    per_round = {
        kind: [(long - short) / steps for short, long in zip(walls[(kind, args.short)], walls[(kind, args.long)])]
        for kind in ("bare", "trainer")
    }
    rows = []
    for kind in ("bare", "trainer"):
        s = spread(per_round[kind])
        rows.append(
            {
                "run": kind,
                "median_step_s": s["median"],
                "min_step_s": s["min"],
                "max_step_s": s["max"],
                "tokens_per_s": tokens_per_step / s["median"],
            }
        )
    report(
        "trainer_overhead",
        rows,
        {
            "shape": list(SHAPE),
            "log_interval": args.log_interval,
            "scratch": SCRATCH or tempfile.gettempdir(),
            "short_steps": args.short,
            "long_steps": args.long,
            "repeats": args.repeats,
            "trainer_over_bare": ratios(per_round["bare"], per_round["trainer"]),
            "target": 0.95,
            "runs": {f"{kind} {n} steps": walls[(kind, n)] for kind, n in walls},
        },
    )


if __name__ == "__main__":
    main()
