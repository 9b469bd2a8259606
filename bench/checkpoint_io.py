"""Benchmark (b): checkpoint save and load as the trainer does them (megatron-core
dist_checkpointing, torch_dist, the trainer's fully parallel strategies) against a plain
sequential write and read of the same tensors on the same disk.

Method: one untimed save and load first (the trainer starts the checkpoint writer's helper
process once, at start-up, so a run's saves never pay for it); then ``--repeats`` rounds,
each timing a checkpoint save and a plain write into fresh folders, then a checkpoint load and
a plain read, the plain side first in every other round. Both writes end with an fsync of
every file; before the reads both are evicted from the page cache (``drop_caches`` where root
may write it, else ``posix_fadvise``; the JSON says which), so both read from the disk, into
preallocated tensors. On a file system held in memory (tmpfs, ramfs) there is nothing to evict:
the files are the cache, and ``drop_caches`` would only evict the program's own code, which the
checkpoint side, running more of it, would then read back from the disk. Reported: min, median
and max of each, and of the round-by-round ratios; the JSON also names the directory and its
file system type.

    .venv/bin/python bench/checkpoint_io.py [--size-mib 512] [--repeats 9] [--dir /tmp/moe-bench-checkpoint]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch
from _common import in_turn, init_single_process, ratios, report, spread


def sharded_state(tensors: dict[str, torch.Tensor]) -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    return {name: ShardedTensor.from_rank_offsets(name, t, replica_id=0) for name, t in tensors.items()}


def fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())


DROP_CACHES = Path("/proc/sys/vm/drop_caches")
IN_MEMORY = frozenset({"tmpfs", "ramfs"})


def filesystem_type(path: Path) -> str:
    """The type of the file system ``path`` is on: the mount in /proc/self/mounts with the
    longest mount point that contains it (mount points there escape spaces as \\040)."""
    resolved, best, kind = path.resolve(), -1, "unknown"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = Path(fields[1].replace("\\040", " "))
        if (resolved == mount or mount in resolved.parents) and len(mount.parts) > best:
            best, kind = len(mount.parts), fields[2]
    return kind


def evict(fs_type: str, *paths: Path) -> str:
    """Drop the pages of ``paths`` (files, or every file under a folder) from the page cache,
    so the next reads come from the disk: the whole cache where root may write
    ``drop_caches``, else each file's written-back pages (POSIX_FADV_DONTNEED); nothing on a
    file system held in memory. Returns which was used."""
    if fs_type in IN_MEMORY:
        return "none (in memory)"
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
        return "drop_caches"
    except OSError:
        for path in paths:
            for file in [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]:
                with open(file, "rb") as handle:
                    os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return "posix_fadvise"


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument(
        "--repeats",
        type=int,
        default=9,
        help="rounds (default 9: the disk here has slow spells, see docs/benchmarks.md)",
    )
    parser.add_argument("--dir", default="/tmp/moe-bench-checkpoint")
    args = parser.parse_args()
    from megatron.core import dist_checkpointing

    from moe_cdk.training.checkpoints.format import load_strategy, save_strategy

    init_single_process()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    fs_type = filesystem_type(root)
    # Layer-like tensors of 16 MiB each (fp32), like a model's weight matrices.
    count = max(args.size_mib // 16, 1)
    tensors = {f"layer{i}.weight": torch.randn(2048, 2048) for i in range(count)}
    targets = {k: torch.empty_like(v) for k, v in tensors.items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    gb = nbytes / 1e9
    strategy = save_strategy()

    def save(folder: Path) -> None:
        folder.mkdir()
        dist_checkpointing.save(sharded_state(tensors), str(folder), sharded_strategy=strategy)
        fsync_tree(folder)

    def load(folder: Path) -> None:
        loaded = dist_checkpointing.load(sharded_state(targets), str(folder), sharded_strategy=load_strategy())
        assert all(torch.equal(loaded[k], tensors[k]) for k in tensors), "checkpoint round trip changed the tensors"

    def write(file: Path) -> None:
        with open(file, "wb") as handle:
            for tensor in tensors.values():
                handle.write(memoryview(tensor.numpy()))
            handle.flush()
            os.fsync(handle.fileno())

    def read(file: Path) -> None:
        with open(file, "rb") as handle:
            for tensor in targets.values():
                handle.readinto(memoryview(tensor.numpy()))
        assert all(torch.equal(targets[k], tensors[k]) for k in tensors), "plain round trip changed the tensors"

    save(root / "warm-up")
    load(root / "warm-up")
    shutil.rmtree(root / "warm-up")
    os.sync()
    times: dict[str, list[float]] = {"save": [], "write": [], "load": [], "read": []}
    for i in range(args.repeats):
        folder, file = root / f"step-{i}", root / f"plain-{i}.bin"
        operations = {
            "save": lambda folder=folder: save(folder),
            "write": lambda file=file: write(file),
            "load": lambda folder=folder: load(folder),
            "read": lambda file=file: read(file),
        }
        for key in in_turn(["save", "write"], i):
            times[key].append(_timed(operations[key]))
        eviction = evict(fs_type, folder, file)
        for key in in_turn(["load", "read"], i):
            times[key].append(_timed(operations[key]))
        shutil.rmtree(folder)
        file.unlink()
        os.sync()
    shutil.rmtree(root, ignore_errors=True)

    names = {
        "save": "dist_checkpointing save",
        "write": "plain sequential write",
        "load": "dist_checkpointing load",
        "read": "plain sequential read",
    }
    rows = []
    for key, values in times.items():
        s = spread(values)
        rows.append(
            {
                "operation": names[key],
                "median_s": s["median"],
                "min_s": s["min"],
                "max_s": s["max"],
                "GB_per_s": gb / s["median"],
            }
        )
    report(
        "checkpoint_io",
        rows,
        {
            "bytes": nbytes,
            "repeats": args.repeats,
            "directory": args.dir,
            "filesystem": fs_type,
            "cache_eviction": eviction,
            "save_over_plain_write": ratios(times["write"], times["save"]),
            "load_over_plain_read": ratios(times["read"], times["load"]),
            "target": 0.8,
            "runs": times,
        },
    )


if __name__ == "__main__":
    main()
