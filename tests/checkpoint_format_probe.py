"""The trainer's checkpoint strategies (training/checkpoints/format.py) against megatron's and
torch's own, in one process (a script, not a test file).

Run as ``python tests/checkpoint_format_probe.py DIR``. It saves a set of tensors with
``save_strategy()``, loads them back with ``load_strategy()`` and with megatron's stock
``TorchDistLoadShardedStrategy`` (torch's FileSystemReader: the reference), into whole and
resharded targets, and prints JSON: which cases load equal to the reference and to the saved
tensors, how each archive was read, whether the archives carry CRC-32s, the same with the
in-place read forced onto the wrong offset, how many processes each writer forked, whether the
CRC32C records match the files, and what a load reports for a flipped byte and for files
without a record.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import sys
import threading
import zipfile
import zlib
from pathlib import Path

import torch

SAVED = {
    "fp32_matrix": lambda: torch.randn(256, 512),
    "bf16_matrix": lambda: torch.randn(300, 70).bfloat16(),
    "int64_vector": lambda: torch.arange(1000),
    "scalar": lambda: torch.tensor(3.5),
    "three_floats": lambda: torch.randn(3),
    "transposed": lambda: torch.randn(64, 32).t(),
    "rows_16x8": lambda: torch.randn(16, 8),
}
# How each case is read back: the target's shape, and for a slice of the stored tensor, its
# (axis, fragment, fragments) as megatron's ShardedTensor.from_rank_offsets takes it. The two
# halves of rows_16x8 are read as two ranks would read them, from one archive.
TARGETS = {
    "fp32_matrix": ((256, 512), None),
    "bf16_matrix": ((300, 70), None),
    "int64_vector": ((1000,), None),
    "scalar": ((), None),
    "three_floats": ((3,), None),
    "transposed": ((32, 64), None),
    "rows_16x8_top": ((8, 8), (0, 0, 2)),
    "rows_16x8_bottom": ((8, 8), (0, 1, 2)),
}
NON_CONTIGUOUS_TARGET = "fp32_matrix"


def stored_key(name: str) -> str:
    return "rows_16x8" if name.startswith("rows_16x8") else name


def sharded(tensors: dict[str, torch.Tensor]) -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    out = {}
    for name, tensor in tensors.items():
        fragment = TARGETS[name][1] if name in TARGETS else None
        out[name] = (
            ShardedTensor.from_rank_offsets(stored_key(name), tensor, fragment, replica_id=0)
            if fragment
            else ShardedTensor.from_rank_offsets(stored_key(name), tensor, replica_id=0)
        )
    return out


def targets_like(saved: dict[str, torch.Tensor], *, non_contiguous: bool) -> dict[str, torch.Tensor]:
    out = {}
    for name, (shape, _) in TARGETS.items():
        dtype = saved[stored_key(name)].dtype
        if non_contiguous and name == NON_CONTIGUOUS_TARGET:
            out[name] = torch.zeros(tuple(reversed(shape)), dtype=dtype).t()
        else:
            out[name] = torch.zeros(shape, dtype=dtype)
    return out


def expected(saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, (_, fragment) in TARGETS.items():
        tensor = saved[stored_key(name)]
        if fragment:
            axis, index, count = fragment
            size = tensor.shape[axis] // count
            tensor = tensor.narrow(axis, index * size, size)
        out[name] = tensor
    return out


def archives(folder: Path) -> list[bytes]:
    from torch.distributed.checkpoint import FileSystemReader

    found = []
    for info in FileSystemReader(str(folder)).read_metadata().storage_data.values():
        with open(folder / info.relative_path, "rb") as handle:
            handle.seek(info.offset)
            found.append(handle.read(info.length))
    return found


def checksums(folder: Path) -> dict:
    """Per archive in ``folder``: whether the data record's CRC-32 is set, and right."""
    written, right = [], []
    for raw in archives(folder):
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            [entry] = [e for e in archive.infolist() if e.filename.endswith("/data/0")]
            header = raw[entry.header_offset : entry.header_offset + 30]  # the local header
            start = (
                entry.header_offset
                + 30
                + int.from_bytes(header[26:28], "little")
                + int.from_bytes(header[28:30], "little")
            )
            written.append(entry.CRC != 0)
            right.append(entry.CRC == zlib.crc32(raw[start : start + entry.file_size]))
    return {"written": written, "right": right}


def records_match(folder: Path) -> dict[str, bool]:
    """Per data file: its CRC32C record holds its size and items that tile it, each with the
    CRC32C of its bytes, computed here from the file as read back."""
    import crc32c

    from moe_cdk.training.checkpoints.checksums import read_checksums

    out = {}
    for data_file in sorted(folder.glob("*.distcp")):
        raw, record = data_file.read_bytes(), read_checksums(data_file)
        items = sorted(record["items"])
        tiles = [offset for offset, _, _ in items] == [0] + [o + n for o, n, _ in items[:-1]]
        out[data_file.name] = (
            record["bytes"] == len(raw)
            and tiles
            and sum(n for _, n, _ in items) == len(raw)
            and all(crc == crc32c.crc32c(raw[o : o + n]) for o, n, crc in items)
        )
    return out


