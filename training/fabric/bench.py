"""Collective benchmarks for the preflight: the expert-parallel all-to-all with a profile's dispatch
shape, and an all-reduce, in torch over the job's own process group.

The all-to-all is what an MoE step does twice per layer in the forward pass (dispatch and combine)
and twice more in the backward pass: every rank sends each of its tokens, ``top_k`` times, to the
ranks that hold the chosen experts. With an even router each rank sends ``tokens x top_k / EP`` rows
of ``hidden`` values to every rank of its expert-parallel group. ``dispatch_shape`` derives that
shape from a training profile, so the preflight measures the message the run will send rather than
a generic size sweep.

Figures use nccl-tests' definitions (nccl-tests doc/PERFORMANCE.md, "Bus bandwidth"), so they can be
compared with ``all_reduce_perf`` and ``alltoall_perf`` and with the catalog's floors:

- algorithm bandwidth = bytes of one rank's buffer / time;
- all-reduce bus bandwidth = algbw x 2(n-1)/n;
- all-to-all bus bandwidth = algbw x (n-1)/n.

The time of an iteration is the slowest rank's (an all-reduce of the per-rank times with MAX), as a
collective is only as fast as its slowest member.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from moe_cdk.training.config import TrainConfig

_BYTES_PER_GB = 1e9  # nccl-tests prints GB/s in 10**9 bytes


@dataclass(frozen=True, kw_only=True)
class DispatchShape:
    """One rank's all-to-all buffer in an MoE layer's token dispatch."""

    tokens: int
    """Tokens a rank routes per micro-batch: micro_batch_size x seq_length / tensor (sequence parallel)."""
    hidden: int
    """Values per token (model.hidden_size)."""
    top_k: int
    """Experts each token is sent to (moe.top_k)."""
    expert_parallel: int
    """Ranks in an expert-parallel group, over which the buffer is exchanged (parallel.expert)."""

    @property
    def rows(self) -> int:
        """Rows of the send buffer: every token once per chosen expert."""
        return self.tokens * self.top_k

    def bytes_per_rank(self, element_size: int) -> int:
        return self.rows * self.hidden * element_size

    def describe(self) -> str:
        return f"{self.tokens} tokens x {self.hidden} hidden x top-{self.top_k} over EP {self.expert_parallel}"


def dispatch_shape(config: TrainConfig, *, world_size: int) -> DispatchShape:
    """The dispatch buffer of ``config`` on a job of ``world_size`` ranks. The expert-parallel
    group is the profile's, capped at ``world_size`` (a CPU cluster smaller than the profile's
    layout still measures the same per-rank buffer, over the ranks it has)."""
    tensor = config.parallel.tensor
    return DispatchShape(
        tokens=max(1, config.optim.micro_batch_size * config.model.seq_length // tensor),
        hidden=config.model.hidden_size,
        top_k=config.moe.top_k,
        expert_parallel=max(1, min(config.parallel.expert, world_size)),
    )


@dataclass(frozen=True, kw_only=True)
class CollectiveResult:
    """One collective's timing over the job, as nccl-tests reports it."""

    collective: str
    """``all_to_all`` or ``all_reduce``."""
    ranks: int
    """Ranks in the group that exchanged the buffer."""
    bytes_per_rank: int
    """Size of one rank's buffer, in bytes."""
    time_us: float
    """Median over the timed iterations of the slowest rank's time, in microseconds."""

    @property
    def algbw_gb_s(self) -> float:
        return self.bytes_per_rank / (self.time_us * 1e-6) / _BYTES_PER_GB if self.time_us > 0 else 0.0

    @property
    def busbw_gb_s(self) -> float:
        n = self.ranks
        factor = 2 * (n - 1) / n if self.collective == "all_reduce" else (n - 1) / n
        return self.algbw_gb_s * factor


def _timed(run, device: torch.device, *, warmup: int, iterations: int, group) -> float:
    """Median of the slowest rank's seconds per call of ``run`` over ``iterations`` after ``warmup``."""
    for _ in range(warmup):
        run()
    slowest = []
    for _ in range(iterations):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        slowest.append(elapsed.item())
    slowest.sort()
    return slowest[len(slowest) // 2]


def _expert_group(expert_parallel: int):
    """This rank's expert-parallel group: consecutive ranks, as megatron lays out the expert
    groups when tensor x context is 1 inside them. The whole world when it is one group."""
    world = dist.get_world_size()
    if expert_parallel >= world:
        return None
    group, _ = dist.new_subgroups(group_size=expert_parallel)
    return group


def _marker(sender: int, receiver: int, ranks: int) -> float:
    """The value ``sender`` puts in its chunk for ``receiver``: below 256, so exact in bf16."""
    return float((sender * ranks + receiver) % 256)


def all_to_all(
    shape: DispatchShape, *, device: torch.device, dtype: torch.dtype, warmup: int = 5, iterations: int = 20
) -> CollectiveResult:
    """Time ``all_to_all_single`` of the dispatch buffer over this rank's expert-parallel group.
    Every rank of the job must call it. The received rows are checked: each rank fills its chunk
    for each peer with ``_marker``, so a transport that delivers wrong bytes fails."""
    group = _expert_group(shape.expert_parallel)
    ranks = dist.get_world_size(group)
    me = dist.get_rank(group)
    rows = shape.rows - shape.rows % ranks or ranks  # equal chunks, as an even router sends
    send = torch.empty(rows, shape.hidden, dtype=dtype, device=device)
    for peer, chunk in enumerate(send.chunk(ranks)):
        chunk.fill_(_marker(me, peer, ranks))
    received = torch.empty_like(send)
    seconds = _timed(
        lambda: dist.all_to_all_single(received, send, group=group),
        device,
        warmup=warmup,
        iterations=iterations,
        group=group,
    )
    expected = torch.cat(
        [torch.full((rows // ranks, shape.hidden), _marker(peer, me, ranks), dtype=dtype) for peer in range(ranks)]
    )
    if not torch.equal(received.cpu(), expected):
        raise RuntimeError(f"all_to_all delivered wrong data on group rank {me}")
    return CollectiveResult(
        collective="all_to_all", ranks=ranks, bytes_per_rank=send.numel() * send.element_size(), time_us=seconds * 1e6
    )


def all_reduce(
    size_bytes: int, *, device: torch.device, dtype: torch.dtype, warmup: int = 5, iterations: int = 20
) -> CollectiveResult:
    """Time ``all_reduce`` (sum) of a ``size_bytes`` buffer over every rank of the job, and check the sum."""
    elements = max(1, size_bytes // torch.empty((), dtype=dtype).element_size())
    buffer = torch.ones(elements, dtype=dtype, device=device)
    ranks = dist.get_world_size()
    seconds = _timed(lambda: dist.all_reduce(buffer), device, warmup=warmup, iterations=iterations, group=None)
    # After 1 + warmup + iterations sums of ones over n ranks, every element is n ** calls; check one
    # fresh sum instead, which stays exact in any dtype.
    check = torch.ones(8, dtype=dtype, device=device)
    dist.all_reduce(check)
    if not torch.all(check.cpu() == ranks):
        raise RuntimeError("all_reduce returned a wrong sum")
    return CollectiveResult(
        collective="all_reduce", ranks=ranks, bytes_per_rank=elements * buffer.element_size(), time_us=seconds * 1e6
    )
