"""Benchmark (c): how fast the DataLoader delivers tokens against how fast the trainer consumes them.

The loader reads the bundled tiny corpus through megatron's GPTDataset and the trainer's
resumable sampler; the consumer is the tiny profile's model doing forward, backward and
an optimizer step on the same batch shape. A loader/consumer ratio above 1 means data
loading is not the bottleneck.

    .venv/bin/python bench/dataloader.py [--config training/configs/tiny.yaml] [--batches 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from _common import init_single_process, report, timed

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "training/configs/tiny.yaml"))
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    from moe_cdk.training import data
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.model import build_model
    from moe_cdk.training.trainer import causal_mask

    config = load_train_config(args.config)
    init_single_process()
    tokenizer = data.load_tokenizer(None)
    micro, seq = config.optim.micro_batch_size, config.model.seq_length
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "bench_text_document"
        data.prepare([ROOT / "training/configs/tiny-corpus.txt"], prefix, tokenizer)
        dataset = data.build_gpt_dataset(data_prefixes=[str(prefix)], weights=None, seq_length=seq,
                                         num_samples=args.batches * micro, seed=1, tokenizer=tokenizer, cache_dir=tmp)
        rows = []
        for workers in (0, 1, 2):
            sampler = data.ResumableSampler(len(dataset), micro_batch_size=micro, data_parallel_rank=0, data_parallel_size=1)
            loader = iter(data.make_dataloader(dataset, sampler, num_workers=workers, prefetch_factor=4, pin_memory=False))
            next(loader)  # start the workers
            started = time.perf_counter()
            for _ in range(args.batches):
                next(loader)
            seconds = time.perf_counter() - started
            rows.append({"side": f"DataLoader, {workers} worker(s)", "tokens_per_s": args.batches * micro * seq / seconds})

    model = build_model(config, tokenizer.vocab_size, on_gpu=torch.cuda.is_available())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    device = next(model.parameters()).device
    tokens = torch.randint(0, 256, (micro, seq + 1), device=device)
    positions = torch.arange(seq, device=device).expand(micro, seq)
    mask = causal_mask(seq, device)

    def train_step():
        optimizer.zero_grad()
        model(tokens[:, :-1], positions, mask, labels=tokens[:, 1:]).mean().backward()
        optimizer.step()

    seconds = timed(train_step, warmup=3, iters=20)
    consumer = micro * seq / seconds
    rows.append({"side": "trainer consumption (tiny model)", "tokens_per_s": consumer})
    best_loader = max(r["tokens_per_s"] for r in rows[:-1])
    report("dataloader", rows, {"micro_batch_size": micro, "seq_length": seq, "loader_over_consumer": best_loader / consumer})


if __name__ == "__main__":
    main()
