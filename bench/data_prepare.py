"""Benchmark: `moe-data prepare --workers 2` against `--workers 1` on one corpus, end to end (the
command as a user runs it: interpreter start, spawning the workers, reading, tokenizing, writing).

Method: a JSON-lines corpus of ``--size-mib`` MiB (random words from a fixed 5,000-word list, 50
to 600 words per document, seeded, so every run reads the same bytes) is written once into
``--dir``; so is a byte-level BPE tokenizer.json with an 8,000-token vocabulary, trained on the
corpus's first MiB with the ``tokenizers`` library. Then, for each tokenizer (the byte tokenizer
and that BPE), one untimed run of each side and ``--repeats`` paired rounds, the order
alternating. Each round also checks that both sides wrote the same .bin and .idx bytes. Reported:
min, median and max seconds of each side, and of the round-by-round speedups (1 worker / 2). Put
``--dir`` on tmpfs (the default, /dev/shm) to measure the software, not this disk's slow spells.

    .venv/bin/python bench/data_prepare.py [--size-mib 100] [--repeats 3] [--dir /dev/shm/moe-bench-prepare]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from _common import paired, ratios, report, spread

MIB = 2**20


def write_corpus(path: Path, size_mib: int) -> None:
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    written, target = 0, size_mib * MIB
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as out:
        while written < target:
            line = json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(50, 600))), "id": written}) + "\n"
            out.write(line)
            written += len(line)
    partial.replace(path)


def write_bpe(corpus: Path, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts, read = [], 0
    with corpus.open() as lines:
        for line in lines:
            texts.append(json.loads(line)["text"])
            read += len(line)
            if read >= MIB:
                break
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, trainer)
    bpe.save(str(path))


def digest(prefix: Path) -> str:
    sha = hashlib.sha256()
    for suffix in (".bin", ".idx"):
        sha.update(Path(f"{prefix}{suffix}").read_bytes())
    return sha.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm/moe-bench-prepare"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    corpus = args.dir / f"corpus-{args.size_mib}mib.jsonl"
    if not corpus.is_file():
        write_corpus(corpus, args.size_mib)
    bpe = args.dir / "bpe-8000.json"
    if not bpe.is_file():
        write_bpe(corpus, bpe)

    rows, runs, digests = [], {}, {}
    for name, tokenizer in (("byte", "byte"), ("bpe-8000", str(bpe))):

        def side(workers: int, name=name, tokenizer=tokenizer):
            prefix = args.dir / f"out-{name}-w{workers}"

            def run() -> float:
                started = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "moe_cdk.cli.data", "prepare", "--input", str(corpus)]
                    + ["--output-prefix", str(prefix), "--tokenizer", tokenizer, "--workers", str(workers)],
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                seconds = time.perf_counter() - started
                digests.setdefault((name, workers), set()).add(digest(prefix))
                return seconds

            return run

        timed = paired({"workers 1": side(1), "workers 2": side(2)}, repeats=args.repeats)
        runs[name] = timed
        identical = len(digests[(name, 1)] | digests[(name, 2)]) == 1
        rows.append(
            {
                "tokenizer": name,
                "workers 1 (s)": spread(timed["workers 1"]),
                "workers 2 (s)": spread(timed["workers 2"]),
                "speedup": ratios(timed["workers 1"], timed["workers 2"]),
                "MiB/s (2 workers)": args.size_mib / spread(timed["workers 2"])["median"],
                "same bytes": identical,
            }
        )
    report(
        "data_prepare",
        rows,
        {"corpus_mib": args.size_mib, "repeats": args.repeats, "dir": str(args.dir), "runs": runs},
    )


if __name__ == "__main__":
    main()
