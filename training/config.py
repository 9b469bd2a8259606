"""The trainer's typed configuration: one frozen dataclass per YAML section.

``load_train_config(path, overrides)`` returns a ``TrainConfig`` or raises ``ConfigError``
with every problem, one ``section.key: what (got X; allowed Y)`` line each, the same
format as the infrastructure configuration. Checks that need the world size
(``parallel.plan_layout``) run once the launch environment is known, before anything is built.
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml
from pydantic.dataclasses import dataclass

from moe_cdk.core.loader import SECTION, json_schema, parse
from moe_cdk.core.problems import ConfigError, Problem, problem

Problems = Iterator[Problem]


class Dispatcher(enum.Enum):
    """How tokens reach their experts."""

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"


class Precision(enum.Enum):
    """Parameter and compute precision. bf16 is megatron's: bf16 parameters and compute, with
    fp32 main weights and gradient reduction in the optimizer."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"


class Spec(enum.Enum):
    """The layer implementation megatron builds the model from."""

    AUTO = "auto"
    TRANSFORMER_ENGINE = "transformer_engine"
    LOCAL = "local"
    NATIVE = "native"


class Toggle(enum.Enum):
    """auto, or on (true) or off (false)."""

    AUTO = "auto"
    ON = True
    OFF = False


class RouterDtype(enum.Enum):
    """Precision of the router's gating and its probabilities."""

    DEFAULT = "default"
    FP32 = "fp32"
    FP64 = "fp64"


class ScoreFunction(enum.Enum):
    """How the router turns logits into expert scores."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class RecomputeGranularity(enum.Enum):
    """Activation recompute: none, or megatron's selective recompute of chosen modules."""

    NONE = "none"
    SELECTIVE = "selective"


