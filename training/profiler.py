"""Profiler timelines of chosen steps, and where each profiled step's time went.

``StepProfiler`` runs ``torch.profiler`` over the steps ``profile.first_step`` to ``profile.last_step`` on the
chosen ranks and writes each rank's timeline as a gzipped Chrome trace,
``<profile dir>/rank-<r>-steps-<A>-<B>.pt.trace.json.gz``: the format and ``*.pt.trace.json`` naming of
``torch.profiler.tensorboard_trace_handler``, which Perfetto (ui.perfetto.dev) and TensorBoard's profile plugin
open.

Each profiled step's record gets ``profile``: per profiling rank, the seconds and share of the step in each of
``CATEGORIES``. The trainer marks its phases with ``record_function`` ranges (``phase``), ``instrument`` marks the
model's attention, experts and the token dispatcher's communication, and the backward pass is tied to the
forward range that built it through the autograd sequence number each backward node shares with its forward op
(the link torch's own traces draw as fwd-bwd arrows). Every instant of a step then gets one category, the most
specific range around it, on one timeline: the host's on CPU, where each op runs to completion on the thread
that calls it, and the device's on a GPU, where a kernel takes the category of the op that launched it and the
time with no kernel running is ``other`` (only waiting for data is taken from the host there). So the seconds of
a step add up to its length, with ``other`` explicit.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.training.config import TrainConfig

log = logging.getLogger(__name__)

CATEGORIES = (
    "dispatch",
    "combine",
    "experts",
    "attention",
    "forward_rest",
    "backward_rest",
    "optimizer",
    "data",
    "grad_reduce",
    "other",
)
"""Where a step's time goes, in the order records and plots list them:

* ``dispatch``, ``combine``: the token dispatcher's communication (megatron-core 0.16.1,
  transformer/moe/token_dispatcher.py: ``token_dispatch`` and ``token_combine``, the expert-parallel
  all-to-alls of ``MoEAlltoAllTokenDispatcher``, or the all-gather and reduce-scatter of the allgather
  dispatcher), forward and backward;
* ``experts``: the experts' MLPs (the MoE layer's ``experts``), forward and backward;
* ``attention``: the attention block (projections, core attention), forward and backward;
* ``forward_rest``, ``backward_rest``: the rest of the forward and backward passes (embedding, norms,
  router, token permutation, loss, output layer);
* ``optimizer``: the optimizer and learning-rate scheduler step (with its gradient-norm all-reduce);
* ``data``: waiting for the step's micro-batches;
* ``grad_reduce``: megatron's ``finalize_model_grads`` (the data-parallel gradient all-reduce or
  reduce-scatter, and the layer-norm and embedding gradient reductions);
* ``other``: the rest of the step (zeroing gradient buffers, the schedule's own work, and on a GPU, time the
  device spent idle)."""

_PREFIX = "moe_train/"
_STEP = _PREFIX + "step "
_BACKWARD = "autograd::engine::evaluate_function: "
_MODEL = ("attention", "experts", "dispatch", "combine")
"""Ranges in the model, whose backward is theirs too."""
_SPECIFIC = frozenset(CATEGORIES) - {"forward_rest", "backward_rest", "other"}


def phase(name: str):
    """A ``moe_train/<name>`` range in the timeline while the profiler records; nothing otherwise."""
    return torch.profiler.record_function(_PREFIX + name) if torch.autograd._profiler_enabled() else _NOTHING


_NOTHING = contextlib.nullcontext()


def ranged(name: str, fn: Callable) -> Callable:
    """``fn`` run inside ``phase(name)``."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with phase(name):
            return fn(*args, **kwargs)

    return wrapped


def instrument(chunks) -> None:
    """Mark the attention blocks, the experts and the token dispatcher's communication of ``chunks``."""
    from megatron.core.transformer.attention import Attention
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for chunk in chunks:
        for module in chunk.modules():
            if isinstance(module, Attention):
                module.forward = ranged("attention", module.forward)
            elif isinstance(module, MoELayer):
                module.experts.forward = ranged("experts", module.experts.forward)
                dispatcher = module.token_dispatcher
                dispatcher.token_dispatch = ranged("dispatch", dispatcher.token_dispatch)
                dispatcher.token_combine = ranged("combine", dispatcher.token_combine)


