"""What a model's size comes to, from its configuration alone: the padded vocabulary, the parameter counts and
the FLOPs per token. Torch-free, so ``moe-cdk plan`` and synthesis need no torch; training/step/model.py builds the
model from the same figures."""

from __future__ import annotations

import dataclasses

from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.training.config import Precision, TrainConfig
from moe_cdk.training.step.parallel import MAX_TENSOR_PARALLEL

# The embedding and output tables are padded to a multiple of this: 128 rows per shard
# (megatron's --make-vocab-size-divisible-by default) for every tensor-parallel size up to
# MAX_TENSOR_PARALLEL. megatron pads by 128 x TP instead, but then a checkpoint's tables change
# shape with TP, and megatron loads embeddings with allow_shape_mismatch
# (tensor_parallel/layers.py), so a resume under another TP would load silently with
# freshly initialised extra rows. A padding that does not depend on TP keeps resharding exact.
VOCAB_MULTIPLE = 128 * MAX_TENSOR_PARALLEL


def padded_vocab_size(vocab_size: int) -> int:
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def model_vocab_size(config: TrainConfig, tokenizer_vocab_size: int) -> int:
    """Rows of the model's tables before padding: ``model.vocab_size``, else the tokenizer's vocabulary."""
    chosen = config.model.vocab_size
    if chosen is None:
        return tokenizer_vocab_size
    if chosen < tokenizer_vocab_size:
        raise ConfigError(
            [
                problem(
                    "smaller than the tokenizer's vocabulary",
                    got=chosen,
                    allowed=f"{tokenizer_vocab_size} or more, or null",
                ).at("model.vocab_size")
            ]
        )
    return chosen


def use_bf16(config: TrainConfig, *, on_gpu: bool) -> bool:
    """bf16 parameters and compute (fp32 main weights in the optimizer), or fp32 throughout."""
    return config.optim.precision is Precision.BF16 or (config.optim.precision is Precision.AUTO and on_gpu)


@dataclasses.dataclass(frozen=True)
class ParameterCounts:
    total: int
    """Every parameter of the full model (all stages, all experts)."""
    active: int
    """Parameters one token uses: the dense ones plus top_k of num_experts experts."""
    expert: int
    """Every expert weight (all MoE layers, all experts); ``total - expert`` are the dense ones."""


def parameter_counts(config: TrainConfig, vocab_size: int) -> ParameterCounts:
    """Parameter counts from the configuration alone (no model needed), for FLOPs and planning."""
    m, moe = config.model, config.moe
    h, layers = m.hidden_size, m.num_layers
    attention = _attention_parameters(m)
    moe_layers = layers - m.dense_layers
    expert = 3 * h * m.ffn_hidden_size  # SwiGLU: gate, up, down
    router = h * moe.num_experts
    # A shared expert is a SwiGLU MLP every token goes through: dense, and always active.
    shared = 3 * h * (moe.shared_expert_ffn_hidden_size or 0) + (h if moe.shared_expert_gate else 0)
    norms = 2 * h
    vocab = padded_vocab_size(vocab_size)
    embeddings = 2 * vocab * h + h  # input and output embeddings, final norm
    dense_mlp = 3 * h * (m.dense_ffn_hidden_size or 0)  # the first dense_layers' SwiGLU MLP
    dense = layers * (attention + norms) + moe_layers * (router + shared) + m.dense_layers * dense_mlp + embeddings
    return ParameterCounts(
        total=dense + moe_layers * moe.num_experts * expert,
        active=dense + moe_layers * moe.top_k * expert,
        expert=moe_layers * moe.num_experts * expert,
    )


def _attention_parameters(m) -> int:
    """One layer's attention weights: projections, biases and norms."""
    h, heads = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        q_head = m.qk_head_dim + m.qk_pos_emb_head_dim
        if m.q_lora_rank is None:
            query = h * heads * q_head
        else:  # down to the latent, its norm, up to the heads
            query = h * m.q_lora_rank + m.q_lora_rank * heads * q_head + (m.q_lora_rank if m.qk_layernorm else 0)
        # Down to the key/value latent plus the shared rotated key, its norm, up to keys and values.
        key_value = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank * heads * (
            m.qk_head_dim + m.v_head_dim
        )
        key_value += m.kv_lora_rank if m.qk_layernorm else 0
        return query + key_value + heads * m.v_head_dim * h
    q = heads * m.head_size
    kv = (m.num_query_groups or heads) * m.head_size
    attention = h * (q + 2 * kv) + q * h  # QKV and output projection
    attention += (q + 2 * kv) if m.qkv_bias else 0
    attention += 2 * m.head_size if m.qk_layernorm else 0  # the query and key norms' weights
    return attention


def flops_per_token(config: TrainConfig, vocab_size: int) -> float:
    """Training FLOPs per token: 6 x active parameters plus causal attention: per layer, the scores
    (query/key width) and their product with the values (value width), 2 FLOPs per multiply-add
    over half the sequence on average, 3 times for forward and backward."""
    m = config.model
    if m.multi_latent_attention:
        query_key = m.num_attention_heads * (m.qk_head_dim + m.qk_pos_emb_head_dim)
        value = m.num_attention_heads * m.v_head_dim
    else:
        query_key = value = m.num_attention_heads * m.head_size
    return 6.0 * parameter_counts(config, vocab_size).active + 3.0 * m.num_layers * m.seq_length * (query_key + value)
