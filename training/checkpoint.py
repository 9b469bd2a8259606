"""Step-N checkpoints with megatron-core dist_checkpointing, a completion marker, and resume.

Layout: ``<dir>/step-<N>/`` holds one torch_dist checkpoint. It counts only once
``<dir>/step-<N>/moe-cdk-complete.json`` exists; rank 0 writes that marker last, after
every rank has finished writing, and records each file's size in it. On start the newest
checkpoint whose marker exists and whose files all have their recorded sizes is loaded;
newer ones that fail the check are skipped with a warning naming them. The newest
``keep_last`` complete checkpoints are kept.

Saved: model and optimizer (sharded like the model), learning-rate scheduler, every rank's
RNG states, the data position and the step.
"""

from __future__ import annotations

import json
import logging
import os
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


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter its AdamW state (zeros), so that a load has a template to fill."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not optimizer.state[param]:
                optimizer.state[param] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }


def _restore_step_counts(optimizer_state: dict, step: int) -> None:
    # AdamW's per-parameter step is not sharded (excluded from the checkpoint); it equals
    # the number of optimizer steps taken, which the checkpoint records.
    for param_state in optimizer_state["state"].values():
        param_state["step"] = torch.tensor(float(step))


@dataclass(frozen=True)
class Restored:
    step: int
    consumed_samples: int
    path: Path


def _start_writer_manager_with_signals_blocked() -> None:
    """Start megatron's checkpoint-writer manager process before any signal can arrive, and
    immune to the ones the trainer handles.

    dist_checkpointing's save starts a multiprocessing manager (``spawn``) on first use. Under
    Slurm a USR1 or TERM reaches every process of the job step, so a manager started with
    default handlers dies from the very signal that asks for a checkpoint, and that save fails
    with BrokenPipeError. A spawned process inherits the signal mask, so blocking the two
    signals while it starts keeps them away from it.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    handled = {signal.SIGTERM, signal.SIGUSR1}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    try:
        filesystem_async._get_write_results_queue()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class CheckpointManager:
    """Saves, finds, loads and prunes the checkpoints of one run."""

    def __init__(self, root: str | Path, *, keep_last: int, async_save: bool = False) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        # Async save first copies every tensor to host memory, then writes in the
        # background. On CPU there is no copy: the writer would read parameters while the
        # optimizer changes them. So CPU runs save synchronously.
        self.async_save = async_save and torch.cuda.is_available()
        if async_save and not self.async_save:
            log.info("checkpoint.async_save needs CUDA; saving synchronously on CPU")
        self.rank = dist.get_rank()
        self._async_queue = None
        self._pending: tuple[int, Path] | None = None
        _start_writer_manager_with_signals_blocked()

    # -- finding ------------------------------------------------------------------------

    def step_dirs(self) -> list[tuple[int, Path]]:
        """Every ``step-N`` folder, newest first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
        return sorted(found, reverse=True)

    @staticmethod
    def problem_with(path: Path) -> str | None:
        """Why ``path`` cannot be resumed from, or None when it is complete and intact."""
        marker = path / MARKER
        if not marker.is_file():
            return "no completion marker (the save did not finish)"
        try:
            recorded = json.loads(marker.read_text())["files"]
        except (ValueError, KeyError):
            return "unreadable completion marker"
        for name, size in recorded.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} has {file.stat().st_size} bytes, {size} were written"
        return None

    def latest_complete(self) -> list[tuple[int, Path]]:
        """Complete, intact checkpoints, newest first; the skipped newer ones are logged by name."""
        good = []
        for step, path in self.step_dirs():
            reason = self.problem_with(path)
            if reason is None:
                good.append((step, path))
            elif not good:
                log.warning("skipping checkpoint %s: %s", path, reason)
        return good

    # -- saving -------------------------------------------------------------------------

    def _sharded_state(self, model, optimizer, scheduler, *, step: int, consumed_samples: int) -> dict:
        from megatron.core.dist_checkpointing.mapping import ShardedObject
        from megatron.core.dist_checkpointing.optimizer import (
            get_param_id_to_sharded_param_map,
            optim_state_to_sharding_state,
        )

        model_state = model.sharded_state_dict()
        optim_state = optimizer.state_dict()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        id_map = get_param_id_to_sharded_param_map(model_state, params)
        optim_state_to_sharding_state(optim_state, id_map, exclude_keys=("step",))
        world, rank = dist.get_world_size(), dist.get_rank()
        return {
            "model": model_state,
            "optimizer": optim_state,
            "rng": ShardedObject("rng_state", _rng_state(), (world,), (rank,), replica_id=0),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "consumed_samples": consumed_samples,
        }

    def save(self, model, optimizer, scheduler, *, step: int, consumed_samples: int) -> None:
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
        state = self._sharded_state(model, optimizer, scheduler, step=step, consumed_samples=consumed_samples)
        if self.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            if self._async_queue is None:
                self._async_queue = AsyncCallsQueue()
            request = dist_checkpointing.save(state, str(path), async_sharded_save=True)
            self._async_queue.schedule_async_request(request)
            self._pending = (step, path)
            log.info("scheduled step-%d in %.2fs", step, time.perf_counter() - started)
            return
        dist_checkpointing.save(state, str(path))
        self._complete(step, path)
        log.info("saved step-%d in %.2fs", step, time.perf_counter() - started)

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
            files = {str(f.relative_to(path)): f.stat().st_size for f in sorted(path.rglob("*")) if f.is_file()}
            tmp = path / (MARKER + ".tmp")
            tmp.write_text(json.dumps({"step": step, "files": files}, indent=1))
            os.replace(tmp, path / MARKER)
            self._prune()
        dist.barrier()

    def _prune(self) -> None:
        # One listing and one check per folder: on Lustre each check stats every shard file.
        checked = [(step, path, self.problem_with(path) is None) for step, path in self.step_dirs()]
        complete = [(step, path) for step, path, ok in checked if ok]
        newest_complete = complete[0][0] if complete else -1
        for step, path in complete[self.keep_last:]:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s", path)
        for step, path, ok in checked:
            if step < newest_complete and not ok:
                shutil.rmtree(path, ignore_errors=True)
                log.info("removed incomplete checkpoint %s", path)

    # -- loading ------------------------------------------------------------------------

    def load_latest(self, model, optimizer, scheduler) -> Restored | None:
        """Restore the newest loadable checkpoint into model, optimizer, scheduler and RNGs."""
        from megatron.core import dist_checkpointing

        for step, path in self.latest_complete():
            started = time.perf_counter()
            _init_optimizer_state(optimizer)
            template = self._sharded_state(model, optimizer, scheduler, step=step, consumed_samples=0)
            try:
                state = dist_checkpointing.load(template, str(path))
            except Exception as error:  # a corrupt file that still has its recorded size
                if dist.get_world_size() > 1:
                    raise
                log.warning("skipping checkpoint %s: %s", path, error)
                continue
            model.load_state_dict(state["model"])
            _restore_step_counts(state["optimizer"], int(state["step"]))
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            _set_rng_state(state["rng"])
            log.info("resumed from %s in %.2fs", path, time.perf_counter() - started)
            return Restored(step=int(state["step"]), consumed_samples=int(state["consumed_samples"]), path=path)
        return None
