"""The trainer's checkpoint strategies (training/checkpoint_format.py) against megatron's and
torch's own, in one process (a script, not a test file).

Run as ``python tests/checkpoint_format_probe.py DIR``. It saves a set of tensors with
``save_strategy()``, loads them back with ``load_strategy()`` and with megatron's stock
``TorchDistLoadShardedStrategy`` (torch's FileSystemReader: the reference), into whole and
resharded targets, and prints JSON: which cases load equal to the reference and to the saved
tensors, how each archive was read, whether the archives carry CRC-32s, and the same with the
in-place read forced onto the wrong offset.
"""

from __future__ import annotations

import io
import json
import sys
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


def main(root: Path) -> dict:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies.torch import (
        TorchDistLoadShardedStrategy,
        TorchDistSaveShardedStrategy,
    )
    from torch.utils.serialization import config as serialization_config

    from moe_cdk.training import checkpoint_format, cpu_compat
    from moe_cdk.training.checkpoint_format import SequentialFileSystemReader, load_strategy, save_strategy

    cpu_compat.activate()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    torch.manual_seed(0)
    saved = {name: make() for name, make in SAVED.items()}
    ours, stock = root / "ours", root / "stock"
    for folder, strategy in ((ours, save_strategy()), (stock, TorchDistSaveShardedStrategy("torch_dist", 1))):
        folder.mkdir(parents=True)
        dist_checkpointing.save(sharded(saved), str(folder), sharded_strategy=strategy)

    paths = {"in_place": 0, "copied": 0}
    read_in_place, read_and_copy = (
        SequentialFileSystemReader._read_in_place,
        SequentialFileSystemReader._read_and_copy,
    )

    def counting_in_place(*args):
        done = read_in_place(*args)
        paths["in_place"] += done
        return done

    def counting_copy(*args):
        paths["copied"] += 1
        return read_and_copy(*args)

    SequentialFileSystemReader._read_in_place = staticmethod(counting_in_place)
    SequentialFileSystemReader._read_and_copy = staticmethod(counting_copy)

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
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
