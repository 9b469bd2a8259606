"""Benchmark (d): model FLOPs utilisation of one GPU on a p5en-sized stack of MoE transformer layers.

Builds megatron's GPTModel layers with Mixtral-8x7B widths (hidden 4096, expert FFN 14336,
8 experts, top-2, 32 heads, 8 KV groups) but only as many layers as fit one GPU, runs
forward+backward in bf16 autocast, and reports tokens/s and MFU: achieved FLOP/s from the
active-parameter count (6 x active parameters + causal attention, per token; the same
formula the trainer logs) over the device's dense BF16 peak.

Needs a CUDA GPU; on a machine without one it says so and exits with code 1.

    .venv/bin/python bench/gpu_mfu.py [--layers 4] [--seq-length 4096] [--micro-batch 1] [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from _common import init_single_process, report, timed

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="dense BF16 peak of the GPU; default: from its model name (H200/H100 989, A100 312)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_mfu.py needs a CUDA GPU (none found); run it on a p5en node or any H100/H200.", file=sys.stderr)
        return 1
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.metrics import default_peak_tflops, peak_memory_gib
    from moe_cdk.training.model import build_model, flops_per_token
    from moe_cdk.training.trainer import causal_mask

    config = load_train_config(ROOT / "training/configs/mixtral-8x7b.yaml", [
        f"model.num_layers={args.layers}", f"model.seq_length={args.seq_length}",
        "parallel.tensor=1", "parallel.expert=1", f"optim.micro_batch_size={args.micro_batch}",
        f"optim.global_batch_size={args.micro_batch}",
    ])
    init_single_process()
    vocab = 32000
    model = build_model(config, vocab, on_gpu=True)
    seq, micro = args.seq_length, args.micro_batch
    tokens = torch.randint(0, vocab, (micro, seq + 1), device="cuda")
    positions = torch.arange(seq, device="cuda").expand(micro, seq)
    mask = causal_mask(seq, "cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens[:, :-1], positions, mask, labels=tokens[:, 1:]).float().mean()
        loss.backward()
        model.zero_grad(set_to_none=True)

    seconds = timed(step, warmup=3, iters=args.iters)
    tokens_per_s = micro * seq / seconds
    peak = args.peak_tflops or default_peak_tflops() or float("nan")
    achieved = tokens_per_s * flops_per_token(config, vocab) / 1e12
    rows = [{"device": torch.cuda.get_device_name(), "layers": args.layers, "tokens_per_s": tokens_per_s,
             "achieved_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak,
             "peak_memory_gib": peak_memory_gib()}]
    report("gpu_mfu", rows, {"seq_length": seq, "micro_batch": micro,
                             "note": "one GPU, expert-parallel 1: no all-to-all; the embedding and output layer are included"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
