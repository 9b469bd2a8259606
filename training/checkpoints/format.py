"""How the trainer's checkpoints are written and read: megatron-core's torch_dist format through
megatron's own strategies, with the changes below (docs/benchmarks.md). None of them alters a
byte that is read back, and a checkpoint they write loads with megatron's stock strategies.

**Write with threads, and record a CRC32C of every file and every stored item.** megatron's
writer forks 1-N processes per save (``write_preloaded_data_multiproc``). A fork copies the
page tables of the whole rank, and afterwards every page the rank writes (the next load's
targets, on CPU the optimizer's next step) takes a copy-on-write fault first. Profiled on
512 MiB on tmpfs here: each fork took about 33 ms (0.13 s of a 0.35 s save), and a load right
after a save took 0.25-0.33 s where the same load with no save before it took 0.09-0.11 s.
:func:`write_buckets` writes the same files, through torch's ``_write_item`` as megatron does,
from ``WRITERS_PER_RANK`` threads: the writes are system calls that release the GIL, and so is
the checksum (the ``crc32c`` package, SSE4.2 or ARMv8 CRC instructions, 15 GB/s here). Each
data file ``F`` gets ``F.crc32c``, a JSON record of the file's size and of the offset, length
and CRC32C of each stored item; the items tile the file, so every byte is covered.

**Save without zip checksums.** Each stored tensor is one ``torch.save`` archive, and
``torch.save`` computes a zip CRC-32 of every tensor's bytes by default. Nothing checks it:
``torch.load`` reads a corrupted record without complaint (tried with torch 2.13), and torch's
checkpoint reader reads records through ``torch.load``. On 512 MiB it cost 0.14-0.23 s, as
long as the write itself. The writers turn it off
(``torch.utils.serialization.config.save.compute_crc32``); the CRC32Cs above replace it.

**Read each file once, front to back, and check what was read.** torch's FileSystemReader
(torch/distributed/checkpoint/filesystem.py, ``read_data``) loads each stored tensor with
``torch.load`` from a view of the file: first the zip directory at the archive's end, then its
header at the start, then the data into a newly allocated tensor, which is then copied into
the target. On a cold file that is two small random reads per tensor, which defeat the
kernel's read-ahead, and an allocation whose pages fault in as they fill. Measured on 512 MiB
here, the load ran at half the speed of a plain read, and the header reads alone took 0.23 s
of a 0.65 s load. :class:`SequentialFileSystemReader` reads each file's archives in file order
and each archive front to back. Where one request wants a whole stored tensor in a contiguous
CPU target, it reads the archive's first 4 KiB, finds the start of the tensor's bytes from the
zip entry there, reads the bytes straight into the target, then reads the rest of the archive
and has ``torch.load(map_location="meta")`` confirm, from the archive's own zip directory, the
dtype, shape, strides and place it assumed; on any difference it reads the archive the general
way. That way (slices for another layout, GPU targets) reads the whole archive into a buffer
reused from archive to archive, and copies the requested slice out, narrowed as torch narrows
it. Up to ``READERS_PER_RANK`` files are read at once, one thread each. The layout
confirmation is remembered by the archive bytes around the tensor's own (``_layout_around``).
Objects (BYTE_IO items) are read whole. Every item read is checked against its recorded
CRC32C, and a difference raises :class:`ChecksumMismatch` naming the file and the byte; files
without a record (written before moe-cdk recorded checksums) are read unchecked, with a
warning. Files written with storage transforms (compression) take torch's own path. The
stored bytes are used in the machine's byte order: checkpoints written and read on the
little-endian machines AWS offers (x86-64, Graviton) need no swapping.

**Only where torch and megatron-core are as expected.** The writer and the reader use internals of
both (``_save_checks`` and ``_load_checks`` list them), checked at import (training/compat.py). Where
one is missing or changed, that side is megatron-core's stock strategy, with one warning; the other
side keeps its own, since each reads what the other writes.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import struct
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import crc32c
import torch
from megatron.core.dist_checkpointing.strategies import torch as mcore_torch
from megatron.core.dist_checkpointing.strategies.torch import (
    TorchDistLoadShardedStrategy,
    TorchDistSaveShardedStrategy,
)
from torch.distributed.checkpoint import FileSystemReader, filesystem as dcp_filesystem
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

from moe_cdk.training import compat
from moe_cdk.training.checkpoints.checksums import CHECKSUM_SUFFIX, ItemCheck, read_checksums, read_into

log = logging.getLogger(__name__)

WRITERS_PER_RANK = 4
READERS_PER_RANK = 4


# ---- the internals these strategies use, checked at import (training/compat.py) ------------------


_DCP = "torch.distributed.checkpoint.filesystem"
_MCORE = "megatron.core.dist_checkpointing.strategies"
# megatron's multi-process writer, which write_buckets stands in for.
_STOCK_WRITER = f"{_MCORE}.filesystem_async.FileSystemWriterAsync.write_preloaded_data_multiproc"


def _save_checks() -> dict[str, compat.Check]:
    lookup, parameters = compat.lookup, compat.parameters
    return {
        f"{_DCP}._write_item(transforms, stream, data, write_item, storage_key)": lambda: (
            parameters(lookup(f"{_DCP}._write_item"))[:5]
            == ["transforms", "stream", "data", "write_item", "storage_key"]
        ),
        f"{_DCP}._StorageWriterTransforms()": lambda: lookup(f"{_DCP}._StorageWriterTransforms")() is not None,
        "torch.utils.serialization.config.save.compute_crc32": lambda: isinstance(
            lookup("torch.utils.serialization.config.save.compute_crc32"), bool
        ),
        f"{_STOCK_WRITER}(..., rank, write_buckets, global_results_queue)": lambda: (
            parameters(lookup(_STOCK_WRITER))[-3:] == ["rank", "write_buckets", "global_results_queue"]
        ),
        f"{_MCORE}.async_utils.AsyncRequest.async_fn": lambda: (
            "async_fn" in lookup(f"{_MCORE}.async_utils.AsyncRequest")._fields
        ),
    }


def _load_checks() -> dict[str, compat.Check]:
    lookup, parameters = compat.lookup, compat.parameters
    return {
        f"{_MCORE}.torch._get_filesystem_reader(checkpoint_dir, cache_metadata)": lambda: (
            parameters(lookup(f"{_MCORE}.torch._get_filesystem_reader")) == ["checkpoint_dir", "cache_metadata"]
        ),
        f"{_MCORE}.torch.MultiStorageClientFeature.is_enabled": lambda: callable(
            lookup(f"{_MCORE}.torch.MultiStorageClientFeature.is_enabled")
        ),
        _CACHED_READER: lambda: issubclass(lookup(_CACHED_READER), FileSystemReader),
        f"{_MCORE}.torch.MCoreLoadPlanner._intermediate_read_item_and_target": lambda: compat.uses_attribute(
            lookup(f"{_MCORE}.torch.MCoreLoadPlanner.resolve_tensor"), "_intermediate_read_item_and_target"
        ),
        "torch.distributed.checkpoint.FileSystemReader.storage_data": lambda: compat.uses_attribute(
            FileSystemReader.set_up_storage_reader, "storage_data"
        ),
        f"{_DCP}._StorageInfo(relative_path, offset, length, transform_descriptors)": lambda: (
            {"relative_path", "offset", "length", "transform_descriptors"}
            <= set(lookup(f"{_DCP}._StorageInfo").__dataclass_fields__)
        ),
        "torch.distributed._shard._utils.narrow_tensor_by_index": lambda: callable(
            lookup("torch.distributed._shard._utils.narrow_tensor_by_index")
        ),
    }


_CACHED_READER = f"{_MCORE}.cached_metadata_filesystem_reader.CachedMetadataFileSystemReader"


SAVE_FEATURE = "moe-cdk's checkpoint writer (threads, CRC32C records)"
LOAD_FEATURE = "moe-cdk's checkpoint reader (sequential, checked reads)"
SAVE_PROBLEMS = compat.problems(_save_checks())
LOAD_PROBLEMS = compat.problems(_load_checks())
# Subclassed below; torch's own reader stands in where megatron's is gone (LOAD_PROBLEMS says so,
# and loads then take megatron's stock strategy).
_ReaderBase = FileSystemReader if LOAD_PROBLEMS else compat.lookup(_CACHED_READER)


def save_strategy():
    """megatron's torch_dist format, saved fully in parallel: each shard that several
    data-parallel ranks hold is written by one of them, spread evenly, instead of every shard
    by its first replica (megatron's FullyParallelSaveStrategyWrapper).

    Nothing is cached between saves (``cached_metadata``, ``do_cache_distribution``): megatron
    reuses a cached plan only for checkpoints of a constant structure, and ours changes after
    step 0 (the optimizer state joins); with the cache, step 3 was written with step 0's plan,
    silently without its optimizer state.

    Each rank writes 4 files, from 4 threads (:func:`write_buckets`): on the bench machine's 2
    cores a save of 512 MiB to tmpfs took 0.47 s from 1 thread and 0.21-0.23 s from 2 or 4, the
    time of a plain write, and a Lustre file system, striped over many servers, rewards
    parallel streams from one client the same way."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    if SAVE_PROBLEMS:
        compat.warn_fallback(SAVE_FEATURE, SAVE_PROBLEMS, "megatron-core's TorchDistSaveShardedStrategy")
        inner = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=WRITERS_PER_RANK)
    else:
        inner = ChecksummedSaveStrategy("torch_dist", 1, thread_count=WRITERS_PER_RANK)
    return FullyParallelSaveStrategyWrapper(inner, parallel_state.get_data_parallel_group(with_context_parallel=True))


