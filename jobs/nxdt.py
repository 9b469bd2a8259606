"""A moe-train profile as NxD Training's configuration: the same model, layout, batch, schedule, data and checkpoints
on Trainium, or every key the profile sets that NxD Training cannot express, refused by name.

``render_nxdt_config`` writes the Hydra configuration that NxD Training's ``training_orchestrator.py`` reads
(its megatron model path, ``model_source: megatron``), key for key in the shape of AWS's
``examples/conf/megatron_mixtral_8x7b_config.yaml`` (rules/neuron.py, [NXDT]). Every key of a profile is in one
of three places below: ``MAPPED`` (it becomes a NxD Training key), ``_FIXED`` (NxD Training has no such setting,
so the profile must leave it at the one value NxD Training behaves as), or ``_checks`` (allowed only in some
combinations). ``tests/jobs/test_nxdt.py`` keeps that list complete, so a new profile key cannot be dropped
silently on Trainium.

The data that ``moe-data prepare`` writes is read as it is: NxD Training's megatron path reads megatron's
indexed ``.bin``/``.idx`` files through NeMo's ``MMapIndexedDataset`` (data key ``data.data_prefix``).
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePosixPath

from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.rules import neuron
from moe_cdk.training.config import (
    Dispatcher,
    ModelConfig,
    MoEConfig,
    Precision,
    RecomputeGranularity,
    RecomputeModule,
    RouterDtype,
    ScoreFunction,
    Spec,
    Toggle,
    TrainConfig,
)
from moe_cdk.training.step.parallel import tensor_limit

_NXDT = "NxD Training"
TRN2 = "ml.trn2.48xlarge"

# Profile keys that NxD Training has no setting for: the one value it behaves as, and what it does instead.
_FIXED: dict[str, tuple[object, str]] = {
    "model.qk_layernorm": (False, "its megatron attention has no query/key norm"),
    "model.multi_latent_attention": (False, "its megatron attention is multi-head or grouped-query only"),
    "model.q_lora_rank": (ModelConfig.q_lora_rank, "it has no multi-latent attention"),
    "model.kv_lora_rank": (ModelConfig.kv_lora_rank, "it has no multi-latent attention"),
    "model.qk_head_dim": (ModelConfig.qk_head_dim, "it has no multi-latent attention"),
    "model.qk_pos_emb_head_dim": (ModelConfig.qk_pos_emb_head_dim, "it has no multi-latent attention"),
    "model.v_head_dim": (ModelConfig.v_head_dim, "it has no multi-latent attention"),
    "model.qkv_bias": (False, "its expert layer asserts has_bias False, and the bias is model-wide"),
    "model.vocab_size": (None, "it sizes the tables from the tokenizer"),
    "model.dense_layers": (0, "every layer is an MoE layer (moe.frequency 1)"),
    "model.dense_ffn_hidden_size": (None, "every layer is an MoE layer (moe.frequency 1)"),
    "model.spec": (Spec.AUTO, "a megatron-core layer spec; NxD Training builds its own layers"),
    "moe.z_loss_coeff": (0.0, "its router has the load-balancing loss only"),
    "moe.token_dispatcher": (Dispatcher.ALLTOALL, "its expert-parallel dispatch is an all-to-all"),
    "moe.grouped_gemm": (Toggle.AUTO, "a CUDA kernel choice"),
    "moe.permute_fusion": (Toggle.AUTO, "a CUDA kernel choice"),
    "moe.router_dtype": (RouterDtype.DEFAULT, "its router has no precision setting"),
    "moe.expert_bias": (False, "its router has no aux-loss-free expert bias"),
    "moe.bias_update_rate": (MoEConfig.bias_update_rate, "its router has no aux-loss-free expert bias"),
    "moe.shared_expert_ffn_hidden_size": (None, "its megatron model has no shared experts"),
    "moe.shared_expert_gate": (False, "its megatron model has no shared experts"),
    "moe.num_groups": (None, "its router has no group-limited routing"),
    "moe.group_top_k": (None, "its router has no group-limited routing"),
    "moe.top_k_scaling_factor": (None, "its router does not scale the top-k scores"),
    # [NXDT] models/megatron/transformer.py (lines 438-444) builds top_k routing's RouterTopK without act_fn, so
    # its default, softmax ([NXD] modules/moe/routing.py, line 171), scores the experts whatever the configuration
    # says; router_activation reaches only the sinkhorn router (line 451).
    "moe.score_function": (ScoreFunction.SOFTMAX, "its top-k router always scores with softmax"),
    "data.prepare_from": ((), "it reads prepared data only: run moe-data prepare first"),
    "data.prefetch_factor": (2, "its data loader has no prefetch setting"),
    "data.pin_memory": (False, "there is no GPU to page-lock batches for"),
    "checkpoint.save_initial": (False, "it saves at checkpoint.save_interval only"),
    "metrics.file": (None, "it logs to TensorBoard under checkpoint.dir"),
    "metrics.prometheus_port": (None, "it has no Prometheus exporter"),
    "metrics.tensorboard_dir": (None, "it writes TensorBoard under checkpoint.dir"),
    "metrics.readiness_file": (None, "it writes no probe files"),
    "metrics.liveness_file": (None, "it writes no probe files"),
    "metrics.peak_tflops_per_device": (None, "it reports no MFU"),
    "profile.first_step": (None, "moe-train's torch profiler does not run under NxD Training"),
    "profile.last_step": (None, "moe-train's torch profiler does not run under NxD Training"),
    "profile.ranks": (None, "moe-train's torch profiler does not run under NxD Training"),
    "profile.dir": (None, "moe-train's torch profiler does not run under NxD Training"),
}

MAPPED = frozenset(
    {
        "max_steps",
        "model.num_layers",
        "model.hidden_size",
        "model.num_attention_heads",
        "model.num_query_groups",
        "model.kv_channels",
        "model.norm_epsilon",
        "model.ffn_hidden_size",
        "model.seq_length",
        "model.init_method_std",
        "model.dropout",
        "model.rotary_base",
        "moe.num_experts",
        "moe.top_k",
        "moe.aux_loss_coeff",
        "moe.capacity_factor",
        "moe.normalize_top_k",
        "parallel.tensor",
        "parallel.pipeline",
        "parallel.virtual_pipeline",
        "parallel.expert",
        "parallel.expert_tensor",
        "parallel.sequence",
        "data.prefixes",
        "data.weights",
        "data.tokenizer",
        "data.cache_dir",
        "data.num_workers",
        "optim.micro_batch_size",
        "optim.global_batch_size",
        "optim.lr",
        "optim.min_lr",
        "optim.warmup_steps",
        "optim.decay_steps",
        "optim.weight_decay",
        "optim.grad_clip",
        "optim.seed",
        "optim.precision",
        "optim.distributed_optimizer",
        "recompute.granularity",
        "recompute.modules",
        "checkpoint.dir",
        "checkpoint.save_interval",
        "checkpoint.keep_last",
        "checkpoint.async_save",
        "metrics.log_interval",
    }
)
"""Profile keys that become NxD Training keys (some only in the combinations ``_checks`` allows)."""

FIXED = frozenset(_FIXED)


def profile_keys(train: TrainConfig) -> dict[str, object]:
    """Every leaf key of the profile, dotted (``moe.top_k``), with its value."""
    keys: dict[str, object] = {}
    for section in dataclasses.fields(train):
        value = getattr(train, section.name)
        if dataclasses.is_dataclass(value):
            for field in dataclasses.fields(value):
                keys[f"{section.name}.{field.name}"] = getattr(value, field.name)
        else:
            keys[section.name] = value
    return keys


def _shown(value: object) -> object:
    return value.value if hasattr(value, "value") else value


def _allowed(value: object) -> str:
    """The one allowed value as the profile's YAML spells it."""
    if value is None:
        return "null (unset)"
    if isinstance(value, bool):
        return str(value).lower()
    if value == ():
        return "[] (none)"
    return str(_shown(value))


