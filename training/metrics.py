"""Where an MoE run spends its time and how its experts are loaded, per step.

``MoEProbe`` watches megatron's routers and token dispatchers without changing them: it
counts the tokens each expert receives (from the router's routing map), the router's
entropy (from its logits), and the wall time of the forward token dispatch and combine
(the all-to-all, or all-gather, communication). ``MetricsSink`` writes each step's record
to a JSONL file, serves the latest one for Prometheus (``prometheus_client``, from a registry
of its own), mirrors it to TensorBoard, touches the readiness and liveness files, and shows
progress on rank 0. ``dispatch_time_s`` is the forward dispatch and combine only (the backward
all-to-all runs inside autograd).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily

# The one table of peaks, with its sources, is the catalog's; ``moe-cdk plan`` reads it by accelerator model.
from moe_cdk.core.catalog import peak_bf16_tflops_for_device as peak_tflops_for

log = logging.getLogger(__name__)


class _Timer:
    """Wall time of device work between ``start()`` and ``stop()``, without making the host
    wait: on a GPU each interval is a pair of CUDA events, read at ``seconds()`` (log time);
    on the CPU the work is done when the call returns, so the host clock measures it."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self._pairs: list = []
        self._open = None
        self._host_s = 0.0

    def start(self) -> None:
        if self.cuda:
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._open = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pairs.append((self._open, end))
        else:
            self._host_s += time.perf_counter() - self._open

    def seconds(self) -> float:
        """Total since the last call, then reset. Waits only for the last recorded event."""
        total = self._host_s
        if self._pairs:
            self._pairs[-1][1].synchronize()
            total += sum(start.elapsed_time(end) for start, end in self._pairs) / 1000.0
        self._pairs, self._host_s = [], 0.0
        return total


class MoEProbe:
    """Per-step expert load, router entropy and dispatch time for every MoE layer of a model.

    Works on this rank's model chunks; each layer is recorded under its global layer number,
    and ``collect`` sums over every rank, so the record holds every layer of every pipeline
    stage and every token routed anywhere (each data-parallel rank routes its own tokens, and
    under sequence parallelism each tensor-parallel rank its own share of them).
    """

    def __init__(self, chunks, num_layers: int, num_experts: int, dense_layers: int = 0) -> None:
        from megatron.core.transformer.moe.moe_layer import MoELayer
        from megatron.core.transformer.transformer_layer import TransformerLayer

        self.num_layers = num_layers
        self.num_experts = num_experts
        self.dense_layers = dense_layers
        """The first layers, which have no router: their imbalance and entropy are null, not 0."""
        # On the model's device: nothing is copied to the host until ``collect``, and NCCL
        # reduces device tensors only.
        device = next(chunks[0].parameters()).device
        self.tokens = torch.zeros(num_layers, num_experts, dtype=torch.float64, device=device)
        self.entropy_sum = torch.zeros(num_layers, dtype=torch.float64, device=device)
        self.entropy_count = torch.zeros(num_layers, dtype=torch.float64, device=device)
        self.timer = _Timer()
        for chunk in chunks:
            for layer in chunk.modules():
                if isinstance(layer, TransformerLayer) and isinstance(layer.mlp, MoELayer):
                    self._watch(layer.layer_number - 1, layer.mlp)

    def _watch(self, index: int, moe) -> None:
        moe.router.register_forward_hook(self._count_tokens(index))
        moe.router.gating = self._watch_logits(index, moe.router.gating)
        dispatcher = moe.token_dispatcher
        dispatcher.token_dispatch = self._timed(dispatcher.token_dispatch)
        dispatcher.token_combine = self._timed(dispatcher.token_combine)

    def _count_tokens(self, index: int):
        def hook(module, inputs, output):
            routing_map = output[1]
            self.tokens[index] += routing_map.detach().sum(dim=0).to(torch.float64)

        return hook

    def _watch_logits(self, index: int, gating):
        def wrapped(*args, **kwargs):
            logits = gating(*args, **kwargs)
            with torch.no_grad():
                logp = torch.log_softmax(logits.detach().float(), dim=-1)
                entropy = -(logp.exp() * logp).sum(dim=-1)
                self.entropy_sum[index] += entropy.sum().to(torch.float64)
                self.entropy_count[index] += entropy.numel()
            return logits

        return wrapped

    def _timed(self, fn):
        def wrapped(*args, **kwargs):
            self.timer.start()
            result = fn(*args, **kwargs)
            self.timer.stop()
            return result

        return wrapped

    def collect(self, *, steps: int = 1) -> dict:
        """The figures since the last call, summed over every rank and averaged over ``steps``
        training steps, then reset."""
        stats = torch.cat([self.tokens.flatten(), self.entropy_sum, self.entropy_count])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stats)
        layers, experts = self.num_layers, self.num_experts
        tokens = stats[: layers * experts].view(layers, experts) / steps
        entropy = stats[layers * experts : layers * experts + layers] / stats[layers * experts + layers :].clamp(min=1)
        mean = tokens.mean(dim=1).clamp(min=1e-9)

        def moe_only(values: list, digits: int) -> list:
            return [None if layer < self.dense_layers else round(float(v), digits) for layer, v in enumerate(values)]

        record = {
            "tokens_per_expert": [[round(v) for v in row] for row in tokens.tolist()],
            "expert_imbalance": moe_only((tokens.max(dim=1).values / mean).tolist(), 4),
            "router_entropy": moe_only(entropy.tolist(), 5),
            "router_entropy_max": round(math.log(experts), 5),
            "dispatch_time_s": round(self.timer.seconds() / steps, 6),
        }
        self.tokens.zero_()
        self.entropy_sum.zero_()
        self.entropy_count.zero_()
        return record


