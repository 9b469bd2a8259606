"""The training loop: set up the process group and parallel layout, build, resume, train, checkpoint.

Exit codes follow Kubeflow's ``restartPolicy: ExitCode`` convention, which the Slurm and
EKS launchers rely on: 1-127 are permanent (never retried), 128-255 are retryable.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from moe_cdk.training import cpu_compat
from moe_cdk.training.checkpoint import CheckpointManager
from moe_cdk.training.config import Precision, TrainConfig, check_layout
from moe_cdk.training.launch_env import LaunchEnv
from moe_cdk.training.exit_codes import EXIT_OK, EXIT_PREEMPTED
from moe_cdk.training.metrics import MetricsSink, MoEProbe, default_peak_tflops, peak_memory_gib
from moe_cdk.training.model import build_model, flops_per_token
from moe_cdk.training.schema import ConfigError, problem

log = logging.getLogger(__name__)



class StopRequested:
    """Set by SIGTERM/SIGUSR1; the loop saves at the next step boundary and exits retryably."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def agreed(self, device) -> bool:
        """True on every rank when any rank was signalled."""
        flag = torch.tensor([1.0 if self.signal is not None else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


@dataclass
class Runtime:
    rank: int
    world_size: int
    device: torch.device
    data_parallel_size: int
    data_parallel_rank: int
    bf16: bool


def setup(config: TrainConfig, env: LaunchEnv) -> Runtime:
    """Process group, parallel layout and seeds. The layout is checked before anything is built."""
    data_parallel = check_layout(config, env.world_size)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(env.local_rank)
    else:
        cpu_compat.activate()
    for key, value in env.torch_env().items():
        os.environ[key] = value
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(minutes=30))
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    p = config.parallel
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=p.tensor, pipeline_model_parallel_size=p.pipeline, expert_model_parallel_size=p.expert,
    )
    torch.manual_seed(config.optim.seed)
    model_parallel_cuda_manual_seed(config.optim.seed)
    bf16 = config.optim.precision is Precision.BF16 or (config.optim.precision is Precision.AUTO and on_gpu)
    return Runtime(
        rank=env.rank, world_size=env.world_size,
        device=torch.device("cuda", env.local_rank) if on_gpu else torch.device("cpu"),
        data_parallel_size=data_parallel, data_parallel_rank=parallel_state.get_data_parallel_rank(), bf16=bf16,
    )


def teardown() -> None:
    from megatron.core import parallel_state

    if dist.is_initialized():
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


# -- gradients ---------------------------------------------------------------------------


def _is_expert(param: torch.nn.Parameter) -> bool:
    # megatron marks expert parameters allreduce=False: they are reduced over the
    # expert-data-parallel group, not the data-parallel group.
    return not getattr(param, "allreduce", True)


def sync_gradients(model: torch.nn.Module) -> None:
    """Average gradients over data-parallel replicas (expert ones over expert-data-parallel replicas),
    and sum sequence-parallel norm gradients over the tensor-parallel group."""
    from megatron.core import parallel_state

    groups = {
        False: parallel_state.get_data_parallel_group(),
        True: parallel_state.get_expert_data_parallel_group(),
    }
    for expert, group in groups.items():
        grads = [p.grad for p in model.parameters() if p.grad is not None and _is_expert(p) == expert]
        size = dist.get_world_size(group)
        if grads and size > 1:
            _all_reduce(grads, group, divide_by=size)
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        grads = [p.grad for p in model.parameters() if p.grad is not None and getattr(p, "sequence_parallel", False)]
        if grads:
            _all_reduce(grads, parallel_state.get_tensor_model_parallel_group())


def _all_reduce(grads: list[torch.Tensor], group, *, divide_by: int = 1) -> None:
    """Sum ``grads`` over ``group`` in one flat collective (then divide), in place."""
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    if divide_by != 1:
        flat /= divide_by
    for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)