def load_strategy():
    """The load counterpart: each replicated shard is read by one data-parallel rank and
    broadcast to the others (FullyParallelLoadStrategyWrapper), so the ranks share the reads."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    if LOAD_PROBLEMS:
        compat.warn_fallback(LOAD_FEATURE, LOAD_PROBLEMS, "megatron-core's TorchDistLoadShardedStrategy")
        inner = TorchDistLoadShardedStrategy()
    else:
        inner = SequentialLoadShardedStrategy()
    return FullyParallelLoadStrategyWrapper(inner, parallel_state.get_data_parallel_group(with_context_parallel=True))


class ChecksummedSaveStrategy(TorchDistSaveShardedStrategy):
    """megatron's torch_dist save, its files written by :func:`write_buckets`.

    megatron's save (synchronous or not) is the request that ``async_save`` returns; its write
    function runs here or, for an async save, in a process megatron forks, so only the function
    is replaced: the plan, the metadata and the finalization stay megatron's."""

    def async_save(self, sharded_state_dict, checkpoint_dir):
        request = super().async_save(sharded_state_dict, checkpoint_dir)
        if request.async_fn is None:
            return request
        # Only megatron's own multi-process writer is replaced, with the arguments it takes.
        if getattr(request.async_fn, "func", None) is not compat.lookup(_STOCK_WRITER):
            compat.warn_fallback(
                SAVE_FEATURE,
                [f"megatron's save request runs {request.async_fn!r}, not write_preloaded_data_multiproc"],
                "megatron-core's writer",
            )
            return request
        return request._replace(async_fn=write_buckets)