def check_profile(config: TrainConfig, world_size: int) -> None:
    """Raise ``ConfigError`` for profiled ranks the run does not have."""
    ranks = config.profile.ranks
    if config.profile.steps and ranks is not None and max(ranks) >= world_size:
        raise ConfigError(
            [
                problem(
                    "no such rank in this run", got=list(ranks), allowed=f"ranks 0 to {world_size - 1}, or null for all"
                ).at("profile.ranks")
            ]
        )


def trace_dir(config: TrainConfig) -> Path:
    """Where the traces go: ``profile.dir``, or ``profile/`` beside ``metrics.file``."""
    return Path(config.profile.dir) if config.profile.dir else Path(config.metrics.file).parent / "profile"


@dataclass
class StepProfiler:
    """Records the steps of ``steps`` on this rank when ``active``; holds their metrics records until the last
    one has run, then returns them with each rank's summary of the step (``hold``)."""

    steps: range
    active: bool
    folder: Path
    rank: int
    world_size: int
    _profiler: object = None
    _held: list = field(default_factory=list)
    _recorded: list = field(default_factory=list)

    @classmethod
    def for_run(cls, config: TrainConfig, rank: int, world_size: int, chunks) -> StepProfiler:
        steps = config.profile.steps
        ranks = config.profile.ranks
        active = bool(steps) and (ranks is None or rank in ranks)
        if active:
            instrument(chunks)
        folder = trace_dir(config) if steps else Path()
        return cls(steps=steps, active=active, folder=folder, rank=rank, world_size=world_size)

    @contextlib.contextmanager
    def step(self, number: int) -> Iterator[None]:
        """Run step ``number``: recorded, inside its own range, when it is one of ``steps`` on an active rank."""
        if not (self.active and number in self.steps):
            yield
            return
        if self._profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()
        with torch.profiler.record_function(f"{_STEP}{number}"):
            yield
        self._recorded.append(number)

    def hold(self, step: int, record: dict) -> list[dict]:
        """The records ready to write after step ``step``'s ``record``: none while the profiled steps run, then
        all of theirs with a ``profile`` summary each (every rank must call this at the same steps: the summaries
        are gathered)."""
        if step not in self.steps:
            return [record]
        self._held.append(record)
        return self.finish() if step == self.steps[-1] else []

    def finish(self) -> list[dict]:
        """Stop recording, write this rank's trace, and return the held records with their summaries (also when
        a run stops before the last profiled step)."""
        if not self._held:
            return []
        summaries = self._stop_and_summarize()
        if self.world_size > 1 and dist.is_initialized():
            gathered: list = [None] * self.world_size
            dist.all_gather_object(gathered, summaries)
        else:
            gathered = [summaries]
        held, self._held = self._held, []
        for record in held:
            record["profile"] = [s for per_rank in gathered for s in per_rank if s["step"] == record["step"]]
        return held

    def _stop_and_summarize(self) -> list[dict]:
        if self._profiler is None:
            return []
        started = time.perf_counter()
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        recorded, self._recorded = self._recorded, []
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank-{self.rank}-steps-{recorded[0]}-{recorded[-1]}.pt.trace.json.gz"
        profiler.export_chrome_trace(str(path))
        summaries = summarize(profiler.profiler.kineto_results, self.rank)
        log.info(
            "rank %d: profiled steps %d-%d into %s (%.1f MiB) in %.2fs",
            self.rank,
            recorded[0],
            recorded[-1],
            path,
            path.stat().st_size / 2**20,
            time.perf_counter() - started,
        )
        return summaries

    def abandon(self) -> None:
        """Stop recording without writing anything (a failed run)."""
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None


# -- the summary ---------------------------------------------------------------------------


@dataclass
class _Span:
    start: int
    end: int
    label: str | None
    """This span's own category or generic phase, before nesting is resolved."""
    thread: int
    seq: int
    fwd_thread: int
    correlation: int
    depth: int = 0
    category: str | None = None
    """The category in effect: the most specific range around it."""


def _own_label(name: str) -> str | None:
    if name.startswith(_BACKWARD):
        return "backward"
    if name.startswith(_PREFIX) and not name.startswith(_STEP):
        return name[len(_PREFIX) :]
    return None


