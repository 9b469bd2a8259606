"""Step-N checkpoints with megatron-core dist_checkpointing, a completion marker, and resume.

Layout: ``<dir>/step-<N>/`` holds one torch_dist checkpoint. It counts only once
``<dir>/step-<N>/moe-cdk-complete.json`` exists; rank 0 writes that marker last, after
every rank has finished writing, and records each file's size in it, and the CRC32C of each
file that has no checksum record of its own (the data files have one each, written with them:
training/checkpoints/format.py). On start the newest checkpoint whose marker exists and whose
files all have their recorded sizes and checksums is loaded, and every item read from the
data files is checked as it is read. Newer ones that fail a check are skipped with a warning
naming the file; if every checkpoint that was completed fails, the run stops with a permanent
error rather than train from scratch. The newest ``keep_last`` complete checkpoints are kept.

Saved: the model and megatron's optimizer state (sharded like the model, so both reshard
to any TP/EP/PP/DP layout on load), the learning-rate scheduler, the data position, the step,
the layout, and every rank's RNG states. RNG states belong to a rank of one layout: they are
restored when the layout is unchanged and re-derived from the seed and the step otherwise.
A step-0 checkpoint (the initial weights) holds no optimizer state.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from moe_cdk.core.problems import ConfigError, Problem
from moe_cdk.training.checkpoints.checksums import CHECKSUM_SUFFIX, ChecksumMismatch, crc32c_of_file, verify_file
from moe_cdk.training.exit_codes import PERMANENT_ERRNOS, SaveFailed
from moe_cdk.training.step import cpu_compat

log = logging.getLogger(__name__)

MARKER = "moe-cdk-complete.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _rng_state() -> dict:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _rederive_rng_state(seed: int, step: int) -> None:
    """RNG states for a rank of a new layout: deterministic in the seed and the step."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    random.seed(seed + step)
    np.random.seed((seed + step) % 2**32)
    torch.manual_seed(seed + step)
    model_parallel_cuda_manual_seed(seed + step)


# The optimizer state in a form that reshards: the distributed optimizer's parameter-space
# format, and no per-sub-optimizer key prefix, so each parameter's state is found by its name.
# The optimizer has the same structure under every layout (a dense and an expert optimizer:
# model._mark_expert_parameters), so its common state loads under any expert-parallel size.
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_sharded_model_space", "chained_optim_avoid_prefix": True}


def _layout_key(layout) -> dict:
    """What must match for saved per-rank RNG states to mean the same ranks."""
    return {
        "world_size": layout.world_size,
        "tensor": layout.tensor,
        "pipeline": layout.pipeline,
        "virtual_pipeline": layout.virtual_pipeline,
        "expert": layout.expert,
        "expert_tensor": layout.expert_tensor,
    }


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step-N`` folder under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def _marker_entry(file: Path) -> dict:
    """A file's size, and its CRC32C unless it has a checksum record of its own or is one."""
    size = file.stat().st_size
    if file.name.endswith(CHECKSUM_SUFFIX) or Path(str(file) + CHECKSUM_SUFFIX).is_file():
        return {"bytes": size}
    return {"bytes": size, "crc32c": crc32c_of_file(file, size)}


def verify_step(path: Path) -> list[str]:
    """Every problem of one step-N folder, read in full: its marker, sizes and small files'
    checksums, then each data file's size and each stored item's CRC32C. Empty when intact."""
    reason = CheckpointManager.problem_with(path)
    if reason is not None:
        return [reason]
    return [found for data_file in sorted(path.glob("*.distcp")) if (found := verify_file(data_file))]


@dataclass(frozen=True)
class Restored:
    step: int
    consumed_samples: int
    path: Path


_writer_manager = None