@functools.cache
def _write_item_args() -> dict:
    """torch 2.6 added ``serialization_format``; megatron passes it where it exists, and so do we."""
    if "serialization_format" in compat.parameters(dcp_filesystem._write_item):
        return {"serialization_format": dcp_filesystem.SerializationFormat.TORCH_SAVE}
    return {}


def write_buckets(rank: int, buckets: list, results_queue) -> None:
    """Write one rank's files, one thread a file, without zip CRC-32s and with a CRC32C record
    of each; in place of megatron's ``write_preloaded_data_multiproc``, with its arguments.

    The results go to ``results_queue`` as megatron's finalization expects them: the write
    results of each file by its index, or the exception that stopped a write."""
    try:
        with _without_zip_crc(), ThreadPoolExecutor(len(buckets), thread_name_prefix=f"ckpt-writer-{rank}") as pool:
            written = list(pool.map(_write_file, buckets))
        results_queue.put(dict(enumerate(written)))
    except Exception as error:  # megatron's finalization raises it on this rank
        global _write_error
        _write_error = error if isinstance(error, OSError) else None
        results_queue.put(error)


_write_error: OSError | None = None


def take_write_error() -> OSError | None:
    """The file-system error that stopped this rank's last write, once. megatron's finalization
    gathers the ranks' results by pickling, which loses an exception's cause, and raises it on
    the coordinating rank alone, as a RuntimeError naming only the text."""
    global _write_error
    found, _write_error = _write_error, None
    return found