def _sequence_parallel(train: TrainConfig) -> bool:
    toggle = train.parallel.sequence
    return train.parallel.tensor > 1 if toggle is Toggle.AUTO else toggle is Toggle.ON


def _checks(train: TrainConfig, world_size: int, spec: catalog.InstanceSpec) -> list[Problem]:
    """The combinations NxD Training refuses or cannot run on nodes of ``spec``, named by the profile key to
    change."""
    m, moe, p, o = train.model, train.moe, train.parallel, train.optim
    found: list[Problem] = []

    def add(key: str, what: str, got: object, allowed: str) -> None:
        found.append(problem(what, got=got, allowed=allowed).at(key))

    kv_heads = m.num_query_groups or m.num_attention_heads
    if kv_heads % p.tensor:
        # [NXDT] transformer.py divides the key/value heads over tensor-parallel ranks; it does not replicate them.
        add(
            "parallel.tensor",
            f"{_NXDT} splits the {kv_heads} key/value heads over it",
            p.tensor,
            f"a divisor of model.num_query_groups ({kv_heads})",
        )
    if m.num_attention_heads % p.tensor:
        add(
            "parallel.tensor",
            "does not divide model.num_attention_heads",
            p.tensor,
            f"a divisor of {m.num_attention_heads}",
        )
    limit = tensor_limit(spec)
    refused = dict(limit.refused)
    if limit.ranks % p.tensor or p.tensor in refused:
        add(
            "parallel.tensor",
            refused.get(p.tensor, f"must divide {limit.domain}"),
            p.tensor,
            ", ".join(map(str, limit.allowed())),
        )
    if m.num_layers % p.pipeline:
        add("parallel.pipeline", "does not divide model.num_layers", p.pipeline, f"a divisor of {m.num_layers}")
    if moe.num_experts % p.expert:
        add("parallel.expert", "does not divide moe.num_experts", p.expert, f"a divisor of {moe.num_experts}")
    if world_size % (p.tensor * p.pipeline):
        add(
            "parallel.tensor",
            "tensor x pipeline does not divide the ranks",
            p.tensor * p.pipeline,
            f"a divisor of {world_size} ranks",
        )
    if p.expert_tensor not in (None, p.tensor):
        add(
            "parallel.expert_tensor",
            f"{_NXDT} splits experts over the tensor-parallel ranks, like the rest",
            p.expert_tensor,
            f"null or {p.tensor} (parallel.tensor)",
        )
    if p.expert > 1:
        # No AWS example trains NxD Training with expert parallelism: every MoE configuration in [NXDT]
        # examples/conf/ sets expert_model_parallel_size 1 (megatron_mixtral_8x7b_config.yaml, line 51), and
        # [NXD] parallel_state.py's trn2 notes end "Expert Parallelism is not supported" (line 362).
        add(
            "parallel.expert",
            f"no AWS example trains {_NXDT} with expert parallelism, and neuronx-distributed's trn2 notes list it "
            "as not supported (parallel_layers/parallel_state.py@fecfe75, line 362)",
            p.expert,
            "1: every expert is split over the tensor-parallel ranks, as AWS's Mixtral example does",
        )
    # With experts split over ranks, [NXD] expert_mlps_v2.py trains neither dropless routing (its blockwise path
    # handles expert parallelism outside training only, lines 597-654) nor full capacity: a capacity factor of
    # num_experts / top_k or more is made full capacity (lines 237-239), whose forward_all_experts path (line
    # 1105) passes every token as one (1, T, H) input (line 326), and in training experts.py (lines 169-176)
    # enters the expert-parallel region with an all-to-all over that first dimension, of size 1, across the
    # expert-parallel ranks. Only a capacity factor below num_experts / top_k runs there (forward_capacity_factor).
    full = moe.num_experts / moe.top_k
    if moe.capacity_factor is None and p.expert > 1:
        add(
            "moe.capacity_factor",
            f"dropless MoE (null) runs expert parallelism only outside training in {_NXDT}",
            None,
            f"parallel.expert 1, or a capacity factor below moe.num_experts / moe.top_k ({full:g}), which drops "
            "tokens past it",
        )
    elif moe.capacity_factor is not None and moe.capacity_factor >= full and p.expert > 1:
        add(
            "moe.capacity_factor",
            f"{_NXDT} makes {full:g} (moe.num_experts / moe.top_k) or more full capacity, whose path does not split "
            "experts over ranks",
            moe.capacity_factor,
            f"below {full:g}, or parallel.expert 1",
        )
    if moe.normalize_top_k and moe.top_k == 1:
        add("moe.normalize_top_k", f"{_NXDT} refuses to normalize a single expert's score", True, "false with top_k 1")
    if o.warmup_steps + o.decay_steps > train.max_steps:
        # NeMo's CosineAnnealing ends its decay at trainer.max_steps (max_steps - warmup - constant_steps).
        add(
            "optim.decay_steps",
            f"{_NXDT}'s cosine schedule ends by max_steps",
            o.decay_steps,
            f"at most {train.max_steps - o.warmup_steps} (max_steps less optim.warmup_steps)",
        )
    d = train.data
    if d.tokenizer == "byte" or PurePosixPath(d.tokenizer).name != "tokenizer.json":
        add(
            "data.tokenizer",
            f"{_NXDT} loads a Hugging Face tokenizer folder",
            d.tokenizer,
            "the path of a tokenizer.json in a folder transformers.AutoTokenizer loads",
        )
    if d.weights is None and len(d.prefixes) > 1:
        add("data.weights", f"{_NXDT} blends datasets by explicit weights", None, f"{len(d.prefixes)} weights")
    r = train.recompute
    if r.granularity is RecomputeGranularity.SELECTIVE and set(r.modules) != {RecomputeModule.CORE_ATTN}:
        add(
            "recompute.modules",
            f"{_NXDT}'s selective recompute is core attention",
            [x.value for x in r.modules],
            "[core_attn]",
        )
    return found