class RecomputeModule(enum.Enum):
    """Modules megatron's selective recompute can recompute in the backward pass."""

    CORE_ATTN = "core_attn"
    MOE_ACT = "moe_act"
    LAYERNORM = "layernorm"


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ModelConfig:
    """The GPT backbone."""

    num_layers: int = 2
    """Transformer layers."""
    hidden_size: int = 64
    """Model width."""
    num_attention_heads: int = 4
    """Attention heads; must divide hidden_size."""
    num_query_groups: int | None = None
    """Key/value heads for grouped-query attention. Default: num_attention_heads."""
    kv_channels: int | None = None
    """Width of each attention head (megatron's `kv_channels`), when it is not hidden_size / num_attention_heads
    (Qwen3-30B-A3B: 128 at hidden 2048 with 32 heads). Default: hidden_size / num_attention_heads."""
    qk_layernorm: bool = False
    """RMSNorm on each head's queries and keys before the rotary embedding (megatron's `qk_layernorm`; Qwen3)."""
    multi_latent_attention: bool = False
    """DeepSeek's multi-latent attention (megatron's `MLATransformerConfig` and MLA layer spec): keys and values come
    from one low-rank latent per token, queries from another (or a full-rank projection), and only part of each head
    is rotated. `num_query_groups` and `kv_channels` do not apply; `qk_layernorm` puts RMSNorm on the latents, as
    DeepSeek does."""
    q_lora_rank: int | None = None
    """With multi-latent attention: rank of the query latent (DeepSeek-V3: 1536). Default: none, a full-rank query
    projection (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 512
    """With multi-latent attention: rank of the key/value latent."""
    qk_head_dim: int = 128
    """With multi-latent attention: width of each query/key head's part without rotary embedding."""
    qk_pos_emb_head_dim: int = 64
    """With multi-latent attention: width of each query/key head's rotated part (one rotated key per token, shared by
    the heads)."""
    v_head_dim: int = 128
    """With multi-latent attention: width of each value head."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections, and on no other linear (megatron's `add_qkv_bias`; Qwen2-MoE)."""
    norm_epsilon: float = 1e-5
    """Epsilon of every RMSNorm (megatron's `layernorm_epsilon`; Hugging Face's `rms_norm_eps`)."""
    vocab_size: int | None = None
    """Rows of the embedding and output tables before padding, when they are more than the tokenizer's vocabulary (a
    published checkpoint's `vocab_size`; `moe-checkpoint import-hf` sets it). Default: the tokenizer's vocabulary."""
    ffn_hidden_size: int = 128
    """Hidden size of each expert's MLP."""
    dense_layers: int = 0
    """The first this-many layers have one dense SwiGLU MLP instead of experts (megatron's `moe_layer_freq`;
    DeepSeek-V3: 3 of 61, Moonlight: 1 of 27)."""
    dense_ffn_hidden_size: int | None = None
    """Hidden size of the dense layers' MLP (megatron's `ffn_hidden_size`). Needed when dense_layers > 0."""
    seq_length: int = 64
    """Tokens per sample."""
    init_method_std: float = 0.02
    """Standard deviation of the initial weights."""
    dropout: float = 0.0
    """Hidden and attention dropout."""
    rotary_base: int = 10000
    """RoPE base."""
    spec: Spec = Spec.AUTO
    """Layer implementation: `transformer_engine`, `local` (megatron-core's own modules), `native` (the local layer
    with torch's fused attention and grouped GEMM for its experts; checkpoints move to and from `local`), or `auto`
    (Transformer Engine where it imports and a GPU is present, else local)."""

    @property
    def head_size(self) -> int:
        """Width of each attention head."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def problems(self) -> Problems:
        for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length"):
            if getattr(self, key) < 1:
                yield problem("must be positive", got=getattr(self, key), allowed="1 or more").at(key)
        if not 0 <= self.dense_layers < max(self.num_layers, 1):
            yield problem(
                "out of range: an MoE model needs at least one MoE layer",
                got=self.dense_layers,
                allowed=f"0 to {self.num_layers - 1}",
            ).at("dense_layers")
        if self.dense_layers and (self.dense_ffn_hidden_size is None or self.dense_ffn_hidden_size < 1):
            yield problem(
                "the dense layers need a positive MLP size",
                got=self.dense_ffn_hidden_size,
                allowed="1 or more while dense_layers > 0",
            ).at("dense_ffn_hidden_size")
        if self.vocab_size is not None and self.vocab_size < 1:
            yield problem("must be positive", got=self.vocab_size, allowed="1 or more, or null").at("vocab_size")
        if self.multi_latent_attention:
            for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
                if getattr(self, key) < 1:
                    yield problem("must be positive", got=getattr(self, key), allowed="1 or more").at(key)
            if self.q_lora_rank is not None and self.q_lora_rank < 1:
                yield problem("must be positive", got=self.q_lora_rank, allowed="1 or more, or null").at("q_lora_rank")
            if self.qk_pos_emb_head_dim % 2:
                yield problem(
                    "the rotary embedding rotates pairs", got=self.qk_pos_emb_head_dim, allowed="an even width"
                ).at("qk_pos_emb_head_dim")
            for key in ("num_query_groups", "kv_channels"):
                if getattr(self, key) is not None:
                    yield problem(
                        "multi-latent attention has no key/value groups or kv_channels",
                        got=getattr(self, key),
                        allowed="null with multi_latent_attention",
                    ).at(key)
            if self.qkv_bias:
                yield problem("multi-latent attention's projections have no biases", got=True, allowed="false").at(
                    "qkv_bias"
                )
        if not 0.0 < self.norm_epsilon < 1.0:
            yield problem("out of range", got=self.norm_epsilon, allowed="0 < norm_epsilon < 1").at("norm_epsilon")
        if self.kv_channels is not None and self.kv_channels < 1:
            yield problem("must be positive", got=self.kv_channels, allowed="1 or more, or null").at("kv_channels")
        if self.kv_channels is None and self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads:
            yield problem(
                "must divide hidden_size", got=self.num_attention_heads, allowed=f"a divisor of {self.hidden_size}"
            ).at("num_attention_heads")
        groups = self.num_query_groups
        if groups is not None and (groups < 1 or self.num_attention_heads % groups):
            yield problem(
                "must divide num_attention_heads", got=groups, allowed=f"a divisor of {self.num_attention_heads}"
            ).at("num_query_groups")
        if not 0.0 <= self.dropout < 1.0:
            yield problem("out of range", got=self.dropout, allowed="0 <= dropout < 1").at("dropout")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class MoEConfig:
    """The mixture-of-experts layers."""

    num_experts: int = 4
    """Experts per MoE layer."""
    top_k: int = 2
    """Experts each token is routed to."""
    aux_loss_coeff: float = 0.01
    """Load-balancing auxiliary loss coefficient; 0 turns it off."""
    z_loss_coeff: float = 0.001
    """Router z-loss coefficient; 0 turns it off."""
    capacity_factor: float | None = None
    """Expert capacity as a multiple of the balanced load; tokens over it are dropped. Default: dropless."""
    token_dispatcher: Dispatcher = Dispatcher.ALLTOALL
    """alltoall or allgather."""
    grouped_gemm: Toggle = Toggle.AUTO
    """Run a rank's experts as one grouped GEMM (megatron's `moe_grouped_gemm`). `auto`: on under the Transformer
    Engine spec (TEGroupedMLP), off under the local spec (where `true` needs the `grouped_gemm` package) and the
    native spec (which groups its experts itself and refuses `true`)."""
    permute_fusion: Toggle = Toggle.AUTO
    """Fused token permutation (megatron's `moe_permute_fusion`, a Transformer Engine kernel). `auto`: on under the
    Transformer Engine spec, off elsewhere; `true` under another spec is refused."""
    router_dtype: RouterDtype = RouterDtype.DEFAULT
    """Router precision (megatron's `moe_router_dtype`): default (the compute dtype), fp32 or fp64."""
    score_function: ScoreFunction = ScoreFunction.SOFTMAX
    """How router logits become expert scores (megatron's `moe_router_score_function`): softmax (Mixtral, Qwen) or
    sigmoid (DeepSeek-V3)."""
    normalize_top_k: bool = True
    """With softmax scores: take the softmax over the chosen top_k experts' logits, so their weights sum to 1 (Mixtral;
    Qwen's `norm_topk_prob: true`). false: the softmax over all experts, then top_k without renormalising (megatron's
    `moe_router_pre_softmax`; Qwen2-MoE's `norm_topk_prob: false`)."""
    expert_bias: bool = False
    """Aux-loss-free balancing (DeepSeek-V3): a per-expert bias, moved after each step towards the under-used experts,
    steers which experts are chosen but not their weights (megatron's `moe_router_enable_expert_bias`). Needs
    `score_function: sigmoid`."""
    bias_update_rate: float = 0.001
    """How far the expert bias moves per step (megatron's `moe_router_bias_update_rate`)."""
    shared_expert_ffn_hidden_size: int | None = None
    """Hidden size of the shared expert that every token also goes through (megatron's
    `moe_shared_expert_intermediate_size`; DeepSeek, Qwen2-MoE). Default: none."""
    shared_expert_gate: bool = False
    """Scale the shared expert's output, per token, by a learned sigmoid gate (megatron's `moe_shared_expert_gate`;
    Qwen2-MoE's `shared_expert_gate`). Needs `shared_expert_ffn_hidden_size`."""
    num_groups: int | None = None
    """Group-limited routing (DeepSeek-V3): the experts form this many equal groups (megatron's
    `moe_router_num_groups`). Default: none."""
    group_top_k: int | None = None
    """With `num_groups`: each token chooses its experts within its best this-many groups (megatron's
    `moe_router_group_topk`)."""
    top_k_scaling_factor: float | None = None
    """Multiplies the chosen experts' weights (megatron's `moe_router_topk_scaling_factor`; DeepSeek-V3 uses 2.5).
    Default: 1."""

    def problems(self) -> Problems:
        if self.num_experts < 2:
            yield problem("an MoE needs at least 2 experts", got=self.num_experts, allowed="2 or more").at(
                "num_experts"
            )
        if not 1 <= self.top_k <= max(self.num_experts, 1):
            yield problem("out of range", got=self.top_k, allowed=f"1 to num_experts ({self.num_experts})").at("top_k")
        for key in ("aux_loss_coeff", "z_loss_coeff"):
            if getattr(self, key) < 0:
                yield problem("must not be negative", got=getattr(self, key), allowed="0 or more").at(key)
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            yield problem("must be positive", got=self.capacity_factor, allowed="> 0, or null for dropless").at(
                "capacity_factor"
            )
        # The rules below are megatron-core's (transformer_config.py __post_init__), checked here so that
        # they name the key.
        if self.expert_bias and self.score_function is not ScoreFunction.SIGMOID:
            yield problem(
                "aux-loss-free expert bias needs sigmoid scores",
                got=True,
                allowed="score_function: sigmoid, or expert_bias: false",
            ).at("expert_bias")
        if not self.normalize_top_k and self.score_function is not ScoreFunction.SOFTMAX:
            # megatron renormalises sigmoid scores over the top_k whenever top_k > 1 (moe_utils.py).
            yield problem(
                "only softmax scores can skip renormalising", got=False, allowed="true while score_function is sigmoid"
            ).at("normalize_top_k")
        if self.shared_expert_gate and self.shared_expert_ffn_hidden_size is None:
            yield problem(
                "gates a shared expert, and there is none",
                got=True,
                allowed="false, or a shared_expert_ffn_hidden_size",
            ).at("shared_expert_gate")
        if self.bias_update_rate < 0:
            yield problem("must not be negative", got=self.bias_update_rate, allowed="0 or more").at("bias_update_rate")
        if self.shared_expert_ffn_hidden_size is not None and self.shared_expert_ffn_hidden_size < 1:
            yield problem(
                "must be positive", got=self.shared_expert_ffn_hidden_size, allowed="1 or more, or null for none"
            ).at("shared_expert_ffn_hidden_size")
        if self.top_k_scaling_factor is not None and self.top_k_scaling_factor <= 0:
            yield problem("must be positive", got=self.top_k_scaling_factor, allowed="> 0, or null for 1").at(
                "top_k_scaling_factor"
            )
        groups, chosen = self.num_groups, self.group_top_k
        if (groups is None) != (chosen is None):
            yield problem(
                "group-limited routing needs both num_groups and group_top_k",
                got=chosen if groups is not None else groups,
                allowed="both set, or both null",
            ).at("group_top_k" if groups is not None else "num_groups")
        elif groups is not None:
            if groups < 1 or self.num_experts % groups:
                yield problem("must divide num_experts", got=groups, allowed=f"a divisor of {self.num_experts}").at(
                    "num_groups"
                )
            elif not 1 <= chosen <= groups:
                yield problem("out of range", got=chosen, allowed=f"1 to num_groups ({groups})").at("group_top_k")
            elif self.top_k % chosen or self.top_k // chosen > self.num_experts // groups:
                # Each chosen group contributes top_k / group_top_k experts of its own.
                yield problem(
                    "must divide top_k into shares that fit a group",
                    got=chosen,
                    allowed=f"a divisor of top_k ({self.top_k}) with top_k / group_top_k <= "
                    f"{self.num_experts // groups} experts per group",
                ).at("group_top_k")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ParallelConfig:
    """How the model is split across processes (training/step/parallel.py). The dense layers are
    data-parallel over world / (tensor x pipeline) ranks, the experts over
    world / (expert x expert_tensor x pipeline)."""

    tensor: int = 1
    """Tensor-parallel size of the dense layers."""
    pipeline: int = 1
    """Pipeline-parallel size: the layers are split into this many consecutive stages."""
    virtual_pipeline: int | None = None
    """Model chunks per pipeline stage for the interleaved schedule (megatron's virtual pipeline). Default: none."""
    expert: int = 1
    """Expert-parallel size: the experts of a layer are spread over this many ranks."""
    expert_tensor: int | None = None
    """Tensor-parallel size inside each expert (megatron's `expert_tensor_parallel_size`). Keep expert x expert_tensor
    within one node's NVLink domain. Default: 1 when the experts are split (expert > 1), else tensor."""
    sequence: Toggle = Toggle.AUTO
    """Sequence parallelism over the tensor-parallel group. `auto`: on whenever tensor > 1, which megatron's MoE layer
    requires for training."""

    def problems(self) -> Problems:
        for key in ("tensor", "pipeline", "expert", "expert_tensor"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                yield problem("must be at least 1", got=getattr(self, key), allowed="1 or more").at(key)
        if self.virtual_pipeline is not None:
            if self.virtual_pipeline < 2:
                yield problem(
                    "must be at least 2, or null", got=self.virtual_pipeline, allowed="2 or more, or null"
                ).at("virtual_pipeline")
            elif self.pipeline < 2:
                yield problem(
                    "needs pipeline parallelism", got=self.virtual_pipeline, allowed="null while parallel.pipeline is 1"
                ).at("virtual_pipeline")
        if self.expert == 1 and self.expert_tensor is not None and self.expert_tensor != self.tensor:
            # megatron-core 0.16.1 marks expert weights as expert-parallel only when
            # expert_model_parallel_size > 1 (transformer/moe/experts.py, tensor_parallel/layers.py),
            # so with expert 1 their gradients are reduced over the dense data-parallel group,
            # which misses the tensor-parallel ranks that routed other tokens when expert_tensor < tensor.
            yield problem(
                "with parallel.expert 1, megatron-core reduces expert gradients correctly only when expert_tensor "
                "equals tensor",
                got=self.expert_tensor,
                allowed=f"null or {self.tensor}, or parallel.expert > 1",
            ).at("expert_tensor")
        if self.sequence is Toggle.ON and self.tensor == 1:
            yield problem(
                "sequence parallelism splits over the tensor-parallel group, which has one rank",
                got=True,
                allowed="auto or false while parallel.tensor is 1",
            ).at("sequence")
        if self.sequence is Toggle.OFF and self.tensor > 1:
            # megatron/core/transformer/moe/moe_layer.py (0.16.1) raises in the training
            # forward when the attention is tensor-parallel without sequence parallelism.
            yield problem(
                "megatron's MoE layer trains with tensor parallelism only under sequence parallelism",
                got=False,
                allowed="auto or true while parallel.tensor > 1",
            ).at("sequence")

    @property
    def expert_tensor_size(self) -> int:
        """The expert tensor-parallel size, with its default resolved."""
        if self.expert_tensor is not None:
            return self.expert_tensor
        return 1 if self.expert > 1 else self.tensor

    @property
    def sequence_parallel(self) -> bool:
        """Whether sequence parallelism is on."""
        return self.tensor > 1 if self.sequence is Toggle.AUTO else bool(self.sequence.value)


@dataclass(frozen=True, kw_only=True, config=SECTION)
class RecomputeConfig:
    """Activation recompute: trade compute for activation memory."""

    granularity: RecomputeGranularity = RecomputeGranularity.NONE
    """`none`, or `selective` (recompute only `modules` in the backward pass; megatron's `recompute_granularity`)."""
    modules: tuple[RecomputeModule, ...] = ()
    """With `selective`: any of core_attn, moe_act, layernorm (megatron's `recompute_modules`)."""

    def problems(self) -> Problems:
        if self.granularity is RecomputeGranularity.SELECTIVE and not self.modules:
            yield problem(
                "selective recompute needs at least one module",
                got=[],
                allowed="any of " + ", ".join(m.value for m in RecomputeModule),
            ).at("modules")
        if self.granularity is RecomputeGranularity.NONE and self.modules:
            yield problem(
                "modules are recomputed only with granularity selective",
                got=[m.value for m in self.modules],
                allowed="[] while granularity is none",
            ).at("modules")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class DataConfig:
    """Pre-tokenized training data in Megatron's indexed format (.bin/.idx)."""

    prefixes: tuple[str, ...]
    """Dataset path prefixes (without .bin/.idx), e.g. `/fsx/datasets/web_text_document`."""
    weights: tuple[float, ...] | None = None
    """Blend weights, one per prefix. Default: proportional to size."""
    prepare_from: tuple[str, ...] = ()
    """Raw text or JSONL files tokenized into the first prefix when its files do not exist yet."""
    tokenizer: str = "byte"
    """`byte` (built in, no download) or the path of a `tokenizer.json`."""
    cache_dir: str | None = None
    """Where Megatron caches its sample indices. Default: `<checkpoint dir>/index-cache`."""
    num_workers: int = 1
    """DataLoader worker processes."""
    prefetch_factor: int = 2
    """Batches each worker loads ahead."""
    pin_memory: bool = False
    """Page-lock host batches for faster copies to the GPU."""

    def problems(self) -> Problems:
        if not self.prefixes:
            yield problem("needs at least one dataset", got=[], allowed="one or more path prefixes").at("prefixes")
        if self.weights is not None and len(self.weights) != len(self.prefixes):
            yield problem(
                "needs one weight per prefix", got=list(self.weights), allowed=f"{len(self.prefixes)} weights"
            ).at("weights")
        if self.num_workers < 0:
            yield problem("must not be negative", got=self.num_workers, allowed="0 or more").at("num_workers")
        if self.prefetch_factor < 1:
            yield problem("must be positive", got=self.prefetch_factor, allowed="1 or more").at("prefetch_factor")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class OptimConfig:
    """AdamW with linear warm-up and cosine decay."""

    micro_batch_size: int = 4
    """Samples per rank per forward pass."""
    global_batch_size: int = 8
    """Samples per optimizer step across all data-parallel ranks; a multiple of micro x data-parallel size."""
    lr: float = 0.001
    """Peak learning rate."""
    min_lr: float = 0.0001
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 10
    """Steps of linear warm-up."""
    decay_steps: int = 1000
    """Steps from the end of warm-up to min_lr."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 turns clipping off."""
    seed: int = 1234
    """Seed for initialisation, dropout and data order."""
    precision: Precision = Precision.AUTO
    """auto (bf16 on GPU, fp32 on CPU), fp32 or bf16."""
    distributed_optimizer: bool = False
    """Shard fp32 main weights and Adam state over the data-parallel ranks (megatron's distributed optimizer; GPU
    only)."""

    def problems(self) -> Problems:
        for key in ("micro_batch_size", "global_batch_size"):
            if getattr(self, key) < 1:
                yield problem("must be positive", got=getattr(self, key), allowed="1 or more").at(key)
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            yield problem("must satisfy 0 <= min_lr <= lr", got=self.min_lr, allowed=f"0 to {self.lr}").at("min_lr")
        if self.warmup_steps < 0 or self.decay_steps < 1:
            yield problem(
                "warmup_steps >= 0 and decay_steps >= 1",
                got=(self.warmup_steps, self.decay_steps),
                allowed="non-negative warm-up, positive decay",
            ).at("decay_steps")
        if self.grad_clip < 0:
            yield problem("must not be negative", got=self.grad_clip, allowed="0 or more").at("grad_clip")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class CheckpointConfig:
    """Distributed checkpoints (megatron-core dist_checkpointing, torch_dist format)."""

    dir: str = "checkpoints"
    """Folder of `step-N` checkpoints. On HyperPod: `/fsx/checkpoints/<run>`; on Training Jobs:
    `/opt/ml/checkpoints`."""
    save_interval: int = 50
    """Steps between checkpoints."""
    keep_last: int = 2
    """Complete checkpoints to keep, at least 2."""
    async_save: bool = False
    """Write checkpoints in the background while training continues (GPU only; CPU runs save synchronously)."""
    save_initial: bool = False
    """Save `step-0` (the initial weights, no optimizer state) before the first step of a new run, so that it can be
    repeated from the same weights under another layout."""

    def problems(self) -> Problems:
        if self.save_interval < 1:
            yield problem("must be positive", got=self.save_interval, allowed="1 or more").at("save_interval")
        if self.keep_last < 2:
            yield problem(
                "keep at least two, so a bad latest one has a fallback", got=self.keep_last, allowed="2 or more"
            ).at("keep_last")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class MetricsConfig:
    """What the trainer reports and where."""

    file: str | None = None
    """JSONL file, one record every log_interval steps, appended to (rank 0). Default: none."""
    log_interval: int = 1
    """Steps between log lines and metrics records."""
    prometheus_port: int | None = None
    """Serve the latest metrics for Prometheus on this port (rank 0). Default: off."""
    tensorboard_dir: str | None = None
    """Write TensorBoard scalars here (rank 0; needs the tensorboard package). Default: off."""
    readiness_file: str | None = None
    """Touched when the first metrics record is written, and with every one after; the readiness probe checks it exists.
    Default: none."""
    liveness_file: str | None = None
    """Touched with every metrics record (every log_interval steps); the liveness probe checks its age. Default:
    none."""
    peak_tflops_per_device: float | None = None
    """Peak dense TFLOP/s of one device, the MFU denominator. Default: from the GPU model (H100/H200 SXM 989, NVL 835,
    H100 PCIe 756, A100 312); none on CPU."""

    def problems(self) -> Problems:
        if self.log_interval < 1:
            yield problem("must be positive", got=self.log_interval, allowed="1 or more").at("log_interval")
        if self.prometheus_port is not None and not 1 <= self.prometheus_port <= 65535:
            yield problem("not a TCP port", got=self.prometheus_port, allowed="1 to 65535").at("prometheus_port")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ProfileConfig:
    """A torch profiler timeline of chosen steps (training/profiler.py): a Chrome trace per rank that Perfetto and
    TensorBoard open, and where each profiled step's time went in its metrics record."""

    first_step: int | None = None
    """First step to record (steps count from 1; `--profile-steps A:B`). Default: none, no profiling."""
    last_step: int | None = None
    """Last step to record, inclusive. Default: first_step."""
    ranks: tuple[int, ...] | None = None
    """Ranks that record a trace (`--profile-ranks 0,3`). Default: every rank."""
    dir: str | None = None
    """Folder of the traces. Default: `profile/` in the folder of metrics.file."""

    def problems(self) -> Problems:
        first, last = self.first_step, self.last_step
        if first is None:
            # ranks and dir may wait in a profile for --profile-steps; a last step without a first is a slip.
            if last is not None:
                yield problem("set without first_step", got=last, allowed="null unless first_step is set").at(
                    "last_step"
                )
            return
        if first < 1:
            yield problem("steps count from 1", got=first, allowed="1 or more").at("first_step")
        if last is not None and last < first:
            yield problem("ends before first_step", got=last, allowed=f"{first} or more, or null").at("last_step")
        if self.ranks is not None and (not self.ranks or min(self.ranks) < 0):
            yield problem("not a list of ranks", got=list(self.ranks), allowed="ranks 0 or more, or null for all").at(
                "ranks"
            )

    @property
    def steps(self) -> range:
        """The profiled steps (empty when off)."""
        if self.first_step is None:
            return range(0)
        return range(self.first_step, (self.last_step or self.first_step) + 1)


@dataclass(frozen=True, kw_only=True, config=SECTION)
class TrainConfig:
    """A training run."""

    max_steps: int = 100
    """Optimizer steps to train for."""
    model: ModelConfig = ModelConfig()
    """The backbone."""
    moe: MoEConfig = MoEConfig()
    """The experts."""
    parallel: ParallelConfig = ParallelConfig()
    """Parallel layout."""
    data: DataConfig
    """Training data."""
    optim: OptimConfig = OptimConfig()
    """Optimizer and batch."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoints."""
    metrics: MetricsConfig = MetricsConfig()
    """Metrics."""
    recompute: RecomputeConfig = RecomputeConfig()
    """Activation recompute."""
    profile: ProfileConfig = ProfileConfig()
    """Profiler timelines of chosen steps."""

    def problems(self) -> Problems:
        if self.max_steps < 1:
            yield problem("must be positive", got=self.max_steps, allowed="1 or more").at("max_steps")
        if self.moe.num_experts % self.parallel.expert:
            yield problem(
                "must divide moe.num_experts", got=self.parallel.expert, allowed=f"a divisor of {self.moe.num_experts}"
            ).at("parallel.expert")
        stages = self.parallel.pipeline * (self.parallel.virtual_pipeline or 1)
        if self.model.num_layers % stages:
            yield problem(
                "pipeline x virtual_pipeline must divide model.num_layers",
                got=stages,
                allowed=f"a divisor of {self.model.num_layers}",
            ).at("parallel.pipeline")
        if (last := self.profile.steps.stop - 1) > self.max_steps:
            yield problem(
                "the run ends before this step", got=last, allowed=f"a step up to max_steps ({self.max_steps})"
            ).at("profile.last_step" if self.profile.last_step is not None else "profile.first_step")
        if self.profile.steps and self.profile.dir is None and self.metrics.file is None:
            yield problem(
                "the traces go beside metrics.file, and there is none",
                got=None,
                allowed="a folder, or a metrics.file (--metrics-file)",
            ).at("profile.dir")
        if self.model.num_attention_heads % self.parallel.tensor:
            yield problem(
                "must divide model.num_attention_heads",
                got=self.parallel.tensor,
                allowed=f"a divisor of {self.model.num_attention_heads}",
            ).at("parallel.tensor")


def _apply_override(data: dict, assignment: str, errors: list[Problem]) -> None:
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        errors.append(problem("not a key=value assignment", got=assignment, allowed="section.key=value").at("--set"))
        return
    node = data
    *parents, last = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            errors.append(problem("not a section", got=part, allowed="a dotted path to a key").at(key))
            return
        node = child
    node[last] = yaml.safe_load(raw) if raw != "" else None


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML file, apply ``section.key=value`` overrides, and check the result."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as error:
        raise ConfigError(
            [problem("cannot read the file", got=error.strerror, allowed="a readable YAML file").at(str(path))]
        ) from None
    except yaml.YAMLError:
        raise ConfigError([problem("not valid YAML", got=str(path), allowed="a YAML mapping").at(str(path))]) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [problem("must be a mapping", got=type(data).__name__, allowed="key: value pairs").at(str(path))]
        )
    return train_config_from(data, overrides)


def train_config_from(data: dict, overrides: Sequence[str] = ()) -> TrainConfig:
    """A checked TrainConfig from a mapping of YAML sections (changed in place by ``overrides``)."""
    errors: list[Problem] = []
    for assignment in overrides:
        _apply_override(data, assignment, errors)
    config = parse(TrainConfig, data, errors)
    if errors or config is None:
        raise ConfigError(errors)
    return config


SCHEMA_FILE = "training/configs/moe-train.schema.json"
"""Where the JSON Schema of a trainer profile ships, for editors (``make docs`` writes it)."""


def train_config_schema() -> dict:
    """The JSON Schema of a trainer profile (before ``--set`` overrides)."""
    return json_schema(TrainConfig, title="moe-train profile")


def trainer_parser() -> argparse.ArgumentParser:
    """``moe-train``'s command line. The job renderers parse a job's trainer arguments with it too, so a
    flag they check is the flag the trainer reads."""
    parser = argparse.ArgumentParser(
        prog="moe-train",
        description="Train a Megatron-core MoE model.",
        epilog="moe-train plot METRICS.jsonl draws a run's loss and expert load as a PNG (moe-train plot --help).",
    )
    parser.add_argument("--config", required=True, help="YAML file, e.g. training/configs/tiny.yaml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one configuration value (repeatable)",
    )
    parser.add_argument("--max-steps", type=int, help="same as --set max_steps=N")
    parser.add_argument("--checkpoint-dir", help="same as --set checkpoint.dir=DIR")
    parser.add_argument("--save-interval", type=int, help="same as --set checkpoint.save_interval=N")
    parser.add_argument("--metrics-file", help="same as --set metrics.file=FILE")
    parser.add_argument(
        "--profile-steps",
        metavar="A:B",
        help="record a profiler timeline of steps A to B (or one step A) on each rank; same as --set "
        "profile.first_step=A --set profile.last_step=B",
    )
    parser.add_argument(
        "--profile-ranks",
        metavar="R,R",
        help="the ranks that record (comma-separated); same as --set profile.ranks=[R,R] (default: every rank)",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="start N ranks on this machine and exit with their code (without a launcher; default 1)",
    )
    return parser


def without_nproc_per_node(argv: list[str]) -> list[str]:
    """``argv`` less ``--nproc-per-node N`` (or ``=N``): what each rank that option starts is given."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            kept.append(arg)
    return kept


def trainer_overrides(args: argparse.Namespace) -> list[str]:
    """The --set assignments of parsed ``trainer_parser`` arguments, with the shortcut flags appended (they win)."""
    shortcuts = {
        "max_steps": args.max_steps,
        "checkpoint.dir": args.checkpoint_dir,
        "checkpoint.save_interval": args.save_interval,
        "metrics.file": args.metrics_file,
    }
    return [
        *args.set,
        *(f"{key}={value}" for key, value in shortcuts.items() if value is not None),
        *_profile_overrides(args),
    ]


_WHOLE = re.compile(r"\s*\d+\s*", re.ASCII)


def _profile_overrides(args: argparse.Namespace) -> list[str]:
    """``--profile-steps A:B`` and ``--profile-ranks R,R`` as assignments; raises ``ConfigError`` naming the
    option for a value that is not one. (Through ``profile.first_step``/``last_step`` integers, not a string:
    YAML 1.1 reads an unquoted ``5:7`` as the base-60 integer 307.)"""
    errors, assignments = [], []
    if args.profile_steps is not None:
        first, sep, last = args.profile_steps.partition(":")
        steps = (first, last) if sep else (first, first)
        if all(_WHOLE.fullmatch(part) for part in steps) and 1 <= int(steps[0]) <= int(steps[1]):
            assignments += [f"profile.first_step={int(steps[0])}", f"profile.last_step={int(steps[1])}"]
        else:
            errors.append(
                problem(
                    "not a step range",
                    got=args.profile_steps,
                    allowed="A:B with whole steps 1 <= A <= B, e.g. 5:7, or one step A",
                ).at("--profile-steps")
            )
    if args.profile_ranks is not None:
        ranks = args.profile_ranks.split(",")
        if all(_WHOLE.fullmatch(rank) for rank in ranks):
            assignments.append(f"profile.ranks=[{','.join(str(int(rank)) for rank in ranks)}]")
        else:
            errors.append(
                problem("not a list of ranks", got=args.profile_ranks, allowed="ranks 0 or more, e.g. 0 or 0,3").at(
                    "--profile-ranks"
                )
            )
    if errors:
        raise ConfigError(errors)
    return assignments
