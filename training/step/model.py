"""Our thin adapter over megatron-core: the TransformerConfig and the MoE GPTModel built from a TrainConfig."""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F

from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.training.config import (
    Dispatcher,
    RecomputeGranularity,
    RecomputeModule,
    RouterDtype,
    Spec,
    Toggle,
    TrainConfig,
)
from moe_cdk.training.step.sizes import padded_vocab_size, use_bf16


def _transformer_engine_importable() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def resolve_spec(config: TrainConfig, *, on_gpu: bool) -> Spec:
    """The layer spec the model is built with; raises ConfigError when the chosen one cannot work here."""
    requested, errors = config.model.spec, []
    have_te = on_gpu and _transformer_engine_importable()
    spec = (Spec.TRANSFORMER_ENGINE if have_te else Spec.LOCAL) if requested is Spec.AUTO else requested
    if spec is Spec.TRANSFORMER_ENGINE and not have_te:
        errors.append(
            problem(
                "Transformer Engine needs a GPU and the transformer_engine package",
                got=spec.value,
                allowed="local or auto",
            ).at("model.spec")
        )
    if spec in (Spec.LOCAL, Spec.NATIVE):
        if config.moe.permute_fusion is Toggle.ON:
            errors.append(
                problem(
                    "fused permutation is a Transformer Engine kernel",
                    got=True,
                    allowed=f"false under the {spec.value} spec",
                ).at("moe.permute_fusion")
            )
        if RecomputeModule.LAYERNORM in config.recompute.modules:
            # megatron's layernorm recompute wraps Transformer Engine's norm only.
            errors.append(
                problem(
                    "layernorm recompute needs the Transformer Engine spec",
                    got="layernorm",
                    allowed=f"core_attn, moe_act under the {spec.value} spec",
                ).at("recompute.modules")
            )
    if spec is Spec.NATIVE and config.moe.grouped_gemm is Toggle.ON:
        errors.append(
            problem(
                "the native spec runs its experts as torch's grouped GEMM itself",
                got=True,
                allowed="false under the native spec",
            ).at("moe.grouped_gemm")
        )
    if spec is Spec.LOCAL:
        if config.moe.grouped_gemm is Toggle.ON and not (on_gpu and importlib.util.find_spec("grouped_gemm")):
            # megatron/core/transformer/moe/experts.py (GroupedMLP) asserts the package is there.
            errors.append(
                problem(
                    "the local spec's grouped GEMM needs a GPU and the grouped_gemm package",
                    got=True,
                    allowed="false, or model.spec transformer_engine or native",
                ).at("moe.grouped_gemm")
            )
    if errors:
        raise ConfigError(errors)
    return spec


def _kernel_present(extension: str) -> bool:
    """Whether one of the compiled extensions Megatron-LM builds, and the megatron-core wheel does not ship, can load.

    - ``scaled_masked_softmax_cuda``: the local spec's FusedScaleMaskSoftmax imports it at its first bf16 forward
      when ``masked_softmax_fusion`` is on (seen failing without it on an H200, 2026-12-04);
    - ``fused_weight_gradient_mlp_cuda`` (Apex): megatron's own ColumnParallelLinear, the output layer under every
      spec, refuses ``gradient_accumulation_fusion`` without it (tensor_parallel/layers.py), and Megatron-LM's
      arguments turn the fusion off where it is missing.
    """
    return importlib.util.find_spec(extension) is not None


def _te_router_fusion_present() -> bool:
    """Whether Transformer Engine brings the fused top-k router (2.7 and later; the image's is 2.8), which megatron's
    router calls with ``moe_router_fusion`` (megatron/core/extensions/transformer_engine.py)."""
    from megatron.core.extensions.transformer_engine import fused_topk_with_score_function

    return fused_topk_with_score_function is not None


def _on(toggle: Toggle, spec: Spec) -> bool:
    """A speed option under ``spec``: ``auto`` is on under Transformer Engine only."""
    return spec is Spec.TRANSFORMER_ENGINE if toggle is Toggle.AUTO else toggle is Toggle.ON


def recompute_modules(config: TrainConfig, spec: Spec) -> list[str]:
    """What megatron recomputes under ``spec``: ``recompute.modules`` less ``core_attn`` outside the local spec.

    Only the local spec's attention builds the s x s scores that core-attention recompute drops; Transformer
    Engine's fused attention and the native spec's scaled_dot_product_attention hold none, so recomputing them
    would only repeat the attention in the backward (megatron warns as much under Transformer Engine,
    transformer_config.py). A profile can then name ``core_attn`` for the local spec and lose nothing elsewhere.
    """
    if config.recompute.granularity is not RecomputeGranularity.SELECTIVE:
        return []
    return [
        module.value
        for module in config.recompute.modules
        if spec is Spec.LOCAL or module is not RecomputeModule.CORE_ATTN
    ]