def clip_gradients(model: torch.nn.Module, max_norm: float) -> float:
    """Global gradient norm over every shard of the model; scales gradients down to ``max_norm`` (0: no clipping)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    device = next(model.parameters()).device
    sums = {False: torch.zeros(1, device=device, dtype=torch.float64), True: torch.zeros(1, device=device, dtype=torch.float64)}
    for p in model.parameters():
        if p.grad is not None and param_is_not_tensor_parallel_duplicate(p):
            sums[_is_expert(p)] += p.grad.detach().double().pow(2).sum()
    dist.all_reduce(sums[False], group=parallel_state.get_model_parallel_group())
    dist.all_reduce(sums[True], group=parallel_state.get_expert_tensor_model_pipeline_parallel_group())
    norm = math.sqrt(float(sums[False].item() + sums[True].item()))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm


# -- loop --------------------------------------------------------------------------------


def _lr_lambda(step: int, *, warmup: int, decay: int, ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / decay, 1.0)
    return ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def causal_mask(seq_length: int, device) -> torch.Tensor:
    # Explicit, so megatron does not build one on "cuda" (True = masked out).
    return torch.triu(torch.ones(1, 1, seq_length, seq_length, dtype=torch.bool, device=device), diagonal=1)


def _train_step(model, batches, runtime: Runtime, mask: torch.Tensor, num_microbatches: int) -> list[torch.Tensor]:
    """Forward and backward over ``num_microbatches`` micro-batches; returns their LM losses,
    on the device (reading them would make the host wait for each backward pass).

    Gradients accumulate as the mean over micro-batches; megatron's MoE auxiliary losses
    are scaled the same way (what megatron's own schedules do).
    """
    from megatron.core.transformer.moe.router import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.set_loss_scale(torch.full((1,), 1.0 / num_microbatches, device=runtime.device))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if runtime.bf16 else contextlib.nullcontext()
    losses = []
    for _ in range(num_microbatches):
        batch = next(batches)
        tokens, labels, positions = (batch[k].to(runtime.device, non_blocking=True) for k in ("tokens", "labels", "position_ids"))
        loss_mask = batch["loss_mask"].to(runtime.device, non_blocking=True).float()
        with autocast:
            per_token = model(tokens, positions, mask, labels=labels)
        loss = (per_token.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1)
        (loss / num_microbatches).backward()
        losses.append(loss.detach())
    return losses


def _aux_losses(calls: int) -> dict:
    """Each layer's auxiliary losses, averaged over the ``calls`` forward passes (micro-batches
    times steps) that megatron's tracker summed since the last record."""
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker

    tracker = get_moe_layer_wise_logging_tracker()
    found = {name: [round(float(v) / calls, 6) for v in entry["values"].tolist()] for name, entry in tracker.items()}
    clear_aux_losses_tracker()
    return found


def train(config: TrainConfig, env: LaunchEnv) -> int:
    """Run ``config`` to ``max_steps`` (or until signalled). Returns the process exit code."""
    from megatron.core import parallel_state

    from moe_cdk.training import data as data_module

    check_inputs(config)
    runtime = setup(config, env)
    stop = StopRequested()
    tokenizer = data_module.load_tokenizer(None if config.data.tokenizer == "byte" else config.data.tokenizer)
    checkpoint_dir = Path(config.checkpoint.dir)
    _prepare_data(config, tokenizer, runtime)

    model = build_model(config, tokenizer.vocab_size, on_gpu=runtime.device.type == "cuda")
    probe = MoEProbe(model, config.moe.num_experts)
    decay_params = [p for n, p in model.named_parameters() if p.ndim > 1]
    other_params = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay_params, "weight_decay": config.optim.weight_decay}, {"params": other_params, "weight_decay": 0.0}],
        lr=config.optim.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    o = config.optim
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(
        _lr_lambda, warmup=max(o.warmup_steps, 1), decay=o.decay_steps, ratio=o.min_lr / o.lr))
    checkpoints = CheckpointManager(checkpoint_dir, keep_last=config.checkpoint.keep_last, async_save=config.checkpoint.async_save)
    restored = checkpoints.load_latest(model, optimizer, scheduler)
    step = restored.step if restored else 0
    consumed = restored.consumed_samples if restored else 0
    if restored is None:
        log.info("no checkpoint in %s: starting at step 0", checkpoint_dir)

    num_microbatches = o.global_batch_size // (o.micro_batch_size * runtime.data_parallel_size)
    dataset = data_module.build_gpt_dataset(
        data_prefixes=list(config.data.prefixes), weights=list(config.data.weights) if config.data.weights else None,
        seq_length=config.model.seq_length, num_samples=config.max_steps * o.global_batch_size, seed=o.seed,
        tokenizer=tokenizer, cache_dir=config.data.cache_dir or str(checkpoint_dir / "index-cache"),
    )
    sampler = data_module.ResumableSampler(
        len(dataset), micro_batch_size=o.micro_batch_size, data_parallel_rank=runtime.data_parallel_rank,
        data_parallel_size=runtime.data_parallel_size, consumed_samples=consumed,
    )
    loader = data_module.make_dataloader(dataset, sampler, num_workers=config.data.num_workers,
                                         prefetch_factor=config.data.prefetch_factor, pin_memory=config.data.pin_memory)
    batches = iter(loader)
    sink = MetricsSink(rank=runtime.rank, jsonl=config.metrics.file, prometheus_port=config.metrics.prometheus_port,
                       tensorboard_dir=config.metrics.tensorboard_dir, readiness_file=config.metrics.readiness_file,
                       liveness_file=config.metrics.liveness_file, max_steps=config.max_steps)
    mask = causal_mask(config.model.seq_length, runtime.device)
    tokens_per_step = o.global_batch_size * config.model.seq_length
    flops = flops_per_token(config, tokenizer.vocab_size)
    peak_tflops = config.metrics.peak_tflops_per_device or default_peak_tflops()
    dp_group = parallel_state.get_data_parallel_group()
    exit_code = EXIT_OK
    recorded_step = step
    model.train()
    try:
        while step < config.max_steps:
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            losses = _train_step(model, batches, runtime, mask, num_microbatches)
            sync_gradients(model)
            grad_norm = clip_gradients(model, o.grad_clip)
            optimizer.step()
            scheduler.step()
            step += 1
            consumed += o.global_batch_size
            checkpoints.poll()
            if step % config.metrics.log_interval == 0 or step == config.max_steps:
                elapsed = time.perf_counter() - started
                sink.write(_record(step, step - recorded_step, num_microbatches, losses, probe, dp_group, runtime,
                                   grad_norm, scheduler, elapsed, tokens_per_step, flops, peak_tflops))
                recorded_step = step
            if stop.agreed(runtime.device):
                checkpoints.save(model, optimizer, scheduler, step=step, consumed_samples=consumed)
                checkpoints.wait()
                log.warning("stopped by signal %s at step %d after saving a checkpoint", stop.signal, step)
                exit_code = EXIT_PREEMPTED
                break
            if step % config.checkpoint.save_interval == 0 or step == config.max_steps:
                checkpoints.save(model, optimizer, scheduler, step=step, consumed_samples=consumed)
        checkpoints.wait()
    finally:
        sink.close()
        teardown()
    return exit_code


