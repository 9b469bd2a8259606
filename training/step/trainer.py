"""The training loop: set up the process group and parallel layout, build, resume, train, checkpoint.

Exit codes follow Kubeflow's ``restartPolicy: ExitCode`` convention, which the Slurm and
EKS launchers rely on: 1-127 are permanent (never retried), 128-255 are retryable.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.training.checkpoints.manager import CheckpointManager
from moe_cdk.training.config import Spec, TrainConfig
from moe_cdk.training.exit_codes import EXIT_OK
from moe_cdk.training.launch_env import LaunchEnv
from moe_cdk.training.metrics import MetricsSink, MoEProbe, default_peak_tflops, peak_memory_gib
from moe_cdk.training.profiler import StepProfiler, check_profile, phase, ranged
from moe_cdk.training.step import cpu_compat, parallel
from moe_cdk.training.step.model import build_model, resolve_spec
from moe_cdk.training.step.parallel import Layout
from moe_cdk.training.step.sizes import flops_per_token, model_vocab_size, use_bf16
from moe_cdk.training.stop import StopRequested, exit_code_for

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    rank: int
    world_size: int
    device: torch.device
    layout: Layout
    data_parallel_rank: int
    bf16: bool


def setup(config: TrainConfig, env: LaunchEnv) -> Runtime:
    """Process group, parallel layout and seeds. The layout is checked before anything starts."""
    layout = parallel.plan_layout(config, env.world_size)
    on_gpu = torch.cuda.is_available()
    cpu_compat.activate()
    if on_gpu:
        torch.cuda.set_device(env.local_rank)
    for key, value in env.torch_env().items():
        os.environ[key] = value
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        store=env.solo_store(),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(minutes=30),
    )
    parallel.initialize(layout)
    seed_everything(config.optim.seed)
    log.info("layout: %s", layout.describe())
    return Runtime(
        rank=env.rank,
        world_size=env.world_size,
        device=torch.device("cuda", env.local_rank) if on_gpu else torch.device("cpu"),
        layout=layout,
        data_parallel_rank=parallel.data_parallel_rank(),
        bf16=use_bf16(config, on_gpu=on_gpu),
    )


def seed_everything(seed: int) -> None:
    """Seed torch and megatron's model-parallel RNG tracker (which offsets by TP and EP rank)."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def teardown() -> None:
    if dist.is_initialized():
        parallel.destroy()
        dist.destroy_process_group()


# -- building ----------------------------------------------------------------------------


@dataclass
class Trainable:
    """The model chunks under DDP, megatron's optimizer and its LR scheduler."""

    chunks: list
    optimizer: object
    scheduler: object