def _prepare_results_queue(*, async_save: bool) -> None:
    """Give megatron's save the queue its writer reports to (``filesystem_async._results_queue``), once.

    A synchronous save writes in this process (:func:`format.write_buckets`; megatron's own writer, where it
    falls back to it, collects its children's results and puts them here itself), so a plain in-process queue
    serves it. Left to itself, dist_checkpointing starts a multiprocessing manager (``spawn``) on first use
    for that queue: a second interpreter per rank, which cost each tiny CPU run 1.8 s of its 5.2 s of CPU and
    its first save 1.2 s of waiting (the test suite starts a few hundred such ranks). An async
    save writes in a process megatron forks, which needs the manager: :func:`_start_writer_manager`."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if async_save:
        _start_writer_manager()
    elif filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


def _start_writer_manager() -> None:
    """Start megatron's checkpoint-writer manager process ourselves, once, before any signal
    can arrive, immune to the ones the trainer handles, and bound to die with this rank. Left
    to itself:

    - under Slurm a USR1 or TERM reaches every process of the job step, so a manager started
      with default handlers dies from the very signal that asks for a checkpoint, and that
      save fails with BrokenPipeError. So the manager ignores them (``stop.helper_process_init``),
      and the signals stay blocked while it starts, before its initializer runs (a spawned
      process inherits the signal mask).
    - Starting a spawned process first starts multiprocessing's resource tracker, and CPython's
      ``resource_tracker.ensure_running`` unblocks SIGINT and SIGTERM on its way out
      (Lib/multiprocessing/resource_tracker.py, 3.11 and 3.12), which undid the block above:
      the manager was seen with TERM unblocked and died of a process-group TERM. The tracker
      is started first, under the block (it ignores INT and TERM itself, and keeps USR1
      blocked), and the block is made again after it.
    - a rank killed by SIGKILL (the OOM killer, a test) left the manager orphaned, about
      300 MB resident, for good. Its initializer also asks Linux to kill it with its parent.
    """
    global _writer_manager
    import multiprocessing
    from multiprocessing import resource_tracker
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from moe_cdk.training.stop import HANDLED_SIGNALS, helper_process_init

    if _writer_manager is not None:
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
    try:
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
        manager.start(initializer=helper_process_init, initargs=(os.getpid(),))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    _writer_manager = manager
    filesystem_async._results_queue = manager.Queue()


class CheckpointManager:
    """Saves, finds, loads and prunes the checkpoints of one run."""

    def __init__(self, root: str | Path, *, keep_last: int, layout, seed: int, async_save: bool = False) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.layout = layout
        self.seed = seed
        # Async save first copies every tensor to host memory, then writes in the
        # background. On CPU there is no copy: the writer would read parameters while the
        # optimizer changes them. So CPU runs save synchronously.
        self.async_save = async_save and torch.cuda.is_available()
        if async_save and not self.async_save:
            log.info("checkpoint.async_save needs CUDA; saving synchronously on CPU")
        self.rank = dist.get_rank()
        self._async_queue = None
        self._pending: tuple[int, Path] | None = None
        from moe_cdk.training.checkpoints.format import save_strategy

        self._save_strategy = save_strategy()
        _prepare_results_queue(async_save=self.async_save)

    # -- finding ------------------------------------------------------------------------

    @staticmethod
    def problem_with(path: Path) -> str | None:
        """Why ``path`` cannot be resumed from, or None when it is complete and its files have
        the sizes, and the small ones the checksums, that its marker records. The data files'
        bytes are checked as they are loaded (or by :func:`verify_step`)."""
        marker = path / MARKER
        if not marker.is_file():
            return "no completion marker (the save did not finish)"
        try:
            # Markers written before checksums hold each file's size alone.
            recorded = {
                name: (entry, None) if isinstance(entry, int) else (int(entry["bytes"]), entry.get("crc32c"))
                for name, entry in json.loads(marker.read_text())["files"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            return "unreadable completion marker"
        for name, (size, crc) in recorded.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} has {file.stat().st_size} bytes, {size} were written"
            if crc is not None and (got := crc32c_of_file(file, size)) != crc:
                return f"{name} has CRC32C {got:08x}, {crc:08x} was written"
        return None

    def _scan(self) -> tuple[list[tuple[int, Path]], list[str]]:
        """Complete, intact checkpoints, newest first, and why each newer completed one was
        rejected; the skipped newer ones are logged by name."""
        good, rejected = [], []
        for step, path in step_dirs(self.root):
            reason = self.problem_with(path)
            if reason is None:
                good.append((step, path))
            elif not good:
                log.warning("skipping checkpoint %s: %s", path, reason)
                if (path / MARKER).is_file():
                    rejected.append(f"{path.name}: {reason}")
        return good, rejected

    # -- saving -------------------------------------------------------------------------

    def _sharded_state(
        self, trainable, *, step: int, consumed_samples: int, rng: bool, is_loading: bool = False
    ) -> dict:
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        # Chunk keys are local, but every tensor is stored under its global name (layer
        # numbers include the stage offset), so any chunking of the layers can load it.
        model_state = {f"chunk{i}": chunk.module.sharded_state_dict() for i, chunk in enumerate(trainable.chunks)}
        state = {
            "model": model_state,
            "scheduler": trainable.scheduler.state_dict(),
            "step": step,
            "consumed_samples": consumed_samples,
            "layout": _layout_key(self.layout),
        }
        if step > 0:
            state["optimizer"] = trainable.optimizer.sharded_state_dict(
                model_state, is_loading=is_loading, metadata=_OPTIMIZER_METADATA
            )
        if rng:
            world, rank = dist.get_world_size(), dist.get_rank()
            state["rng"] = ShardedObject("rng_state", _rng_state(), (world,), (rank,), replica_id=0)
        return state

    def save(self, trainable, *, step: int, consumed_samples: int) -> None:
        """Write ``step-<step>``; with async_save the files are written in the background and the
        marker follows once they are done (``wait()`` finishes it)."""
        from megatron.core import dist_checkpointing

        self.wait()
        started = time.perf_counter()
        path = self.root / f"step-{step}"
        if self.rank == 0:
            if path.exists():
                shutil.rmtree(path)  # an unfinished earlier attempt at the same step
            path.mkdir(parents=True)
        dist.barrier()
        state = self._sharded_state(trainable, step=step, consumed_samples=consumed_samples, rng=True)
        if self.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            if self._async_queue is None:
                self._async_queue = AsyncCallsQueue()
            request = dist_checkpointing.save(
                state, str(path), sharded_strategy=self._save_strategy, async_sharded_save=True
            )
            self._async_queue.schedule_async_request(request)
            self._pending = (step, path)
            log.info("scheduled step-%d in %.2fs", step, time.perf_counter() - started)
            return
        try:
            dist_checkpointing.save(state, str(path), sharded_strategy=self._save_strategy)
            self._complete(step, path)
        except (Exception, CheckpointException) as error:  # CheckpointException is a BaseException
            self._raise_save_failed(error, step, path)
            raise
        log.info("saved step-%d in %.2fs", step, time.perf_counter() - started)

    def _raise_save_failed(self, error: BaseException, step: int, path: Path) -> None:
        """SaveFailed when a file-system error stopped the save of ``step``, with the same exit code on
        every rank; returns when none did. megatron raises a failed write as a CheckpointException on
        every rank together, so the ranks then agree on the code (a collective); an error raised on one
        rank alone is that rank's."""
        from moe_cdk.training.checkpoints.format import take_write_error

        cause = _cause_in(error, OSError) or take_write_error()
        permanent, failed = (cause is not None and cause.errno in PERMANENT_ERRNOS), cause is not None
        if isinstance(error, CheckpointException) and dist.get_world_size() > 1:
            device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
            flags = torch.tensor([float(permanent), float(failed)], device=device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            permanent, failed = bool(flags[0]), bool(flags[1])
        if not failed:
            return
        kept = next((p for _, p in step_dirs(self.root) if p != path and self.problem_with(p) is None), None)
        raise SaveFailed(step, path, cause, kept, permanent=permanent) from error

    def poll(self) -> None:
        """Mark a finished async save complete without waiting (call on every rank, every step)."""
        if self._pending is not None and self._async_queue.maybe_finalize_async_calls(blocking=False, no_dist=False):
            self._finish_pending(0.0)

    def wait(self) -> None:
        """Finish an async save, if one is running, and mark it complete."""
        if self._pending is None:
            return
        started = time.perf_counter()
        self._async_queue.maybe_finalize_async_calls(blocking=True, no_dist=False)
        self._finish_pending(time.perf_counter() - started)

    def _finish_pending(self, waited_s: float) -> None:
        step, path = self._pending
        self._pending = None
        self._complete(step, path)
        log.info("finished async save of step-%d after waiting %.2fs", step, waited_s)

    def _complete(self, step: int, path: Path) -> None:
        dist.barrier()
        if self.rank == 0:
            files = {str(f.relative_to(path)): _marker_entry(f) for f in sorted(path.rglob("*")) if f.is_file()}
            tmp = path / (MARKER + ".tmp")
            tmp.write_text(json.dumps({"step": step, "files": files}, indent=1))
            os.replace(tmp, path / MARKER)
            self._prune()
        dist.barrier()

    def _prune(self) -> None:
        # One listing and one check per folder: on Lustre each check stats every shard file.
        checked = [(step, path, self.problem_with(path) is None) for step, path in step_dirs(self.root)]
        complete = [(step, path) for step, path, ok in checked if ok]
        newest_complete = complete[0][0] if complete else -1
        for _, path in complete[self.keep_last :]:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s", path)
        for step, path, ok in checked:
            if step < newest_complete and not ok:
                shutil.rmtree(path, ignore_errors=True)
                log.info("removed incomplete checkpoint %s", path)

    # -- loading ------------------------------------------------------------------------

    def _candidates(self) -> tuple[list[tuple[int, Path]], list[str]]:
        """Rank 0's list of complete checkpoints, and of the completed ones it rejected, the same
        on every rank (each rank checking for itself could pick a different one while a save is
        being pruned)."""
        found = [self._scan() if self.rank == 0 else None]
        if dist.get_world_size() > 1:
            dist.broadcast_object_list(found, src=0)
        return found[0]

    def load_latest(self, trainable) -> Restored | None:
        """Restore the newest loadable checkpoint into the model, optimizer, scheduler and RNGs,
        under this run's layout whatever the layout it was saved with. A checkpoint whose bytes
        fail their checksums is skipped for the one before it; when no completed checkpoint is
        left, ConfigError (a permanent stop: training from step 0 would discard the run)."""
        from megatron.core import dist_checkpointing

        from moe_cdk.training.checkpoints.format import load_strategy

        candidates, rejected = self._candidates()
        for _, path in candidates:
            started = time.perf_counter()
            common = dist_checkpointing.load_common_state_dict(str(path))
            try:
                same_layout = common.get("layout") == _layout_key(self.layout)
                template = self._sharded_state(
                    trainable, step=int(common["step"]), consumed_samples=0, rng=same_layout, is_loading=True
                )
                if mismatched := shape_problems(template["model"], path, key="checkpoint.dir"):
                    raise ConfigError(mismatched)
                with cpu_compat.cuda_factories_on_cpu():
                    state = dist_checkpointing.load(template, str(path), sharded_strategy=load_strategy())
            except ConfigError:
                raise
            except (Exception, CheckpointException) as error:  # CheckpointException is a BaseException
                # torch's reader gathers every rank's failure and raises them on all ranks, so a
                # checksum mismatch is seen, and skipped, by every rank alike.
                mismatch = _checksum_mismatch_in(error)
                if mismatch is None and dist.get_world_size() > 1:
                    raise
                reason = str(mismatch or error)
                log.warning("skipping checkpoint %s: %s; trying the step before it", path, reason)
                rejected.append(f"{path.name}: {reason}")
                continue
            for i, chunk in enumerate(trainable.chunks):
                chunk.module.load_state_dict(state["model"][f"chunk{i}"])
            if "optimizer" in state:
                trainable.optimizer.load_state_dict(state["optimizer"])
            else:
                # A step-0 checkpoint (save_initial, moe-checkpoint import-hf) has no optimizer state.
                # Under bf16 the optimizer holds fp32 main copies of the weights made when it was
                # built, and its first step would overwrite the loaded weights with those; megatron's
                # reload_model_params copies the loaded ones in (optimizer/optimizer.py: "when we load
                # a model from a checkpoint without loading the optimizer").
                trainable.optimizer.reload_model_params()
            trainable.scheduler.load_state_dict(state["scheduler"])
            if same_layout:
                _set_rng_state(state["rng"])
            else:
                _rederive_rng_state(self.seed, int(state["step"]))
                if self.rank == 0:
                    log.warning(
                        "%s was saved under another layout (%s): per-rank RNG states re-derived from the seed and step "
                        "%d",
                        path,
                        common.get("layout"),
                        int(state["step"]),
                    )
            log.info("resumed from %s in %.2fs", path, time.perf_counter() - started)
            return Restored(step=int(state["step"]), consumed_samples=int(state["consumed_samples"]), path=path)
        if rejected:
            raise ConfigError(
                [
                    Problem(
                        "checkpoint.dir",
                        f"no intact checkpoint is left in {self.root}, so the run stops rather than start again "
                        f"from step 0: {'; '.join(rejected)}",
                        allowed="a folder whose newest completed step passes `moe-checkpoint verify`, "
                        "or a new folder to train from scratch",
                    )
                ]
            )
        return None


def shape_problems(model_state: dict, path: Path, *, key: str) -> list[Problem]:
    """Where the model a run builds and the checkpoint at ``path`` differ in a tensor's global shape
    or name: a checkpoint of another model, which no retry and no older step can load. The first
    differing tensor names both shapes; the rest are counted. Empty when every tensor matches."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from torch.distributed.checkpoint import FileSystemReader

    stored = {
        name: tuple(meta.size)
        for name, meta in FileSystemReader(str(path)).read_metadata().state_dict_metadata.items()
        if hasattr(meta, "size")
    }
    wanted = {t.key: tuple(t.global_shape) for t in nested_values(model_state) if isinstance(t, ShardedTensor)}
    differing = [(name, stored.get(name), shape) for name, shape in sorted(wanted.items()) if stored.get(name) != shape]
    if not differing:
        return []
    name, had, want = differing[0]
    more = f" ({len(differing) - 1} more tensors differ)" if len(differing) > 1 else ""
    found = f"{name} of shape {list(had)}" if had is not None else f"no {name}"
    return [
        Problem(
            key,
            f"{path.name} holds {found}, and this model's {name} has shape {list(want)}{more}: "
            "the checkpoint is of another model",
            allowed="the model.* and moe.* settings the checkpoint was saved with, or another checkpoint folder",
        )
    ]


def _cause_in(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The ``kind`` exception behind ``error``: itself, a cause, or one of the per-rank failures a
    torch CheckpointException carries (``failures``: rank -> (exception, traceback))."""
    seen, pending = set(), [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        pending += [current.__cause__, current.__context__]
        for failure in (getattr(current, "failures", None) or {}).values():
            pending.append(failure[0] if isinstance(failure, tuple) else failure)
    return None


def _checksum_mismatch_in(error: BaseException) -> ChecksumMismatch | None:
    """The checksum mismatch behind ``error`` (see ``_cause_in``)."""
    return _cause_in(error, ChecksumMismatch)