def transformer_config_kwargs(config: TrainConfig, *, on_gpu: bool, spec: Spec | None = None) -> dict:
    """Every TransformerConfig field moe-cdk sets, in one place, for ``spec`` (default: the one ``resolve_spec``
    picks).

    Under Transformer Engine it turns on the fusions megatron-core's MoE guide recommends for speed
    (megatron/core/transformer/moe/README.md, "Performance Best Practice"; Megatron-LM's
    examples/mixtral/train_mixtral_8x7b_distributed.sh): the grouped GEMM and the fused permutation (each
    ``auto`` in the profile), the fused weight-gradient accumulation into DDP's main gradients (where Apex's
    kernel is present, as Megatron-LM's arguments decide it), the fused
    RoPE (not under multi-latent attention, where megatron-core 0.16.1 fuses YaRN RoPE only), the fused
    bias-dropout-add and, from Transformer Engine 2.7, the fused router. On a GPU, shared experts run beside the
    all-to-all dispatch (``moe_shared_expert_overlap``, which megatron allows with the alltoall dispatcher only).
    """
    spec = resolve_spec(config, on_gpu=on_gpu) if spec is None else spec
    m, moe, p = config.model, config.moe, config.parallel
    te = spec is Spec.TRANSFORMER_ENGINE
    dtype = torch.bfloat16 if use_bf16(config, on_gpu=on_gpu) else torch.float32
    recomputed = recompute_modules(config, spec)
    return dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups or m.num_attention_heads,
        # Under multi-latent attention megatron's core attention sizes its output by kv_channels,
        # which is then the value heads' width.
        kv_channels=m.v_head_dim if m.multi_latent_attention else m.head_size,
        qk_layernorm=m.qk_layernorm,
        add_qkv_bias=m.qkv_bias,
        layernorm_epsilon=m.norm_epsilon,
        ffn_hidden_size=m.dense_ffn_hidden_size if m.dense_layers else m.ffn_hidden_size,
        moe_ffn_hidden_size=m.ffn_hidden_size,
        moe_layer_freq=[0] * m.dense_layers + [1] * (m.num_layers - m.dense_layers) if m.dense_layers else 1,
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
        virtual_pipeline_model_parallel_size=p.virtual_pipeline,
        # Under the interleaved schedule, point-to-point sends one by one, as Megatron-LM
        # configures it (batch_p2p_comm = not overlap_p2p_comm, overlap on with virtual
        # stages). Batched, with 2 pipeline stages the previous and next rank are the same
        # peer, and _batched_p2p_ops posts its sends and receives to it in an order that pairs
        # an activation with a gradient (pipeline_parallel/p2p_communication.py); _p2p_ops
        # orders them by rank parity and gives each direction its own group.
        batch_p2p_comm=p.virtual_pipeline is None,
        expert_model_parallel_size=p.expert,
        expert_tensor_parallel_size=p.expert_tensor_size,
        sequence_parallel=p.sequence_parallel,
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.top_k,
        moe_router_load_balancing_type="aux_loss" if moe.aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=moe.aux_loss_coeff,
        moe_z_loss_coeff=moe.z_loss_coeff or None,
        moe_expert_capacity_factor=moe.capacity_factor,
        moe_token_dispatcher_type=moe.token_dispatcher.value,
        moe_grouped_gemm=_on(moe.grouped_gemm, spec),
        moe_permute_fusion=_on(moe.permute_fusion, spec),
        moe_router_dtype=None if moe.router_dtype is RouterDtype.DEFAULT else moe.router_dtype.value,
        moe_router_score_function=moe.score_function.value,
        moe_router_pre_softmax=not moe.normalize_top_k,
        moe_router_enable_expert_bias=moe.expert_bias,
        moe_router_bias_update_rate=moe.bias_update_rate,
        moe_shared_expert_intermediate_size=moe.shared_expert_ffn_hidden_size,
        moe_shared_expert_gate=moe.shared_expert_gate,
        moe_router_fusion=te and _te_router_fusion_present(),
        moe_shared_expert_overlap=on_gpu
        and moe.shared_expert_ffn_hidden_size is not None
        and moe.token_dispatcher is Dispatcher.ALLTOALL,
        moe_router_num_groups=moe.num_groups,
        moe_router_group_topk=moe.group_top_k,
        moe_router_topk_scaling_factor=moe.top_k_scaling_factor,
        # megatron's mixed precision: parameters and compute in bf16, fp32 main weights in the optimizer.
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype is torch.bfloat16,
        recompute_granularity="selective" if recomputed else None,
        recompute_modules=recomputed or ["core_attn"],  # megatron's default, unread without selective
        use_cpu_initialization=not on_gpu,
        gradient_accumulation_fusion=te and _kernel_present("fused_weight_gradient_mlp_cuda"),
        bias_dropout_fusion=te,
        apply_rope_fusion=te and not m.multi_latent_attention,
        masked_softmax_fusion=on_gpu and _kernel_present("scaled_masked_softmax_cuda"),
        persist_layer_norm=False,
        # No CUDA graphs. megatron-core 0.16's default scope, "full", is its deprecated spelling of the
        # whole layer and warns at every construction; the empty list is the same scope.
        cuda_graph_scope=[],
        **(_mla_kwargs(m) if m.multi_latent_attention else {}),
    )


