"""Benchmark (b): checkpoint save and load through megatron-core dist_checkpointing (torch_dist)
against a plain sequential write and read of the same number of bytes on the same disk.

Reported: GB/s of each and the ratios. The read figures include the page cache (the
file was just written); the write figures include an fsync.

    .venv/bin/python bench/checkpoint_io.py [--size-mib 512] [--dir /tmp/moe-bench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch

from _common import init_single_process, report


def sharded_state(tensors: dict[str, torch.Tensor]) -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    return {name: ShardedTensor.from_rank_offsets(name, t, replica_id=0) for name, t in tensors.items()}


def fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--dir", default="/tmp/moe-bench-checkpoint")
    args = parser.parse_args()
    from megatron.core import dist_checkpointing

    init_single_process()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    # Layer-like tensors of 16 MiB each (fp32), like a model's weight matrices.
    count = max(args.size_mib // 16, 1)
    tensors = {f"layer{i}.weight": torch.randn(2048, 2048) for i in range(count)}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    gb = nbytes / 1e9

    checkpoint = root / "step-1"
    checkpoint.mkdir()
    started = time.perf_counter()
    dist_checkpointing.save(sharded_state(tensors), str(checkpoint))
    fsync_tree(checkpoint)
    save_s = time.perf_counter() - started
    template = sharded_state({k: torch.empty_like(v) for k, v in tensors.items()})
    started = time.perf_counter()
    loaded = dist_checkpointing.load(template, str(checkpoint))
    load_s = time.perf_counter() - started
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors), "checkpoint round trip changed the tensors"

    plain = root / "plain.bin"
    payload = [t.numpy().tobytes() for t in tensors.values()]
    started = time.perf_counter()
    with open(plain, "wb") as handle:
        for chunk in payload:
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    with open(plain, "rb") as handle:
        while handle.read(64 * 2**20):
            pass
    read_s = time.perf_counter() - started
    shutil.rmtree(root, ignore_errors=True)

    rows = [
        {"operation": "dist_checkpointing save", "seconds": save_s, "GB_per_s": gb / save_s},
        {"operation": "plain sequential write", "seconds": write_s, "GB_per_s": gb / write_s},
        {"operation": "dist_checkpointing load", "seconds": load_s, "GB_per_s": gb / load_s},
        {"operation": "plain sequential read", "seconds": read_s, "GB_per_s": gb / read_s},
    ]
    report("checkpoint_io", rows, {"bytes": nbytes, "directory": args.dir,
                                   "save_over_plain_write": write_s / save_s, "load_over_plain_read": read_s / load_s})


if __name__ == "__main__":
    main()