def nxdt_problems(train: TrainConfig, *, world_size: int, instance_type: str = TRN2) -> list[Problem]:
    """Every key of ``train`` that NxD Training cannot run on ``world_size`` ranks of ``instance_type`` nodes
    (default: ml.trn2.48xlarge, the catalog's one Trainium type), named by the profile's key."""
    values = profile_keys(train)
    found = [
        problem(f"{_NXDT} cannot express it: {reason}", got=_shown(values[key]), allowed=_allowed(allowed)).at(key)
        for key, (allowed, reason) in _FIXED.items()
        if values[key] != allowed
    ]
    return found + _checks(train, world_size, catalog.lookup(instance_type))


def render_nxdt_config(train: TrainConfig, *, name: str, nodes: int, ranks_per_node: int, compile_cache: str) -> dict:
    """NxD Training's configuration for ``train`` on ``nodes`` Trainium nodes of ``ranks_per_node`` ranks, with its
    compiled graphs kept in ``compile_cache``. Raises ``ConfigError`` with every key it cannot express."""
    world_size = nodes * ranks_per_node
    if found := nxdt_problems(train, world_size=world_size):
        raise ConfigError(found)
    m, moe, p, o, d, c = train.model, train.moe, train.parallel, train.optim, train.data, train.checkpoint
    bf16 = o.precision is not Precision.FP32  # auto is bf16 on an accelerator, as on a GPU
    weights = d.weights or (1.0,) * len(d.prefixes)
    dropless = moe.capacity_factor is None
    granularity = {RecomputeGranularity.NONE: None, RecomputeGranularity.SELECTIVE: "selective"}
    return {
        "name": name,
        "model_source": "megatron",
        "seed": o.seed,
        "trainer": {
            "devices": ranks_per_node,
            "num_nodes": nodes,
            "lnc": neuron.LOGICAL_NC_CONFIG,
            "max_epochs": -1,
            "max_steps": train.max_steps,
            "log_every_n_steps": train.metrics.log_interval,
            # moe-train trains on the whole dataset and validates nothing: no validation split, no validation run.
            "val_check_interval": train.max_steps,
            "check_val_every_n_epoch": None,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "limit_test_batches": 0,
            "gradient_clip_val": o.grad_clip,
        },
        "exp_manager": {
            "log_local_rank_0_only": True,
            "create_tensorboard_logger": True,
            # Checkpoints go to <explicit_log_dir>/checkpoints; resume_if_exists picks up the newest after a requeue.
            "explicit_log_dir": c.dir,
            "exp_dir": None,
            "name": name,
            "resume_if_exists": True,
            "resume_ignore_no_checkpoint": True,
            "create_checkpoint_callback": True,
            "checkpoint_callback_params": {
                "monitor": "step",
                "save_top_k": c.keep_last,
                "mode": "max",
                "save_last": False,
                "filename": f"{name}--{{step}}-{{consumed_samples}}",
                "model_parallel_size": p.tensor * p.pipeline,
                "every_n_train_steps": c.save_interval,
                "use_master_weights_in_ckpt": False,
            },
            "log_parameter_norm": True,
            "log_gradient_norm": True,
            "enable_recovery_time_instrumentation": False,
            "async_checkpointing": c.async_save,
            "save_xser": True,
            "load_xser": True,
            "resume_from_checkpoint": None,
        },
        "distributed_strategy": {
            "tensor_model_parallel_size": p.tensor,
            "pipeline_model_parallel_size": p.pipeline,
            "virtual_pipeline_model_parallel_size": p.virtual_pipeline or 1,
            "zero1": o.distributed_optimizer,
            "sequence_parallel": _sequence_parallel(train),
            "expert_model_parallel_size": p.expert,
            "token_shuffle_group_size": 1,
        },
        "data": {
            "micro_batch_size": o.micro_batch_size,
            "global_batch_size": o.global_batch_size,
            "data_prefix": [item for pair in zip(weights, d.prefixes) for item in pair],
            "index_mapping_dir": d.cache_dir,
            "data_impl": "mmap",
            "splits_string": "100,0,0",
            "seq_length": m.seq_length,
            "skip_warmup": False,
            "num_workers": d.num_workers,
            "dataloader_type": "single",
            "reset_position_ids": False,
            "reset_attention_mask": False,
            "eod_mask_loss": False,
            "validation_drop_last": True,
            "no_seqlen_plus_one_input_tokens": False,
            "pad_samples_to_global_batch_size": False,
            "tokenizer": {
                "library": "megatron",
                "type": str(PurePosixPath(d.tokenizer).parent),
                "model": None,
                "vocab_file": None,
                "merge_file": None,
                "delimiter": None,
                "sentencepiece_legacy": False,
                "use_fast": False,
            },
        },
        "model": {
            "encoder_seq_length": m.seq_length,
            "max_position_embeddings": m.seq_length,
            "num_layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "ffn_hidden_size": m.ffn_hidden_size,
            "num_attention_heads": m.num_attention_heads,
            "num_kv_heads": m.num_query_groups or m.num_attention_heads,
            "init_method_std": m.init_method_std,
            "use_scaled_init_method": True,
            "hidden_dropout": m.dropout,
            "attention_dropout": m.dropout,
            "ffn_dropout": 0.0,
            "kv_channels": m.kv_channels,
            "apply_query_key_layer_scaling": True,
            "normalization": "rmsnorm",
            "layernorm_epsilon": m.norm_epsilon,
            "do_layer_norm_weight_decay": False,
            "make_vocab_size_divisible_by": 8,
            "persist_layer_norm": True,
            "share_embeddings_and_output_weights": False,
            "position_embedding_type": "rope",
            "rotary_percentage": 1,
            "position_freq_base": m.rotary_base,
            "activation": "swiglu",
            "transformer_block_type": "pre_ln",
            "has_bias": False,
            "use_cpu_initialization": True,
            "moe": {
                "num_experts": moe.num_experts,
                "frequency": 1,
                "dropout": 0.0,
                # NxD Training's training_orchestrator.py: dropless needs capacity_factor 0.0, dropping one above 0.
                "capacity_factor": 0.0 if dropless else moe.capacity_factor,
                "dropless": dropless,
                "routing_algorithm": "top_k",
                # What its top-k router uses (see moe.score_function above), so that the file says what trains.
                "router_activation": ScoreFunction.SOFTMAX.value,
                "top_k": moe.top_k,
                "output_router_logits": moe.aux_loss_coeff > 0,
                "router_aux_loss_coef": moe.aux_loss_coeff,
                "normalize_top_k_affinities": moe.normalize_top_k,
            },
            "activations_checkpoint_granularity": granularity[train.recompute.granularity],
            # NxD Training iterates over this list when the granularity is selective (megatron_base_model.py reads
            # it with cfg.model.get(key, []), and OmegaConf returns a stored null, not the default): every AWS
            # configuration with selective names [CoreAttention], the one module it recomputes (see
            # recompute.modules above); AWS's full-granularity example leaves it null.
            "activations_checkpoint_recompute": (
                ["CoreAttention"] if train.recompute.granularity is RecomputeGranularity.SELECTIVE else None
            ),
            "fusions": {"softmax": True, "flash_attention": False},
            "optim": {
                "name": "adamw",
                "lr": o.lr,
                "weight_decay": o.weight_decay,
                "capturable": True,
                # moe-train's AdamW (training/step/trainer.py); eps is torch's default, 1e-8, as there.
                "betas": [0.9, 0.95],
                "sched": {
                    "name": "CosineAnnealing",
                    "warmup_steps": o.warmup_steps,
                    # moe-train decays over decay_steps after the warm-up, then holds min_lr to max_steps.
                    "constant_steps": train.max_steps - o.warmup_steps - o.decay_steps,
                    "min_lr": o.min_lr,
                },
            },
        },
        "precision": {
            "type": "mixed_precision" if bf16 else "fp32",
            "master_weights": True,
            "fp32_grad_acc": True,
            "fp32_grads_cc": False,
            "xla_use_bf16": "0",
            "xla_downcast_bf16": "1",
            "neuron_rt_stochastic_rounding_en": "0",
        },
        **neuron.TRN2_RUNTIME_KEYS,
        "compiler_cache_url": compile_cache,
    }


__all__ = ["FIXED", "MAPPED", "nxdt_problems", "profile_keys", "render_nxdt_config"]