def _mla_kwargs(m) -> dict:
    """MLATransformerConfig's fields: DeepSeek's latent widths, and plain RoPE on the rotated part
    (DeepSeek pre-trains at 4K without YaRN, which extends the context afterwards)."""
    return dict(
        multi_latent_attention=True,
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_head_dim,
        qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
        v_head_dim=m.v_head_dim,
        rope_type="rope",
        rotary_base=m.rotary_base,
    )


def build_transformer_config(config: TrainConfig, *, on_gpu: bool, spec: Spec | None = None):
    """megatron-core's TransformerConfig for ``config``.

    Raises ConfigError when megatron rejects the configuration (its ``__post_init__``
    validates) or changes any value we set; a silently different model is worse than a
    clear error.
    """
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kwargs = transformer_config_kwargs(config, on_gpu=on_gpu, spec=spec)
    try:
        built = (MLATransformerConfig if config.model.multi_latent_attention else TransformerConfig)(**kwargs)
    except (ValueError, AssertionError, TypeError) as error:
        raise ConfigError(
            [
                problem(
                    "TransformerConfig rejects this configuration",
                    got=str(error) or type(error).__name__,
                    allowed="a layout and model megatron-core supports",
                ).at("megatron-core")
            ]
        ) from None
    changed = {k: (v, getattr(built, k)) for k, v in kwargs.items() if getattr(built, k) != v}
    if changed:
        raise ConfigError(
            [
                problem(
                    "TransformerConfig changed values moe-cdk set",
                    got=", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()),
                    allowed="a configuration megatron-core keeps as given",
                ).at("megatron-core")
            ]
        )
    return built


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm for the local spec, marked for sequence parallelism.

    megatron's ``WrappedTorchNorm`` (megatron/core/transformer/torch_norm.py) refuses
    sequence parallelism only because it does not mark its weight; an RMSNorm is per token,
    so a sequence shard normalises exactly as the whole sequence does. Marking the weight
    ``sequence_parallel`` makes ``finalize_model_grads`` sum its gradient over the
    tensor-parallel group, as it does for Transformer Engine's norm.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **unused) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel


def _layer_spec(config: TrainConfig, spec: Spec, *, experts: bool = True):
    """One layer's spec: an MoE layer, or with ``experts=False`` a dense one (``model.dense_layers``)."""
    from megatron.core.models.gpt import gpt_layer_specs

    moe = config.moe
    num_experts = moe.num_experts if experts else None
    # qk_layernorm lives in the spec as well as in TransformerConfig: without it here the spec
    # builds no query and key norms (IdentityOp) whatever the config says.
    qk_layernorm, mla = config.model.qk_layernorm, config.model.multi_latent_attention
    if spec is Spec.TRANSFORMER_ENGINE:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts,
            moe_grouped_gemm=_on(moe.grouped_gemm, spec),
            qk_layernorm=qk_layernorm,
            multi_latent_attention=mla,
        )
    layer = gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=num_experts,
        moe_grouped_gemm=_on(moe.grouped_gemm, spec),
        normalization="RMSNorm",
        qk_layernorm=qk_layernorm,
        multi_latent_attention=mla,
    )
    layer.submodules.input_layernorm = SequenceParallelRMSNorm
    layer.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    if spec is Spec.NATIVE:
        from moe_cdk.training.step.native import NativeCoreAttention, NativeExperts

        layer.submodules.self_attention.submodules.core_attention = NativeCoreAttention
        if experts:
            layer.submodules.mlp.submodules.experts.module = NativeExperts
    if mla:
        attention = layer.submodules.self_attention.submodules
        if spec is Spec.LOCAL:
            attention.core_attention = _latent_core_attention()
        if qk_layernorm:
            # The query and key/value latents' norms (MLASelfAttention builds them with the latent widths).
            attention.q_layernorm = attention.kv_layernorm = SequenceParallelRMSNorm
    elif qk_layernorm:
        # Per-head norms whose weight every head shares: under tensor parallelism each rank holds
        # some heads, and finalize_model_grads sums the gradients of parameters named q_layernorm
        # or k_layernorm over the group (distributed/finalize_model_grads.py). WrappedTorchNorm,
        # the local spec's own, refuses sequence parallelism.
        attention = layer.submodules.self_attention.submodules
        attention.q_layernorm = attention.k_layernorm = SequenceParallelRMSNorm
    return layer