def _resolve(spans: list[_Span], backward_of: dict) -> None:
    """Each span's category. A phase or model range has its own; a backward node has the category of the
    forward range that built it (``backward_of``, by the forward op's thread and sequence number), else
    ``backward_rest``; the forward-backward range is ``forward_rest``. Other spans take their parent's. Inside a
    specific category (not a ``*_rest`` one) nothing changes it."""
    by_thread: dict[int, list[_Span]] = {}
    for span in spans:
        by_thread.setdefault(span.thread, []).append(span)
    for thread_spans in by_thread.values():
        thread_spans.sort(key=lambda s: (s.start, -s.end))
        stack: list[_Span] = []
        for span in thread_spans:
            while stack and stack[-1].end <= span.start:
                stack.pop()
            parent = stack[-1].category if stack else None
            if span.label == "backward":
                own = backward_of.get((span.fwd_thread, span.seq), "backward_rest")
            elif span.label == "forward_backward":
                own = "forward_rest"
            else:
                own = span.label if span.label in CATEGORIES else None
            span.category = parent if parent in _SPECIFIC else own or parent
            span.depth = len(stack)
            stack.append(span)


def summarize(results, rank: int) -> list[dict]:
    """One summary per ``moe_train/step N`` range of a profiler's ``kineto_results``."""
    cpu_type = torch.autograd.DeviceType.CPU
    steps, spans, device = [], [], []
    for event in results.events():
        on_host = event.device_type() == cpu_type
        if on_host and event.linked_correlation_id() > 0:
            continue  # a runtime call (cudaLaunchKernel) of an op: the op is what the kernel is linked to
        span = _Span(
            start=event.start_ns(),
            end=event.end_ns(),
            label=_own_label(event.name()),
            thread=event.start_thread_id(),
            seq=event.sequence_nr(),
            fwd_thread=event.fwd_thread_id(),
            correlation=event.correlation_id() if on_host else event.linked_correlation_id(),
        )
        if not on_host:
            device.append(span)
        elif event.name().startswith(_STEP):
            steps.append((int(event.name()[len(_STEP) :]), span))
        else:
            spans.append(span)
    # First pass: which model range each forward op ran in; the second ties the backward nodes to them.
    _resolve(spans, {})
    backward_of = {(s.thread, s.seq): s.category for s in spans if s.seq >= 0 and s.category in _MODEL}
    _resolve(spans, backward_of)
    summaries = []
    for number, step in sorted(steps, key=lambda item: item[1].start):
        if device:
            seconds = _paint_device(step, spans, device)
        else:
            seconds = _paint([s for s in spans if s.thread == step.thread], step.start, step.end)
        length_s = (step.end - step.start) / 1e9
        summaries.append(
            {
                "step": number,
                "rank": rank,
                "timeline": "device" if device else "host",
                "step_s": round(length_s, 6),
                "seconds": {c: round(seconds.get(c, 0.0), 6) for c in CATEGORIES},
                "share": {c: round(seconds.get(c, 0.0) / length_s, 4) for c in CATEGORIES},
            }
        )
    return summaries


def _paint(spans: list[_Span], start: int, end: int) -> dict[str, float]:
    """Seconds of [start, end) per category: each instant goes to the deepest span covering it."""
    events = []
    for span in spans:
        s, e = max(span.start, start), min(span.end, end)
        if s < e:
            events.append((s, 0, span))
            events.append((e, 1, span))
    events.sort(key=lambda item: (item[0], item[1]))
    seconds: dict[str, float] = {}
    active: list = []  # heap of (-depth, -start, id, span)
    ended: set[int] = set()
    cursor = start
    for at, kind, span in events:
        while active and id(active[0][3]) in ended:
            heapq.heappop(active)
        if at > cursor:
            category = active[0][3].category if active else None
            key = category if category in CATEGORIES else "other"
            seconds[key] = seconds.get(key, 0.0) + (at - cursor) / 1e9
            cursor = at
        if kind == 0:
            heapq.heappush(active, (-span.depth, -span.start, id(span), span))
        else:
            ended.add(id(span))
    if end > cursor:
        seconds["other"] = seconds.get("other", 0.0) + (end - cursor) / 1e9
    return seconds


def _paint_device(step: _Span, spans: list[_Span], device: list[_Span]) -> dict[str, float]:
    """The device's timeline of ``step``: each kernel in the category of the op that launched it, and the host's
    waits for data where no kernel runs."""
    launched_by = {s.correlation: s.category for s in spans}
    timeline = []
    for kernel in device:
        kernel.category = launched_by.get(kernel.correlation) or "other"
        kernel.depth = 1
        timeline.append(kernel)
    timeline += [_Span(s.start, s.end, "data", s.thread, -1, 0, 0, category="data") for s in spans if s.label == "data"]
    return _paint(timeline, step.start, step.end)


__all__ = ["CATEGORIES", "StepProfiler", "check_profile", "instrument", "phase", "ranged", "summarize", "trace_dir"]
