"""Where an MoE run spends its time and how its experts are loaded, per step.

``MoEProbe`` watches megatron's routers and token dispatchers without changing them: it
counts the tokens each expert receives (from the router's routing map), the router's
entropy (from its logits), and the wall time of the forward token dispatch and combine
(the all-to-all, or all-gather, communication). ``MetricsSink`` writes each step's record
to a JSONL file, serves the latest one for Prometheus, mirrors it to TensorBoard, touches
the readiness and liveness files, and shows progress on rank 0. ``dispatch_time_s`` is the
forward dispatch and combine only (the backward all-to-all runs inside autograd).
"""

from __future__ import annotations

import http.server
import json
import logging
import math
import resource
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

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
        entropy = stats[layers * experts: layers * experts + layers] / stats[layers * experts + layers:].clamp(min=1)
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


# Dense BF16 peaks from NVIDIA's data sheets (TFLOP/s, without sparsity). The PCIe and NVL
# parts have lower clocks and power than the SXM part of the same name, so they are matched
# first: "NVIDIA H100 PCIe" must not get the H100 SXM's 989.
_PEAK_TFLOPS = (
    ("H200 NVL", 835.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0),
    ("H200", 989.0), ("H100", 989.0), ("A100", 312.0),
)


def peak_tflops_for(device_name: str) -> float | None:
    """Dense BF16 peak for a CUDA device name, or None when the part is not known."""
    for part, tflops in _PEAK_TFLOPS:
        if part in device_name:
            return tflops
    return None


def default_peak_tflops() -> float | None:
    """Dense BF16 peak of the local GPU; None on CPU or an unknown GPU."""
    return peak_tflops_for(torch.cuda.get_device_name()) if torch.cuda.is_available() else None


class _PrometheusHandler(http.server.BaseHTTPRequestHandler):
    sink: MetricsSink

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.sink.prometheus_text().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:  # quiet
        pass


class MetricsSink:
    """Rank 0's outputs for per-step records. Other ranks get a sink that only touches probe files."""

    def __init__(self, *, rank: int, jsonl: str | None, prometheus_port: int | None, tensorboard_dir: str | None,
                 readiness_file: str | None, liveness_file: str | None, max_steps: int) -> None:
        self.rank = rank
        self.max_steps = max_steps
        self.latest: dict = {}
        self.readiness = Path(readiness_file) if readiness_file else None
        self.liveness = Path(liveness_file) if liveness_file else None
        self._file = None
        self._server = None
        self._tensorboard = None
        self._tty = rank == 0 and sys.stderr.isatty()
        if rank != 0:
            return
        if jsonl:
            Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(jsonl, "a", buffering=1)
        if prometheus_port:
            handler = type("Handler", (_PrometheusHandler,), {"sink": self})
            self._server = http.server.ThreadingHTTPServer(("0.0.0.0", prometheus_port), handler)
            threading.Thread(target=self._server.serve_forever, daemon=True).start()
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
        line = (f"step {record['step']}/{self.max_steps} loss {record['loss']:.4f} "
                f"tokens/s {record['tokens_per_s']:.0f} imbalance {max(v for v in record['expert_imbalance'] if v is not None):.2f} "
                f"dispatch {record['dispatch_time_s'] * 1000:.1f}ms")
        if self._tty:
            done = int(30 * record["step"] / self.max_steps)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (30 - done)}] {line}")
            sys.stderr.flush()
        else:
            log.info("%s", line)

    def prometheus_text(self) -> str:
        lines = []
        for key, value in self.latest.items():
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float):
                lines.append(f"moe_train_{key} {value}")
            elif key == "tokens_per_expert":
                for layer, row in enumerate(value):
                    lines += [f'moe_train_tokens_per_expert{{layer="{layer}",expert="{e}"}} {n}' for e, n in enumerate(row)]
            elif key in ("expert_imbalance", "router_entropy", "load_balancing_loss", "z_loss"):
                lines += [f'moe_train_{key}{{layer="{layer}"}} {v}' for layer, v in enumerate(value) if v is not None]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        if self._tty:
            sys.stderr.write("\n")
        if self._file is not None:
            self._file.close()
        if self._server is not None:
            self._server.shutdown()
        if self._tensorboard is not None:
            self._tensorboard.close()
