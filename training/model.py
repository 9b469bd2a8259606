"""Our thin adapter over megatron-core: the TransformerConfig and the MoE GPTModel built from a TrainConfig."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from moe_cdk.training.config import TrainConfig

# Megatron pads the embedding table so that each tensor-parallel shard is a multiple of
# this (megatron's --make-vocab-size-divisible-by default).
VOCAB_MULTIPLE = 128


def padded_vocab_size(vocab_size: int, tensor_parallel: int) -> int:
    multiple = VOCAB_MULTIPLE * tensor_parallel
    return -(-vocab_size // multiple) * multiple


def transformer_config_kwargs(config: TrainConfig, *, on_gpu: bool) -> dict:
    """Every TransformerConfig field moe-cdk sets, in one place."""
    m, moe, p = config.model, config.moe, config.parallel
    return dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups or m.num_attention_heads,
        ffn_hidden_size=m.ffn_hidden_size,
        moe_ffn_hidden_size=m.ffn_hidden_size,
        hidden_dropout=m.dropout,
        attention_dropout=m.dropout,
        init_method_std=m.init_method_std,
        normalization="RMSNorm",
        # SwiGLU experts, as in Mixtral.
        gated_linear_unit=True,
        activation_func=F.silu,
        # The CPU path needs bias-free linears (cpu_compat); GPU runs use the same model.
        add_bias_linear=False,
        tensor_model_parallel_size=p.tensor,
        pipeline_model_parallel_size=p.pipeline,
        expert_model_parallel_size=p.expert,
        # Megatron requires sequence parallelism for MoE with tensor parallelism.
        sequence_parallel=p.tensor > 1,
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.top_k,
        moe_router_load_balancing_type="aux_loss" if moe.aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=moe.aux_loss_coeff,
        moe_z_loss_coeff=moe.z_loss_coeff or None,
        moe_expert_capacity_factor=moe.capacity_factor,
        moe_token_dispatcher_type=moe.token_dispatcher.value,
        moe_grouped_gemm=False,
        # Parameters stay fp32 (the optimizer's master copy); bf16 runs use autocast.
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        bf16=False,
        use_cpu_initialization=not on_gpu,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=on_gpu,
        persist_layer_norm=False,
    )


def build_transformer_config(config: TrainConfig, *, on_gpu: bool):
    """megatron-core's TransformerConfig for ``config``.

    Raises ValueError if megatron changes any value we set (its ``__post_init__`` may
    adjust fields); a silently different model is worse than a clear error.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = transformer_config_kwargs(config, on_gpu=on_gpu)
    built = TransformerConfig(**kwargs)
    changed = {k: (v, getattr(built, k)) for k, v in kwargs.items() if getattr(built, k) != v}
    if changed:
        raise ValueError("megatron-core changed TransformerConfig values: "
                         + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()))
    return built


def build_model(config: TrainConfig, vocab_size: int, *, on_gpu: bool) -> torch.nn.Module:
    """The MoE GPTModel (this rank's pipeline stage), with local (non-Transformer-Engine) layers."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    transformer_config = build_transformer_config(config, on_gpu=on_gpu)
    spec = get_gpt_layer_local_spec(num_experts=config.moe.num_experts, moe_grouped_gemm=False, normalization="RMSNorm")
    model = GPTModel(
        config=transformer_config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab_size(vocab_size, config.parallel.tensor),
        max_sequence_length=config.model.seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=config.model.rotary_base,
    )
    return model.cuda() if on_gpu else model


@dataclasses.dataclass(frozen=True)
class ParameterCounts:
    total: int
    """Every parameter of the full model (all stages, all experts)."""
    active: int
    """Parameters one token uses: the dense ones plus top_k of num_experts experts."""
    expert: int
    """Every expert weight (all layers, all experts); ``total - expert`` are the dense ones."""


def parameter_counts(config: TrainConfig, vocab_size: int) -> ParameterCounts:
    """Parameter counts from the configuration alone (no model needed), for FLOPs and planning."""
    m, moe = config.model, config.moe
    h, layers = m.hidden_size, m.num_layers
    heads = m.num_attention_heads
    kv = (m.num_query_groups or heads) * (h // heads)
    attention = h * (h + 2 * kv) + h * h  # QKV and output projection, no biases
    expert = 3 * h * m.ffn_hidden_size  # SwiGLU: gate, up, down
    router = h * moe.num_experts
    norms = 2 * h
    vocab = padded_vocab_size(vocab_size, config.parallel.tensor)
    embeddings = 2 * vocab * h + h  # input and output embeddings, final norm
    dense = layers * (attention + router + norms) + embeddings
    return ParameterCounts(
        total=dense + layers * moe.num_experts * expert,
        active=dense + layers * moe.top_k * expert,
        expert=layers * moe.num_experts * expert,
    )


def flops_per_token(config: TrainConfig, vocab_size: int) -> float:
    """Training FLOPs per token: 6 x active parameters plus causal attention scores (forward and backward)."""
    m = config.model
    return 6.0 * parameter_counts(config, vocab_size).active + 6.0 * m.num_layers * m.hidden_size * m.seq_length