def peak_memory_gib() -> float:
    """Peak accelerator memory of this process, or peak resident host memory on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def default_peak_tflops() -> float | None:
    """Dense BF16 peak of the local GPU; None on CPU or an unknown GPU."""
    return peak_tflops_for(torch.cuda.get_device_name()) if torch.cuda.is_available() else None


_PREFIX = "moe_train_"
_PER_LAYER = ("expert_imbalance", "router_entropy", "load_balancing_loss", "z_loss")
"""Record fields holding one value per layer, exported with a ``layer`` label (None, a dense layer, is left out)."""

# Keyword form, not a literal: tests/charts/test_dashboard.py reads the record's keys from the one dict
# literal here that has a tokens_per_expert key (MoEProbe.collect's record).
_HELP = dict(
    step="Optimizer steps completed.",
    loss="Language-model cross-entropy of the logged step, without the auxiliary losses.",
    lm_loss="Language-model cross-entropy of the logged step (the same value as loss).",
    load_balancing_loss="Load-balancing auxiliary loss per MoE layer, divided by its coefficient.",
    z_loss="Router z-loss per MoE layer, divided by its coefficient.",
    tokens_per_expert="Routing assignments per step to each expert of each MoE layer, over all data-parallel ranks.",
    expert_imbalance="Busiest expert's token count divided by the mean count, per MoE layer (1 is an even load).",
    router_entropy="Mean entropy of the router's softmax over experts per token, per MoE layer, in nats.",
    router_entropy_max="ln(num_experts), the entropy of a uniform router, in nats.",
    dispatch_time_s="Seconds per step rank 0 spent in the forward token dispatch and combine.",
    lr="Learning rate after the logged step's scheduler update.",
    grad_norm="Global gradient norm of the logged step, before clipping.",
    step_time_s="Wall time of the logged step, in seconds.",
    tokens_per_s="Tokens per second of the whole job at the logged step.",
    mfu="Model FLOPs utilisation of the logged step.",
    peak_memory_gib="Peak accelerator memory of rank 0 in GiB (peak resident host memory on CPU).",
    max_steps="The run's max_steps, the step it ends at: a run whose step reached it finished (alert rules).",
)
"""Help texts for the fields the trainer writes; any other numeric field gets a generic one."""


def _record_metrics(record: dict) -> Iterator[GaugeMetricFamily]:
    """One record as Prometheus gauges: every number unlabelled, ``tokens_per_expert`` by layer and
    expert, the per-layer lists by layer. Booleans, nulls and other fields are left out, and so is a
    metric with no values, so a field the record lacks is absent rather than 0."""
    for key, value in record.items():
        name, help_text = _PREFIX + key, _HELP.get(key, f"The trainer record's {key} at the logged step.")
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            yield GaugeMetricFamily(name, help_text, value=value)
        elif key == "tokens_per_expert" and any(value):
            family = GaugeMetricFamily(name, help_text, labels=("layer", "expert"))
            for layer, row in enumerate(value):
                for expert, count in enumerate(row):
                    family.add_metric((str(layer), str(expert)), count)
            yield family
        elif key in _PER_LAYER and any(v is not None for v in value):
            family = GaugeMetricFamily(name, help_text, labels=("layer",))
            for layer, v in enumerate(value):
                if v is not None:
                    family.add_metric((str(layer),), v)
            yield family


class _LatestRecord:
    """A ``prometheus_client`` collector for the sink's latest record, read at each scrape: the
    record's fields vary with the model (layers, experts, auxiliary losses), so the gauges are made
    from it then rather than declared up front, and a record replaced between steps is never half-exported."""

    def __init__(self, sink: MetricsSink) -> None:
        self.sink = sink

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.sink.latest:
            yield GaugeMetricFamily(_PREFIX + "max_steps", _HELP["max_steps"], value=self.sink.max_steps)
        yield from _record_metrics(self.sink.latest)


class MetricsSink:
    """Rank 0's outputs for per-step records. Other ranks get a sink that only touches probe files."""

    def __init__(
        self,
        *,
        rank: int,
        max_steps: int,
        jsonl: str | None = None,
        prometheus_port: int | None = None,
        tensorboard_dir: str | None = None,
        readiness_file: str | None = None,
        liveness_file: str | None = None,
    ) -> None:
        """Each output is off unless given: the JSONL file, the Prometheus port, the TensorBoard folder and
        the probe files."""
        self.rank = rank
        self.max_steps = max_steps
        self.latest: dict = {}
        self._first: tuple[float, int] | None = None  # (monotonic time, step) of the first record
        self.readiness = Path(readiness_file) if readiness_file else None
        self.liveness = Path(liveness_file) if liveness_file else None
        self._file = None
        self._server = None
        self._tensorboard = None
        # A registry of its own, not prometheus_client's global one: only the record is exported, and
        # two sinks in one process (tests) do not clash.
        self._registry = CollectorRegistry()
        self._registry.register(_LatestRecord(self))
        self._tty = rank == 0 and sys.stderr.isatty()
        if rank != 0:
            return
        if jsonl:
            Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(jsonl, "a", buffering=1)
        if prometheus_port:
            # Every path on all interfaces, from a daemon thread: the scraper is elsewhere (the controller's
            # Prometheus agent on Slurm, another pod on EKS), so loopback would not do.
            self._server, _ = start_http_server(prometheus_port, addr="0.0.0.0", registry=self._registry)
            log.info("serving Prometheus metrics on port %d", prometheus_port)
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(tensorboard_dir)

    def write(self, record: dict) -> None:
        """Publish one step's record (rank 0) and touch the probe files (every rank)."""
        for path in (self.liveness, self.readiness):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
        if self.rank != 0:
            return
        self.latest = record
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, int | float) and key != "step":
                    self._tensorboard.add_scalar(key, value, record["step"])
        line = (
            f"step {record['step']}/{self.max_steps} loss {record['loss']:.4f} "
            f"tokens/s {record['tokens_per_s']:.0f} imbalance "
            f"{max(v for v in record['expert_imbalance'] if v is not None):.2f} "
            f"dispatch {record['dispatch_time_s'] * 1000:.1f}ms"
        )
        # The trainer's records have all three; the line leaves out what a partial record lacks.
        for key, text in (("lr", "lr {:.3g}"), ("grad_norm", "grad_norm {:.3f}"), ("step_time_s", "step_time {:.2f}s")):
            if record.get(key) is not None:
                line += " " + text.format(record[key])
        eta_s = self._eta_s(record)
        if eta_s is not None:
            line += f" eta {datetime.timedelta(seconds=round(eta_s))}"
        if self._tty:
            done = int(30 * record["step"] / self.max_steps)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (30 - done)}] {line}")
            sys.stderr.flush()
        else:
            log.info("%s", line)

    def _eta_s(self, record: dict) -> float | None:
        """Seconds to ``max_steps`` at the mean pace since this sink's first record (before a second
        record: at the first one's ``step_time_s``); None when neither is known."""
        now, step = time.monotonic(), record["step"]
        if self._first is None:
            self._first = (now, step)
        started, first_step = self._first
        if step > first_step:
            per_step = (now - started) / (step - first_step)
        elif record.get("step_time_s") is not None:
            per_step = record["step_time_s"]
        else:
            return None
        return per_step * max(0, self.max_steps - step)

    def prometheus_text(self) -> str:
        """The latest record in Prometheus's text format, as the endpoint serves it; empty before the first."""
        return generate_latest(self._registry).decode()

    def close(self) -> None:
        if self._tty:
            sys.stderr.write("\n")
        if self._file is not None:
            self._file.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._tensorboard is not None:
            self._tensorboard.close()