def build(config: TrainConfig, runtime: Runtime, vocab_size: int) -> Trainable:
    """Model, DDP, optimizer and scheduler. Every failure here is permanent (the same
    configuration fails the same way on a replaced node), so it raises ConfigError."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.utils import get_model_config

    on_gpu = runtime.device.type == "cuda"
    o = config.optim
    if o.distributed_optimizer and not on_gpu:
        # megatron/core/optimizer/distrib_optimizer.py accepts only torch.cuda tensor types.
        raise ConfigError(
            [
                problem("megatron's distributed optimizer needs CUDA", got=True, allowed="false on CPU").at(
                    "optim.distributed_optimizer"
                )
            ]
        )
    try:
        chunks = build_model(config, vocab_size, on_gpu=on_gpu)
        transformer_config = get_model_config(chunks[0])
        with cpu_compat.cuda_factories_on_cpu():
            chunks = parallel.wrap(
                chunks, transformer_config, overlap=on_gpu, distributed_optimizer=o.distributed_optimizer
            )
            optimizer = get_megatron_optimizer(
                OptimizerConfig(
                    optimizer="adam",
                    lr=o.lr,
                    min_lr=o.min_lr,
                    weight_decay=o.weight_decay,
                    adam_beta1=0.9,
                    adam_beta2=0.95,
                    adam_eps=1e-8,
                    clip_grad=o.grad_clip,
                    bf16=runtime.bf16,
                    params_dtype=transformer_config.params_dtype,
                    use_distributed_optimizer=o.distributed_optimizer,
                ),
                chunks,
            )
    except ConfigError:
        raise
    except Exception as error:  # megatron's own asserts during the build
        raise ConfigError(
            [
                problem(
                    "megatron-core could not build this model and layout",
                    got=f"{type(error).__name__}: {error}",
                    allowed="a configuration megatron-core supports",
                ).at("model build")
            ]
        ) from error
    if resolve_spec(config, on_gpu=on_gpu) is Spec.NATIVE:
        use_fused_adamw(optimizer)
    transformer_config.finalize_model_grads_func = ranged("grad_reduce", finalize_model_grads)
    transformer_config.grad_scale_func = optimizer.scale_loss
    no_sync = [chunk.no_sync for chunk in chunks]
    transformer_config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    warmup = max(o.warmup_steps, 1)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=o.lr / warmup,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=warmup + o.decay_steps,
        lr_decay_style="cosine",
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=warmup + o.decay_steps,
        wd_incr_style="constant",
    )
    return Trainable(chunks=chunks, optimizer=optimizer, scheduler=scheduler)


def use_fused_adamw(optimizer) -> None:
    """Step megatron's torch AdamW with torch's fused kernel, under the native spec.

    Without Transformer Engine or Apex, megatron-core 0.16.1 builds ``torch.optim.AdamW`` with neither
    ``fused`` nor ``foreach`` (megatron/core/optimizer/__init__.py), so torch takes its foreach path, whose
    ``_foreach_sqrt`` of the second moments holds an fp32 copy of the parameters at the step's peak
    (docs/benchmarks.md). torch reads ``fused`` from each parameter group at every step, so the groups are
    switched here, and again after each ``load_state_dict``: a checkpoint's groups (one the local spec saved,
    for one) carry their own flags. TE's and Apex's Adam classes are left as they are. torch checks at the
    first step that every parameter is a floating-point tensor on a device its fused kernel supports (CPU and
    CUDA both are).
    """

    def fuse(inner, *_):
        for group in [inner.defaults, *inner.param_groups]:
            group.update(fused=True, foreach=False)

    for wrapper in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = wrapper.optimizer
        if type(inner) is torch.optim.AdamW:
            fuse(inner)
            inner.register_load_state_dict_post_hook(fuse)


# -- the step ----------------------------------------------------------------------------


def causal_mask(seq_length: int, device) -> torch.Tensor:
    # Explicit, so megatron does not build one on "cuda" (True = masked out).
    return torch.triu(torch.ones(1, 1, seq_length, seq_length, dtype=torch.bool, device=device), diagonal=1)


def _lm_loss(loss_mask: torch.Tensor, per_token: torch.Tensor):
    """Mean loss over the micro-batch's unmasked tokens; megatron's schedule divides it by the
    number of micro-batches and DDP by the data-parallel size."""
    loss = (per_token.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    # A copy: the schedule divides ``loss`` in place, and a detached view would follow it.
    return loss, {"lm_loss": loss.detach().clone()}


def _forward_step(mask: torch.Tensor, device: torch.device, data_iterator, model):
    batch = next(data_iterator)
    tokens, labels, positions = (batch[k].to(device, non_blocking=True) for k in ("tokens", "labels", "position_ids"))
    loss_mask = batch["loss_mask"].to(device, non_blocking=True).float()
    return model(tokens, positions, mask, labels=labels), functools.partial(_lm_loss, loss_mask)


def train_step(
    trainable: Trainable, batches, runtime: Runtime, mask: torch.Tensor, seq_length: int, micro_batch_size: int
) -> tuple[list[torch.Tensor], float]:
    """One optimizer step through megatron's own schedule (pipeline-parallel when the layout is),
    finalize_model_grads and optimizer. Returns this rank's micro-batch losses (on the device;
    empty off the last pipeline stage) and the global gradient norm."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    layout = runtime.layout
    # Every model chunk reads the same micro-batches, so each gets its own iterator over them.
    with phase("data"):
        microbatches = [next(batches) for _ in range(layout.num_microbatches)]
    iterators = [iter(microbatches) for _ in trainable.chunks]
    with cpu_compat.cuda_factories_on_cpu():
        for chunk in trainable.chunks:
            chunk.zero_grad_buffer()
        trainable.optimizer.zero_grad()
        with phase("forward_backward"):
            outputs = get_forward_backward_func()(
                forward_step_func=functools.partial(_forward_step, mask, runtime.device),
                data_iterator=iterators if len(iterators) > 1 else iterators[0],
                model=trainable.chunks,
                num_microbatches=layout.num_microbatches,
                seq_length=seq_length,
                micro_batch_size=micro_batch_size,
                forward_only=False,
            )
        with phase("optimizer"):
            updated, grad_norm, _ = trainable.optimizer.step()
    if not updated:
        raise FloatingPointError("the optimizer skipped the step (non-finite gradients)")
    with phase("optimizer"):
        trainable.scheduler.step(increment=1)
    return [out["lm_loss"] for out in outputs], float(grad_norm or 0.0)