@contextmanager
def _without_zip_crc():
    """torch.save without its CRC-32s. In torch 2.13 the setting is per thread (a ContextVar,
    torch/utils/_config_module.py), so each writer thread makes it; so does the thread that
    starts them, for a torch whose setting is process-wide."""
    from torch.utils.serialization import config as serialization_config

    previous = serialization_config.save.compute_crc32
    serialization_config.save.compute_crc32 = False
    try:
        yield
    finally:
        serialization_config.save.compute_crc32 = previous


class _ChecksummedFile:
    """A file open for writing that keeps the CRC32C of each stored item written to it."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self.items: list[list[int]] = []
        self._item_start = 0
        self._item_crc = 0
        self.error: OSError | None = None
        """The first write that failed: torch's zip writer, which calls ``write``, reports only a
        RuntimeError ("unexpected pos") and loses the errno (no space, a quota, a size limit)."""

    def write(self, data) -> int:
        self._item_crc = crc32c.crc32c(data, self._item_crc)
        try:
            return self._raw.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def begin_item(self) -> None:
        self._item_start, self._item_crc = self._raw.tell(), 0

    def end_item(self) -> None:
        self.items.append([self._item_start, self._raw.tell() - self._item_start, self._item_crc])


def _write_file(bucket) -> list:
    path, storage_key, (bytes_data, tensor_data) = bucket
    transforms = dcp_filesystem._StorageWriterTransforms()
    write_item_args = _write_item_args()
    results = []
    with _without_zip_crc(), open(path, "wb") as raw:
        out = _ChecksummedFile(raw)
        for item, data in [*bytes_data, *tensor_data]:
            out.begin_item()
            try:
                results.append(dcp_filesystem._write_item(transforms, out, data, item, storage_key, **write_item_args))
            except RuntimeError:
                if out.error is not None:
                    raise out.error from None
                raise
            out.end_item()
        raw.flush()
        os.fsync(raw.fileno())
        record = {"bytes": raw.tell(), "items": out.items}
    _write_durably(Path(path + CHECKSUM_SUFFIX), json.dumps(record).encode())
    return results


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


class _PartialFile(io.RawIOBase):
    """A read-only file of ``length`` bytes of which only some parts are at hand, without
    copying them (``io.BytesIO`` would). Bytes outside those parts read as zeros: reading an
    archive's layout (``torch.load`` with ``map_location="meta"``) never needs the tensor data."""

    def __init__(self, length: int, parts: dict[int, memoryview]) -> None:
        super().__init__()
        self._length = length
        self._parts = parts
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._length}[whence]
        self._position = min(max(base + offset, 0), self._length)
        return self._position

    def readinto(self, target) -> int:
        out = memoryview(target).cast("B")
        count = min(len(out), self._length - self._position)
        start, end = self._position, self._position + count
        out[:count] = bytes(count)
        for at, part in self._parts.items():
            lo, hi = max(start, at), min(end, at + len(part))
            if lo < hi:
                out[lo - start : hi - start] = part[lo - at : hi - at]
        self._position = end
        return count


def _layout(length: int, parts: dict[int, memoryview]) -> tuple[torch.Tensor, int]:
    """The tensor one ``torch.save`` archive holds, as a meta tensor (dtype, shape, strides), and the
    archive offset of its bytes, read from the given parts of the archive."""
    archive = _PartialFile(length, parts)
    meta = torch.load(archive, map_location="meta", weights_only=True)
    return meta, _data_offset(archive)


def _data_offset(archive) -> int:
    """Where the bytes of the archive's one storage (its ``data/0`` entry) start: after that entry's
    local header, found through the zip's own directory. torch 2.13's meta load also notes the place
    (``untyped_storage()._checkpoint_offset``); torch 2.9's, the image's, leaves it None."""
    with zipfile.ZipFile(archive) as listing:
        (entry,) = [info for info in listing.infolist() if info.filename.endswith("/data/0")]
    archive.seek(entry.header_offset)
    *_, name_length, extra_length = _LOCAL_HEADER.unpack(archive.read(_LOCAL_HEADER.size))
    return entry.header_offset + _LOCAL_HEADER.size + name_length + extra_length


_LAYOUTS: dict[tuple, tuple[torch.Tensor, int]] = {}
_LAYOUTS_KEPT = 1024