@functools.cache
def _latent_core_attention():
    """megatron's local core attention, as multi-latent attention builds it.

    megatron-core 0.16.1's local spec for MLA uses ``DotProductAttention``, but
    ``MLASelfAttention`` builds it with ``k_channels`` and ``v_channels`` (the query/key and the
    value head widths, which differ), keywords only Transformer Engine's attention takes, so the
    build fails with a TypeError. DotProductAttention's arithmetic already follows the tensors'
    own widths: its scores use the ``softmax_scale`` MLA passes (1/sqrt of the query head width),
    and its output is sized by ``kv_channels``, which ``transformer_config_kwargs`` sets to the
    value width. So this subclass only accepts the two keywords.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class LatentDotProductAttention(DotProductAttention):
        def __init__(self, config, *args, k_channels: int | None = None, v_channels: int | None = None, **kwargs):
            assert v_channels in (None, config.kv_channels), (v_channels, config.kv_channels)
            super().__init__(config, *args, **kwargs)

    return LatentDotProductAttention


def build_model(config: TrainConfig, vocab_size: int, *, on_gpu: bool) -> list[torch.nn.Module]:
    """This rank's model chunks (one per virtual pipeline stage, else one): the MoE GPTModel's
    layers of this pipeline stage. Raises ConfigError when megatron rejects the configuration."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    spec = resolve_spec(config, on_gpu=on_gpu)
    transformer_config = build_transformer_config(config, on_gpu=on_gpu, spec=spec)
    layer = _layer_spec(config, spec)
    dense = config.model.dense_layers
    dense_layer = _layer_spec(config, spec, experts=False) if dense else None
    chunks = []
    vpp = config.parallel.virtual_pipeline
    for vp_stage in range(vpp) if vpp else [None]:
        block = layer
        if spec is not Spec.TRANSFORMER_ENGINE:
            # This stage's layers by their global index: the first model.dense_layers are dense.
            offset = get_transformer_layer_offset(transformer_config, vp_stage=vp_stage)
            count = get_num_layers_to_build(transformer_config, vp_stage=vp_stage)
            block = TransformerBlockSubmodules(
                layer_specs=[dense_layer if offset + i < dense else layer for i in range(count)],
                layer_norm=SequenceParallelRMSNorm,
            )
        elif dense:
            # megatron's own block spec reads moe_layer_freq, the norms and attention from the config.
            block = get_gpt_decoder_block_spec(transformer_config, use_transformer_engine=True, vp_stage=vp_stage)
        model = GPTModel(
            config=transformer_config,
            transformer_layer_spec=block,
            vocab_size=padded_vocab_size(vocab_size),
            max_sequence_length=config.model.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope",
            rotary_base=config.model.rotary_base,
            vp_stage=vp_stage,
        )
        _mark_expert_parameters(model)
        chunks.append(model.cuda() if on_gpu else model)
    return chunks


def _mark_expert_parameters(model) -> None:
    """Mark every expert weight as megatron marks it under expert parallelism
    (``allreduce = False``), whatever the expert-parallel size.

    megatron marks them only when ``parallel.expert`` > 1 (tensor_parallel/layers.py,
    moe/experts.py), and the mark decides how the optimizer is built: one optimizer for every
    parameter without it, a ChainedOptimizer of a dense and an expert one with it. The saved
    optimizer state follows that structure, so a checkpoint from ``parallel.expert`` 1 would
    not load under 2 and back. With the mark, the experts' gradients go to DDP's expert
    buffers, reduced over the expert-data-parallel group with the same 1/DP scaling; with
    expert parallel 1 that group is the data-parallel group, so the arithmetic is unchanged
    (the layout-equivalence suite checks it).
    """
    for name, param in model.named_parameters():
        if ".mlp.experts." in name:
            param.allreduce = False