def _aux_losses(calls: int) -> dict:
    """Each layer's auxiliary losses for the whole global batch, divided by the ``calls``
    forward passes (micro-batches times steps) since the last record.

    megatron's ``reduce_aux_losses_tracker_across_ranks`` sums over the pipeline stages (each
    holds its own layers) and reduces the losses the router tracks with a reduce group (the
    load-balancing loss). The router tracks the z-loss with none, so megatron would log this
    rank's share of the batch; it is averaged here over every rank that routes tokens (the
    tensor- and data-parallel ranks of a stage), which routed equal shares.
    """
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
        reduce_aux_losses_tracker_across_ranks,
    )

    tracker = get_moe_layer_wise_logging_tracker()
    routers = parallel_state.get_tensor_and_data_parallel_group()
    for entry in tracker.values():
        if entry.get("reduce_group") is None and entry.get("avg_group") is None and dist.get_world_size(routers) > 1:
            dist.all_reduce(entry["values"], group=routers)
            entry["values"] /= dist.get_world_size(routers)
    reduce_aux_losses_tracker_across_ranks()
    found = {name: [round(float(v) / calls, 6) for v in entry["values"].tolist()] for name, entry in tracker.items()}
    clear_aux_losses_tracker()
    return found


# -- loop --------------------------------------------------------------------------------


def train(config: TrainConfig, env: LaunchEnv, stop: StopRequested) -> int:
    """Run ``config`` to ``max_steps`` (or until ``stop`` is signalled). Returns the process exit code."""
    check_inputs(config)
    check_profile(config, env.world_size)
    runtime = setup(config, env)
    try:
        return _run(config, runtime, stop)
    finally:
        teardown()


def _run(config: TrainConfig, runtime: Runtime, stop: StopRequested) -> int:
    from moe_cdk.training.data.tokenizers import load_tokenizer

    layout = runtime.layout
    tokenizer = load_tokenizer(None if config.data.tokenizer == "byte" else config.data.tokenizer)
    checkpoint_dir = Path(config.checkpoint.dir)
    prepare_data(config, tokenizer, runtime)

    vocab_size = model_vocab_size(config, tokenizer.vocab_size)
    trainable = build(config, runtime, vocab_size)
    probe = MoEProbe(trainable.chunks, config.model.num_layers, config.moe.num_experts, config.model.dense_layers)
    profiler = StepProfiler.for_run(config, runtime.rank, runtime.world_size, trainable.chunks)
    o = config.optim
    checkpoints = CheckpointManager(
        checkpoint_dir,
        keep_last=config.checkpoint.keep_last,
        async_save=config.checkpoint.async_save,
        layout=layout,
        seed=o.seed,
    )
    restored = checkpoints.load_latest(trainable)
    step = restored.step if restored else 0
    consumed = restored.consumed_samples if restored else 0
    if step >= config.max_steps:
        log.warning(
            "the checkpoint in %s is at step %d and max_steps is %d: nothing left to train "
            "(raise max_steps, e.g. --max-steps %d, to train further)",
            checkpoint_dir,
            step,
            config.max_steps,
            step + config.max_steps,
        )
    if restored is None:
        log.info("no checkpoint in %s: starting at step 0", checkpoint_dir)
        if config.checkpoint.save_initial:
            checkpoints.save(trainable, step=0, consumed_samples=0)

    batches = training_batches(config, runtime, tokenizer, step=step, consumed_samples=consumed)
    sink = MetricsSink(
        rank=runtime.rank,
        jsonl=config.metrics.file,
        prometheus_port=config.metrics.prometheus_port,
        tensorboard_dir=config.metrics.tensorboard_dir,
        readiness_file=config.metrics.readiness_file,
        liveness_file=config.metrics.liveness_file,
        max_steps=config.max_steps,
    )
    mask = causal_mask(config.model.seq_length, runtime.device)
    meter = Throughput(
        tokens_per_step=o.global_batch_size * config.model.seq_length,
        flops_per_token=flops_per_token(config, vocab_size),
        peak_tflops=config.metrics.peak_tflops_per_device or default_peak_tflops(),
        world_size=runtime.world_size,
    )
    exit_code = EXIT_OK
    recorded_step = step
    _freeze_what_setup_built()
    for chunk in trainable.chunks:
        chunk.train()
    try:
        if step < config.max_steps and (signum := stop.agreed(runtime.device)):
            # Signalled while starting up: the checkpoint it resumed from is where the next run
            # starts (on a first run, step 0 from the seed), so no step is spent and nothing saved.
            log.warning("stopped by signal %s before the first step; the next run starts at step %d", signum, step)
            return exit_code_for(signum)
        while step < config.max_steps:
            started = time.perf_counter()
            with profiler.step(step + 1):
                losses, grad_norm = train_step(
                    trainable, batches, runtime, mask, config.model.seq_length, o.micro_batch_size
                )
            step += 1
            consumed += o.global_batch_size
            checkpoints.poll()
            if step % config.metrics.log_interval == 0 or step == config.max_steps or step in profiler.steps:
                elapsed = time.perf_counter() - started
                record = _record(
                    step, step - recorded_step, losses, probe, runtime, grad_norm, trainable.scheduler, elapsed, meter
                )
                for ready in profiler.hold(step, record):  # a profiled step's record waits for its summary
                    sink.write(ready)
                recorded_step = step
            if signum := stop.agreed(runtime.device):
                checkpoints.save(trainable, step=step, consumed_samples=consumed)
                checkpoints.wait()
                log.warning("stopped by signal %s at step %d after saving a checkpoint", signum, step)
                exit_code = exit_code_for(signum)
                break
            if step % config.checkpoint.save_interval == 0 or step == config.max_steps:
                checkpoints.save(trainable, step=step, consumed_samples=consumed)
        for ready in profiler.finish():  # a run stopped inside the profiled steps
            sink.write(ready)
        checkpoints.wait()
    finally:
        profiler.abandon()
        sink.close()
    return exit_code


