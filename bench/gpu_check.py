"""GPU readiness: the trainer's own step on one GPU for a stack of Mixtral-shaped MoE layers.

Builds the model, DDP, megatron optimizer and scheduler with the trainer's ``build`` from
``mixtral-8x7b.yaml`` (bf16 parameters, the local spec, core-attention recompute, the
distributed optimizer) cut to ``--layers`` layers and one GPU (TP, EP and PP 1), runs
``--steps`` of the trainer's ``train_step`` on synthetic tokens after ``--warmup`` untimed
ones, and writes JSON: tokens/s, MFU against the datasheet peak and against a measured bf16
matmul peak, and peak memory against ``moe-cdk plan``'s figure for the same shape (read from
``--plan-json``, which ``--write-plan`` makes on a machine with the CDK installed).

``--variant grouped_gemm`` asks for megatron's grouped GEMM; without Transformer Engine it
needs the ``grouped_gemm`` package, and the JSON says so when it is missing. ``--variant native`` runs the native
spec (torch's fused attention and grouped GEMM, no core-attention recompute).

    .venv/bin/python bench/gpu_check.py --write-plan .gpu-check/plan.json   # here, before the run
    python bench/gpu_check.py --plan-json .gpu-check/plan.json --out result.json  # on the GPU
    .venv/bin/python bench/gpu_check.py --smoke --out /tmp/smoke.json          # the same code on CPU, tiny shape
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIXTRAL = ROOT / "training/configs/mixtral-8x7b.yaml"
TINY = ROOT / "training/configs/tiny.yaml"
VOCAB = 32000
VARIANTS = ("local", "grouped_gemm", "native")


def overrides(*, layers: int, seq_length: int, micro_batches: int, variant: str) -> list[str]:
    """The profile cut to one GPU. Its core-attention recompute applies to the local variants only (the trainer skips
    it under the native spec, whose attention never builds the s x s scores it drops)."""
    return [
        f"model.num_layers={layers}",
        f"model.seq_length={seq_length}",
        "parallel.tensor=1",
        "parallel.expert=1",
        "parallel.expert_tensor=1",
        "optim.micro_batch_size=1",
        f"optim.global_batch_size={micro_batches}",
        f"model.spec={'native' if variant == 'native' else 'local'}",
        f"moe.grouped_gemm={'true' if variant == 'grouped_gemm' else 'false'}",
    ]


def write_plan(path: Path, args) -> None:
    """The plan's memory figures for every variant's shape on one 131.3 GiB H200 (needs the CDK)."""
    from moe_cdk.tools.plan import memory_per_device
    from moe_cdk.training.config import load_train_config

    figures = {}
    for variant in VARIANTS:
        train = load_train_config(
            MIXTRAL,
            overrides(
                layers=args.layers, seq_length=args.seq_length, micro_batches=args.micro_batches, variant=variant
            ),
        )
        est = memory_per_device(train, world_size=1, vocab_size=VOCAB, device_memory_gib=141e9 / 2**30)
        figures[variant] = {
            "total_gib": est.total,
            "parameters_gib": est.parameters,
            "gradients_gib": est.gradients,
            "optimizer_gib": est.optimizer,
            "activations_gib": est.activations,
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "layers": args.layers,
                "seq_length": args.seq_length,
                "micro_batches": args.micro_batches,
                "variants": figures,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {path}")


def matmul_peak_tflops(device) -> float:
    """Measured dense bf16 matmul throughput of this device, TFLOP/s."""
    import torch

    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    started, iters = time.perf_counter(), 20
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - started) / 1e12


def run(args) -> dict:
    import torch

    from moe_cdk.core.problems import ConfigError
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.launch_env import detect
    from moe_cdk.training.metrics import default_peak_tflops, peak_memory_gib
    from moe_cdk.training.step import trainer
    from moe_cdk.training.step.sizes import flops_per_token

    if args.smoke:
        config_path, vocab = TINY, 257
        spec = "native" if args.variant == "native" else "local"
        config = load_train_config(TINY, ["optim.global_batch_size=8", f"model.spec={spec}"])
    else:
        config_path, vocab = MIXTRAL, VOCAB
        config = load_train_config(
            MIXTRAL,
            overrides(
                layers=args.layers, seq_length=args.seq_length, micro_batches=args.micro_batches, variant=args.variant
            ),
        )
    result = {
        "variant": args.variant,
        "config": str(config_path.relative_to(ROOT)),
        "layers": config.model.num_layers,
        "seq_length": config.model.seq_length,
        "micro_batches": config.optim.global_batch_size,
    }
    if args.variant == "grouped_gemm" and not importlib.util.find_spec("grouped_gemm"):
        return {
            **result,
            "skipped": "megatron's grouped GEMM without Transformer Engine needs the grouped_gemm package",
        }
    runtime = trainer.setup(config, detect())
    try:
        try:
            trainable = trainer.build(config, runtime, vocab)
        except ConfigError as error:
            return {**result, "skipped": "; ".join(error.errors)}
        o, s = config.optim, config.model.seq_length
        generator = torch.Generator().manual_seed(0)

        def batches():
            while True:
                tokens = torch.randint(0, vocab, (o.micro_batch_size, s + 1), generator=generator)
                yield {
                    "tokens": tokens[:, :-1],
                    "labels": tokens[:, 1:],
                    "position_ids": torch.arange(s).expand(o.micro_batch_size, s),
                    "loss_mask": torch.ones(o.micro_batch_size, s),
                }

        stream, mask = batches(), trainer.causal_mask(s, runtime.device)
        on_gpu = runtime.device.type == "cuda"
        sync = torch.cuda.synchronize if on_gpu else (lambda: None)
        for _ in range(args.warmup):
            trainer.train_step(trainable, stream, runtime, mask, s, o.micro_batch_size)
        sync()
        started = time.perf_counter()
        for _ in range(args.steps):
            losses, _ = trainer.train_step(trainable, stream, runtime, mask, s, o.micro_batch_size)
        sync()
        step_s = (time.perf_counter() - started) / args.steps
        tokens_per_s = o.global_batch_size * s / step_s
        achieved = tokens_per_s * flops_per_token(config, vocab) / 1e12
        result.update(
            {
                "device": torch.cuda.get_device_name() if on_gpu else "cpu",
                "step_s": step_s,
                "tokens_per_s": tokens_per_s,
                "achieved_tflops": achieved,
                "last_loss": float(losses[-1]) if losses else None,
                "peak_memory_gib": peak_memory_gib(),
            }
        )
        if on_gpu:
            datasheet, measured = default_peak_tflops(), matmul_peak_tflops(runtime.device)
            result.update(
                {
                    "datasheet_peak_tflops": datasheet,
                    "measured_matmul_tflops": measured,
                    "mfu_datasheet": achieved / datasheet if datasheet else None,
                    "mfu_measured": achieved / measured,
                }
            )
        if args.plan_json:
            planned = json.loads(Path(args.plan_json).read_text())["variants"][args.variant]
            result.update(
                {
                    "plan_total_gib": planned["total_gib"],
                    "peak_over_plan": result["peak_memory_gib"] / planned["total_gib"],
                }
            )
        return result
    finally:
        trainer.teardown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variant", choices=VARIANTS, default="local")
    parser.add_argument("--plan-json", help="moe-cdk plan's figures for the shapes (from --write-plan)")
    parser.add_argument("--write-plan", metavar="PATH", help="write the plan's figures to PATH and exit")
    parser.add_argument("--smoke", action="store_true", help="the tiny profile on whatever device is here")
    parser.add_argument("--out", help="write the result JSON here (default: stdout only)")
    args = parser.parse_args()
    if args.write_plan:
        write_plan(Path(args.write_plan), args)
        return 0
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check.py needs a CUDA GPU (none found); --smoke runs the tiny profile here.", file=sys.stderr)
        return 1
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
