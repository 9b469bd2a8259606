"""Benchmark (c): how fast the DataLoader delivers tokens against how fast the trainer consumes them.

The loader reads the bundled tiny corpus through megatron's GPTDataset and the trainer's
resumable sampler; the consumer is the tiny profile's model doing forward, backward and
an optimizer step on the same batch shape. A loader/consumer ratio above 1 means data
loading is not the bottleneck.

Each side is measured once per round, for ``--repeats`` paired rounds after a warm-up; the
table has min, median and max, and the ratio is taken round by round.

    .venv/bin/python bench/dataloader.py [--config training/configs/tiny.yaml] [--batches 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from _common import init_single_process, paired, ratios, report, spread, timed

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "training/configs/tiny.yaml"))
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5, help="paired rounds")
    args = parser.parse_args()
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.data import dataset as data
    from moe_cdk.training.data.prepare import prepare
    from moe_cdk.training.data.tokenizers import load_tokenizer
    from moe_cdk.training.step.model import build_model
    from moe_cdk.training.step.trainer import causal_mask

    config = load_train_config(args.config)
    init_single_process()
    tokenizer = load_tokenizer(None)
    micro, seq = config.optim.micro_batch_size, config.model.seq_length
    [model] = build_model(config, tokenizer.vocab_size, on_gpu=torch.cuda.is_available())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    device = next(model.parameters()).device
    tokens = torch.randint(0, 256, (micro, seq + 1), device=device)
    positions = torch.arange(seq, device=device).expand(micro, seq)
    mask = causal_mask(seq, device)

    def train_step():
        optimizer.zero_grad()
        model(tokens[:, :-1], positions, mask, labels=tokens[:, 1:]).mean().backward()
        optimizer.step()

    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "bench_text_document"
        prepare([ROOT / "training/configs/tiny-corpus.txt"], prefix, tokenizer)
        dataset = data.build_gpt_dataset(
            data_prefixes=[str(prefix)],
            weights=None,
            seq_length=seq,
            num_samples=args.batches * micro,
            seed=1,
            tokenizer=tokenizer,
            cache_dir=tmp,
        )

        def loader_seconds(workers: int) -> float:
            sampler = data.ResumableSampler(
                len(dataset), micro_batch_size=micro, data_parallel_rank=0, data_parallel_size=1
            )
            loader = iter(
                data.make_dataloader(dataset, sampler, num_workers=workers, prefetch_factor=4, pin_memory=False)
            )
            next(loader)  # start the workers
            started = time.perf_counter()
            for _ in range(args.batches - 1):
                next(loader)
            return (time.perf_counter() - started) / (args.batches - 1)

        sides = {f"DataLoader, {w} worker(s)": (lambda w=w: loader_seconds(w)) for w in (0, 1, 2)}
        sides["trainer consumption (tiny model)"] = lambda: timed(train_step, warmup=0, iters=20)
        runs = paired(sides, repeats=args.repeats)
    tokens_per_batch = micro * seq
    rows = [
        {
            "side": name,
            **{f"{k}_ms_per_batch": v * 1000 for k, v in spread(seconds).items()},
            "tokens_per_s": tokens_per_batch / spread(seconds)["median"],
        }
        for name, seconds in runs.items()
    ]
    consumer = runs.pop("trainer consumption (tiny model)")
    best_loader = [min(per_round) for per_round in zip(*runs.values())]  # the fastest loader of each round
    report(
        "dataloader",
        rows,
        {
            "micro_batch_size": micro,
            "seq_length": seq,
            "repeats": args.repeats,
            "loader_over_consumer": ratios(consumer, best_loader),
            "runs": {**runs, "trainer consumption (tiny model)": consumer},
        },
    )


if __name__ == "__main__":
    main()