def planner_lock_use() -> dict:
    """Whether ``_resolved`` holds the planner lock during its block, for a planner that keeps a
    request's state between resolve and commit (as megatron's does for FP8 targets) and for one
    that does not, and whether it commits and releases after."""
    from moe_cdk.training.checkpoints.format import _resolved

    class Planner:
        def __init__(self, keeps_state: bool) -> None:
            self.keeps_state, self._intermediate_read_item_and_target, self.committed = keeps_state, None, []

        def resolve_tensor(self, req):
            if self.keeps_state:
                self._intermediate_read_item_and_target = (req, None)
            return torch.zeros(1)

        def commit_tensor(self, req, tensor):
            self._intermediate_read_item_and_target = None
            self.committed.append(req)

    out = {}
    for keeps_state in (True, False):
        planner, lock = Planner(keeps_state), threading.Lock()
        with _resolved(planner, lock, "req") as target:
            held_in_block = lock.locked()
            target += 1
        out["stateful" if keeps_state else "stateless"] = {
            "held_in_block": held_in_block,
            "committed": planner.committed == ["req"],
            "released": not lock.locked(),
        }
    return out


def forks_during(save) -> int:
    real, count = os.fork, [0]

    def counting_fork():
        count[0] += 1
        return real()

    os.fork = counting_fork
    try:
        save()
    finally:
        os.fork = real
    return count[0]


def main(root: Path) -> dict:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies.torch import (
        TorchDistLoadShardedStrategy,
        TorchDistSaveShardedStrategy,
    )
    from torch.utils.serialization import config as serialization_config

    from moe_cdk.training.checkpoints import format as checkpoint_format
    from moe_cdk.training.checkpoints.format import SequentialFileSystemReader, load_strategy, save_strategy
    from moe_cdk.training.step import cpu_compat

    cpu_compat.activate()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    torch.manual_seed(0)
    saved = {name: make() for name, make in SAVED.items()}
    ours, stock = root / "ours", root / "stock"
    forks = {}
    for name, folder, strategy in (
        ("ours", ours, save_strategy()),
        ("stock", stock, TorchDistSaveShardedStrategy("torch_dist", 1)),
    ):
        folder.mkdir(parents=True)
        forks[name] = forks_during(
            lambda folder=folder, strategy=strategy: dist_checkpointing.save(
                sharded(saved), str(folder), sharded_strategy=strategy
            )
        )

    paths, counting = {"in_place": 0, "copied": 0}, threading.Lock()  # the reader's threads count
    read_in_place, read_archive = (
        SequentialFileSystemReader._read_in_place,
        SequentialFileSystemReader._read_archive,
    )

    def counting_in_place(*args):
        done = read_in_place(*args)
        with counting:
            paths["in_place"] += done
        return done

    def counting_copy(*args):
        with counting:
            paths["copied"] += 1
        return read_archive(*args)

    SequentialFileSystemReader._read_in_place = staticmethod(counting_in_place)
    SequentialFileSystemReader._read_archive = staticmethod(counting_copy)

    def load(strategy, *, non_contiguous: bool = False) -> dict[str, torch.Tensor]:
        targets = targets_like(saved, non_contiguous=non_contiguous)
        dist_checkpointing.load(sharded(targets), str(ours), sharded_strategy=strategy)
        return targets

    want = expected(saved)

    def compare(loaded, reference) -> dict:
        return {
            name: {
                "equals_reference": torch.equal(loaded[name], reference[name])
                and loaded[name].dtype == reference[name].dtype,
                "equals_saved": torch.equal(loaded[name], want[name]),
            }
            for name in TARGETS
        }

    reference = load(TorchDistLoadShardedStrategy())
    result = {"cases": compare(load(load_strategy()), reference), "paths": dict(paths)}
    paths.update(in_place=0, copied=0)
    result["non_contiguous_target"] = compare(load(load_strategy(), non_contiguous=True), reference)[
        NON_CONTIGUOUS_TARGET
    ]
    result["non_contiguous_paths"] = dict(paths)

    true_start = checkpoint_format._data_start
    checkpoint_format._data_start = lambda head: None if true_start(head) is None else true_start(head) + 64
    paths.update(in_place=0, copied=0)
    result["wrong_offset"] = compare(load(load_strategy()), reference)
    result["wrong_offset_paths"] = dict(paths)
    checkpoint_format._data_start = true_start

    result["checksums"] = {"ours": checksums(ours), "stock": checksums(stock)}
    result["crc_setting_after_save"] = serialization_config.save.compute_crc32
    result["forks_during_save"] = forks
    result["records_match"] = records_match(ours)
    result["planner_lock"] = planner_lock_use()

    from moe_cdk.training.checkpoints.checksums import verify_file
    from moe_cdk.training.checkpoints.manager import _checksum_mismatch_in

    flipped = root / "flipped"
    shutil.copytree(ours, flipped)
    victim = max(flipped.glob("*.distcp"), key=lambda f: f.stat().st_size)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    victim.write_bytes(raw)
    try:
        dist_checkpointing.load(
            sharded(targets_like(saved, non_contiguous=False)), str(flipped), sharded_strategy=load_strategy()
        )
        result["flipped_load"] = "loaded"
    except BaseException as error:  # torch's CheckpointException is a BaseException
        result["flipped_load"] = str(_checksum_mismatch_in(error))
    result["flipped_file"] = victim.name
    result["flipped_byte"] = len(raw) // 2
    result["verify_flipped"] = verify_file(victim)
    result["verify_ours"] = [verify_file(f) for f in sorted(ours.glob("*.distcp"))]

    unrecorded = root / "unrecorded"
    shutil.copytree(ours, unrecorded)
    for record in unrecorded.glob("*.crc32c"):
        record.unlink()
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("moe_cdk.training.checkpoints.format").addHandler(handler)
    targets = targets_like(saved, non_contiguous=False)
    dist_checkpointing.load(sharded(targets), str(unrecorded), sharded_strategy=load_strategy())
    result["unrecorded_equals_saved"] = all(torch.equal(targets[name], want[name]) for name in TARGETS)
    result["unrecorded_warnings"] = warnings
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