def _layout_around(length: int, start: int, before: memoryview, end: int, after: memoryview):
    """:func:`_layout` of an archive known but for its tensor's bytes, remembered by the bytes
    around them: the archives of tensors of one dtype and shape (a model's experts, its layers)
    differ only there, so parsing one of them answers for all."""
    key = (length, start, end, bytes(before), bytes(after))
    found = _LAYOUTS.get(key)
    if found is None:
        found = _layout(length, {0: before, end: after})
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            _LAYOUTS.clear()
        _LAYOUTS[key] = found
    return found


# The start of an archive: the zip entries for the pickle and three small records, then the
# local header of the tensor's bytes ("<archive>/data/0"), 64-byte aligned; a few hundred bytes.
_HEAD_BYTES = 4096
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # PKWARE APPNOTE 4.3.7, 30 bytes
_LOCAL_HEADER_SIGNATURE = b"PK\x03\x04"


def _data_start(head: memoryview) -> int | None:
    """Where the tensor's bytes start, from the local zip header of the archive's ``data/0``
    entry within ``head``; None when it is not there. Only a guess until :func:`_layout`
    confirms it: a pickle could hold the signature bytes."""
    raw = bytes(head)
    at = raw.find(_LOCAL_HEADER_SIGNATURE)
    while at != -1 and at + _LOCAL_HEADER.size <= len(raw):
        *_, name_length, extra_length = _LOCAL_HEADER.unpack_from(raw, at)
        name = raw[at + _LOCAL_HEADER.size : at + _LOCAL_HEADER.size + name_length]
        if name.endswith(b"/data/0"):
            return at + _LOCAL_HEADER.size + name_length + extra_length
        at = raw.find(_LOCAL_HEADER_SIGNATURE, at + 1)
    return None


class SequentialFileSystemReader(_ReaderBase):
    """megatron's metadata-caching reader, reading each file once, in order, and checking what it read.

    Files are read by threads, but the planner is called by one thread at a time: megatron's
    planner keeps a request's state from ``resolve_tensor`` to ``commit_tensor`` when the target
    is an FP8 tensor (MCoreLoadPlanner), so such a request holds the planner until its commit."""

    def read_data(self, plan, planner) -> Future[None]:
        stock, files = [], {}
        for req in plan.items:
            item = self.storage_data[req.storage_index]
            if item.transform_descriptors:
                stock.append(req)
            else:
                files.setdefault(item.relative_path, {}).setdefault((item.offset, item.length), []).append(req)
        planner_lock = threading.Lock()
        with ThreadPoolExecutor(min(READERS_PER_RANK, len(files)) or 1, thread_name_prefix="ckpt-reader") as pool:
            recorded = list(
                pool.map(lambda entry: self._read_file(*entry, planner, planner_lock), sorted(files.items()))
            )
        unchecked = [name for name, has_record in zip(sorted(files), recorded) if not has_record]
        if unchecked:
            log.warning(
                "%s: %d file(s) read without a checksum record (saved before moe-cdk wrote them, or by megatron's "
                "writer): %s",
                self.path,
                len(unchecked),
                ", ".join(unchecked),
            )
        if stock:
            return super().read_data(replace(plan, items=stock), planner)
        done: Future = Future()
        done.set_result(None)
        return done

    def _read_file(self, relative_path: str, archives: dict, planner, planner_lock) -> bool:
        """Read the requested archives of one file, in file order; False when it has no checksum record."""
        path = Path(self.fs.concat_path(self.path, relative_path))
        check = ItemCheck(relative_path, read_checksums(path))
        buffer = bytearray()

        def whole(fd: int, offset: int, length: int) -> torch.Tensor:
            nonlocal buffer
            if len(buffer) < length:
                buffer = bytearray(length)
            return self._read_archive(fd, offset, memoryview(buffer)[:length], check)

        with open(path, "rb", buffering=0) as file:
            fd = file.fileno()
            for (offset, length), reqs in sorted(archives.items()):
                if reqs[0].type == LoadItemType.BYTE_IO:
                    data = bytearray(length)
                    check(offset, length, read_into(fd, memoryview(data), offset))
                    with planner_lock:
                        for req in reqs:
                            planner.load_bytes(req, io.BytesIO(data))
                elif len(reqs) == 1:
                    with _resolved(planner, planner_lock, reqs[0]) as target:
                        if not self._read_in_place(fd, offset, length, reqs[0], target, check):
                            _copy_slice(whole(fd, offset, length), reqs[0], target)
                else:
                    stored = whole(fd, offset, length)
                    for req in reqs:
                        with _resolved(planner, planner_lock, req) as target:
                            _copy_slice(stored, req, target)
        return check.recorded

    @staticmethod
    def _read_in_place(fd: int, offset: int, length: int, req, target: torch.Tensor, check: ItemCheck) -> bool:
        """Read one archive's tensor straight into ``target`` where the request wants the whole of
        it in a contiguous CPU tensor; True if done, False to read it another way."""
        if (
            target.device.type != "cpu"
            or not target.is_contiguous()
            or any(req.storage_offsets)
            or list(req.lengths) != list(target.shape)
        ):
            return False
        head = memoryview(bytearray(min(_HEAD_BYTES, length)))
        read_into(fd, head, offset)
        start = _data_start(head)
        end = None if start is None else start + target.nbytes
        if end is None or end > length:
            return False
        into = memoryview(target.view(-1).view(torch.uint8).numpy())
        within_head = max(0, min(len(head), end) - start)
        into[:within_head] = head[start : start + within_head]
        crc = crc32c.crc32c(head[: start + within_head])
        crc = read_into(fd, into[within_head:], offset + start + within_head, crc)
        tail = memoryview(bytearray(length - end))
        crc = read_into(fd, tail, offset + end, crc)
        try:
            stored, data_offset = _layout_around(length, start, head[:start], end, tail)
        except Exception:  # not the layout torch.save writes: read it another way
            return False
        if (
            data_offset != start
            or stored.dtype != target.dtype
            or stored.shape != target.shape
            or not stored.is_contiguous()
            or stored.storage_offset() != 0
            or stored.untyped_storage().nbytes() != target.nbytes
        ):
            return False
        check(offset, length, crc)
        return True

    @staticmethod
    def _read_archive(fd: int, offset: int, archive: memoryview, check: ItemCheck) -> torch.Tensor:
        """Read one archive whole into ``archive``; its tensor, viewing those bytes."""
        check(offset, len(archive), read_into(fd, archive, offset))
        stored, start = _layout(len(archive), {0: archive})
        flat = torch.frombuffer(
            archive, dtype=stored.dtype, count=stored.untyped_storage().nbytes() // stored.element_size(), offset=start
        )
        return flat.as_strided(stored.shape, stored.stride(), stored.storage_offset())