def _freeze_what_setup_built() -> None:
    """Move every object alive now out of the garbage collector's generations, after collecting what setup left.

    What setup built (torch's, megatron-core's and dynamo's modules, the model, the optimizer, the data index) lives
    until the process ends. Left in the oldest generation, each full collection during the steps walks its objects
    again (about 300,000 in a rank of the tiny profile: 0.18 s of CPU a collection, 0.001 s frozen), a pause that
    lands on each rank at another step and holds the others at the next collective, and so does the collection at
    the interpreter's exit (docs/training.md, "Speed options")."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class Throughput:
    """Tokens/s and MFU of a step."""

    tokens_per_step: int
    flops_per_token: float
    peak_tflops: float | None
    world_size: int

    def figures(self, elapsed_s: float) -> tuple[float, float | None]:
        """(tokens/s, MFU or None without a peak figure)."""
        tokens_per_s = self.tokens_per_step / elapsed_s
        mfu = (
            tokens_per_s * self.flops_per_token / (self.peak_tflops * 1e12 * self.world_size)
            if self.peak_tflops
            else None
        )
        return round(tokens_per_s, 2), round(mfu, 5) if mfu is not None else None


def _global_loss(losses: list[torch.Tensor], runtime: Runtime) -> float:
    """The step's mean LM loss over every data-parallel rank: the last pipeline stage holds
    it (each tensor-parallel rank the same value), so one tensor-parallel rank per data-parallel
    rank contributes, summed over the world."""
    from megatron.core import parallel_state

    contributes = losses and parallel_state.get_tensor_model_parallel_rank() == 0
    total = (
        torch.stack(losses).double().mean().reshape(1)
        if contributes
        else torch.zeros(1, dtype=torch.float64, device=runtime.device)
    )
    if runtime.world_size > 1:
        dist.all_reduce(total)
    return float(total.item()) / runtime.layout.data


def _record(step, steps, losses, probe, runtime, grad_norm, scheduler, elapsed, meter: Throughput) -> dict:
    """One metrics record. Loss, throughput and grad norm are the last step's; the MoE figures
    are per-step averages over the ``steps`` steps since the previous record."""
    loss = _global_loss(losses, runtime)
    tokens_per_s, mfu = meter.figures(elapsed)
    moe = probe.collect(steps=steps)
    aux = _aux_losses(steps * runtime.layout.num_microbatches)
    return {
        "step": step,
        "loss": round(loss, 6),
        "lm_loss": round(loss, 6),
        "load_balancing_loss": aux.get("load_balancing_loss", []),
        "z_loss": aux.get("z_loss", []),
        **moe,
        "lr": scheduler.optimizer.param_groups[0]["lr"],
        "grad_norm": round(grad_norm, 6),
        "step_time_s": round(elapsed, 4),
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "peak_memory_gib": round(peak_memory_gib(), 3),
    }


def check_inputs(config: TrainConfig) -> None:
    """Files and packages the run needs, checked before any process group starts; raises ConfigError."""
    errors = []
    tokenizer = config.data.tokenizer
    if tokenizer != "byte" and not Path(tokenizer).is_file():
        errors.append(
            problem("no such file", got=tokenizer, allowed="'byte' or a tokenizer.json path").at("data.tokenizer")
        )
    for i, prefix in enumerate(config.data.prefixes):
        preparable = i == 0 and config.data.prepare_from
        missing = [suffix for suffix in (".bin", ".idx") if not Path(f"{prefix}{suffix}").is_file()]
        if missing and not preparable:
            errors.append(
                problem(
                    f"dataset files missing ({', '.join(missing)})",
                    got=prefix,
                    allowed="a prefix with .bin and .idx files (see moe-data prepare)",
                ).at(f"data.prefixes[{i}]")
            )
    for i, source in enumerate(config.data.prepare_from):
        if not Path(source).is_file():
            errors.append(
                problem("no such file", got=source, allowed="a text or JSONL file").at(f"data.prepare_from[{i}]")
            )
    if (found := folder_problem(Path(config.checkpoint.dir))) is not None:
        errors.append(found.at("checkpoint.dir"))
    if config.metrics.file and (found := folder_problem(Path(config.metrics.file).parent)) is not None:
        errors.append(found.at("metrics.file"))
    if config.metrics.tensorboard_dir and importlib.util.find_spec("tensorboard") is None:
        errors.append(
            problem(
                "needs the tensorboard package, which is not installed",
                got=config.metrics.tensorboard_dir,
                allowed="null, or pip install tensorboard",
            ).at("metrics.tensorboard_dir")
        )
    if errors:
        raise ConfigError(errors)


def folder_problem(path: Path):
    """Why ``path`` can never be a folder, or None: it, or the nearest part of it that exists, is a file.
    (A folder that is missing or not writable yet, a file system not mounted yet on this node, is left to
    the run, which a restart may find mended; a save it cannot write stops with its own message.)"""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir():
        return None
    what = "is a file, not a folder" if existing == path else f"{existing} is a file, not a folder"
    return problem(what, got=str(path), allowed="a folder, or a path that can be created as one")


def training_batches(config: TrainConfig, runtime: Runtime, tokenizer, *, step: int, consumed_samples: int):
    """This rank's micro-batches from ``consumed_samples`` on: megatron's GPT dataset, the
    resumable sampler and the data loader, as the configuration sets them."""
    from moe_cdk.training.data import dataset as data_module

    o = config.optim
    dataset = data_module.build_gpt_dataset(
        data_prefixes=list(config.data.prefixes),
        weights=list(config.data.weights) if config.data.weights else None,
        seq_length=config.model.seq_length,
        num_samples=config.max_steps * o.global_batch_size,
        seed=o.seed,
        tokenizer=tokenizer,
        cache_dir=config.data.cache_dir or str(Path(config.checkpoint.dir) / "index-cache"),
    )
    sampler = data_module.ResumableSampler(
        len(dataset),
        micro_batch_size=o.micro_batch_size,
        data_parallel_rank=runtime.data_parallel_rank,
        data_parallel_size=runtime.layout.data,
        consumed_samples=consumed_samples,
    )
    return iter(
        data_module.make_dataloader(
            dataset,
            sampler,
            num_workers=config.data.num_workers,
            prefetch_factor=config.data.prefetch_factor,
            pin_memory=config.data.pin_memory,
            seed=o.seed + step,
        )
    )


def prepare_data(config: TrainConfig, tokenizer, runtime: Runtime) -> None:
    """Tokenize ``data.prepare_from`` into the first prefix on rank 0 if it does not exist yet."""
    from moe_cdk.training.data.prepare import prepare

    prefix = Path(config.data.prefixes[0])
    if config.data.prepare_from and runtime.rank == 0 and not Path(f"{prefix}.idx").exists():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        summary = prepare([Path(p) for p in config.data.prepare_from], prefix, tokenizer)
        log.info("prepared %s: %d documents, %d tokens", prefix, summary["documents"], summary["tokens"])
    dist.barrier()