def _record(step, steps, num_microbatches, losses, probe, dp_group, runtime, grad_norm, scheduler, elapsed,
            tokens_per_step, flops, peak_tflops) -> dict:
    """One metrics record. Loss, throughput and grad norm are the last step's; the MoE figures
    are per-step averages over the ``steps`` steps since the previous record."""
    # On the device: NCCL reduces device tensors only.
    loss = torch.stack(losses).double().mean().reshape(1)
    if runtime.data_parallel_size > 1:
        dist.all_reduce(loss, group=dp_group)
        loss /= runtime.data_parallel_size
    moe = probe.collect(dp_group, steps=steps)
    aux = _aux_losses(steps * num_microbatches)
    tokens_per_s = tokens_per_step / elapsed
    record = {
        "step": step,
        "loss": round(float(loss.item()), 6),
        "lm_loss": round(float(loss.item()), 6),
        "load_balancing_loss": aux.get("load_balancing_loss", []),
        "z_loss": aux.get("z_loss", []),
        **moe,
        "lr": scheduler.get_last_lr()[0],
        "grad_norm": round(grad_norm, 6),
        "step_time_s": round(elapsed, 4),
        "tokens_per_s": round(tokens_per_s, 2),
        "mfu": round(tokens_per_s * flops / (peak_tflops * 1e12 * runtime.world_size), 5) if peak_tflops else None,
        "peak_memory_gib": round(peak_memory_gib(), 3),
    }
    return record


def check_inputs(config: TrainConfig) -> None:
    """Files and packages the run needs, checked before any process group starts; raises ConfigError."""
    errors = []
    tokenizer = config.data.tokenizer
    if tokenizer != "byte" and not Path(tokenizer).is_file():
        errors.append("data.tokenizer: " + problem("no such file", got=tokenizer, allowed="'byte' or a tokenizer.json path"))
    for i, prefix in enumerate(config.data.prefixes):
        preparable = i == 0 and config.data.prepare_from
        missing = [suffix for suffix in (".bin", ".idx") if not Path(f"{prefix}{suffix}").is_file()]
        if missing and not preparable:
            errors.append(f"data.prefixes[{i}]: " + problem(f"dataset files missing ({', '.join(missing)})", got=prefix,
                                                            allowed="a prefix with .bin and .idx files (see moe-data prepare)"))
    for i, source in enumerate(config.data.prepare_from):
        if not Path(source).is_file():
            errors.append(f"data.prepare_from[{i}]: " + problem("no such file", got=source, allowed="a text or JSONL file"))
    if config.metrics.tensorboard_dir and importlib.util.find_spec("tensorboard") is None:
        errors.append("metrics.tensorboard_dir: " + problem("needs the tensorboard package, which is not installed",
                                                            got=config.metrics.tensorboard_dir, allowed="null, or pip install tensorboard"))
    if errors:
        raise ConfigError(errors)


def _prepare_data(config: TrainConfig, tokenizer, runtime: Runtime) -> None:
    """Tokenize ``data.prepare_from`` into the first prefix on rank 0 if it does not exist yet."""
    from moe_cdk.training import data as data_module

    prefix = Path(config.data.prefixes[0])
    if config.data.prepare_from and runtime.rank == 0 and not Path(f"{prefix}.idx").exists():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        summary = data_module.prepare([Path(p) for p in config.data.prepare_from], prefix, tokenizer)
        log.info("prepared %s: %d documents, %d tokens", prefix, summary["documents"], summary["tokens"])
    dist.barrier()