def _copy_slice(stored: torch.Tensor, req, target: torch.Tensor) -> None:
    from torch.distributed._shard._utils import narrow_tensor_by_index

    source = narrow_tensor_by_index(stored, req.storage_offsets, req.lengths)
    if target.size() != source.size():
        raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {source.size()}")
    target.copy_(source)


@contextmanager
def _resolved(planner, planner_lock, req):
    """The target of one read request, committed to the planner when the block ends well. The
    planner is called under ``planner_lock``, held throughout when the planner keeps the
    request's state between the two calls."""
    planner_lock.acquire()
    held = True
    try:
        target = planner.resolve_tensor(req).detach()
        if getattr(planner, "_intermediate_read_item_and_target", None) is None:
            planner_lock.release()
            held = False
        yield target
        if not held:
            planner_lock.acquire()
            held = True
        planner.commit_tensor(req, target)
    finally:
        if held:
            planner_lock.release()


class SequentialLoadShardedStrategy(TorchDistLoadShardedStrategy):
    """megatron's torch_dist load with :class:`SequentialFileSystemReader`.

    megatron builds its reader inside ``load`` (``_get_filesystem_reader`` in
    megatron/core/dist_checkpointing/strategies/torch.py), so the reader is swapped there for
    the length of one load; everything else is megatron's."""

    def load(self, sharded_state_dict, checkpoint_dir):
        with _reader(SequentialFileSystemReader):
            return super().load(sharded_state_dict, checkpoint_dir)


@contextmanager
def _reader(reader_class):
    stock = mcore_torch._get_filesystem_reader

    def build(checkpoint_dir, cache_metadata: bool = False):
        if cache_metadata and not mcore_torch.MultiStorageClientFeature.is_enabled():
            return reader_class(checkpoint_dir)
        return stock(checkpoint_dir, cache_metadata)

    mcore_torch._get_filesystem_reader = build
    try:
        yield
    finally:
        mcore_torch._get_filesystem_reader = stock
