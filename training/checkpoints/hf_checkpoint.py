"""Hugging Face MoE checkpoints and moe-train's megatron model, mapped onto each other.

One table (``links``) names, for every parameter of the megatron model, the Hugging Face
tensors it is made of and how: copied, vocabulary-padded, query/key/value interleaved per
group, or gate and up projections stacked. Import reads the table one way and export the
other, so the two directions cannot drift apart, and both check that every tensor on each
side is used exactly once.

Families, with the Hugging Face modelling code they were checked against (transformers
4.57, ``models/<family>/modeling_<family>.py``):

- ``mixtral`` (MixtralForCausalLM): ``block_sparse_moe.experts.N.w1/w3/w2``, softmax over
  the chosen top-k (routing weights renormalised).
- ``qwen3_moe`` (Qwen3MoeForCausalLM): per-head RMSNorm on queries and keys (``q_norm``,
  ``k_norm``), ``head_dim`` independent of the width, ``norm_topk_prob``.
- ``qwen2_moe`` (Qwen2MoeForCausalLM): query/key/value biases, a shared expert whose output
  a sigmoid gate scales, ``norm_topk_prob`` (false in the published models).
- ``deepseek_v3`` (DeepseekV3ForCausalLM): multi-latent attention (``kv_a_proj_with_mqa``,
  ``kv_b_proj``, the latents' norms, an optional query latent), sigmoid routing with the
  ``e_score_correction_bias`` that megatron keeps as the router's ``expert_bias`` buffer,
  group-limited choice, a scaling factor and ungated shared experts.

  Its first ``first_k_dense_replace`` layers are dense (``model.dense_layers``).

Not handled, each refused by name: sliding-window attention, RoPE scaling (DeepSeek-V3's
published YaRN among it), tied embeddings, Qwen's dense layers (``mlp_only_layers``,
``decoder_sparse_step``), multi-token-prediction layers, router jitter, and any other
``model_type``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping

import torch

from moe_cdk.core.problems import ConfigError, Problem, problem


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str
    moe_module: str
    """The layer's MoE module: ``block_sparse_moe`` (Mixtral) or ``mlp`` (Qwen)."""
    expert_projections: tuple[str, str, str]
    """An expert's gate, up and down projection names."""
    num_experts_key: str
    expert_ffn_key: str
    shared_expert: str | None = None
    """The shared expert's module, when the family has one."""
    required: tuple[str, ...] = ()
    """config.json sizes this family needs beyond the ones every family does."""


_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
FAMILIES = {
    f.model_type: f
    for f in (
        Family(
            "mixtral",
            "MixtralForCausalLM",
            "block_sparse_moe",
            ("w1", "w3", "w2"),
            "num_local_experts",
            "intermediate_size",
        ),
        Family("qwen3_moe", "Qwen3MoeForCausalLM", "mlp", _PROJECTIONS, "num_experts", "moe_intermediate_size"),
        Family(
            "qwen2_moe",
            "Qwen2MoeForCausalLM",
            "mlp",
            _PROJECTIONS,
            "num_experts",
            "moe_intermediate_size",
            "shared_expert",
            ("shared_expert_intermediate_size",),
        ),
        Family(
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            "mlp",
            _PROJECTIONS,
            "n_routed_experts",
            "moe_intermediate_size",
            "shared_experts",
            ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
        ),
    )
}


def family_of(hf_config: Mapping) -> Family:
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(
            [
                problem("not a family moe-checkpoint converts", got=model_type, allowed=", ".join(FAMILIES)).at(
                    "config.json: model_type"
                )
            ]
        )
    return FAMILIES[model_type]


# -- configurations ------------------------------------------------------------------------

_IMPORTED_SEQ_LENGTH = 4096
"""Tokens per sample in an imported profile, or the model's own maximum when that is shorter."""


def _refusals(hf: Mapping, family: Family) -> Iterable[Problem]:
    """Why a configuration's model is not one moe-train builds, one line per reason."""

    def refuse(key: str, what: str, allowed: str) -> Problem:
        return problem(what, got=hf.get(key), allowed=allowed).at(f"config.json: {key}")

    if hf.get("hidden_act", "silu") != "silu":
        yield refuse("hidden_act", "moe-train's experts are SwiGLU", "silu")
    if hf.get("tie_word_embeddings", False):
        yield refuse("tie_word_embeddings", "moe-train keeps separate input and output embeddings", "false")
    if hf.get("rope_scaling"):
        yield refuse("rope_scaling", "moe-train's rotary embedding is unscaled", "null")
    sliding = hf.get("use_sliding_window", family.model_type == "mixtral") and hf.get("sliding_window")
    if sliding and sliding < (hf.get("max_position_embeddings") or 0):
        yield refuse("sliding_window", "moe-train's attention is full, not sliding-window", "null")
    if hf.get("router_jitter_noise", 0.0):
        yield refuse("router_jitter_noise", "moe-train's router adds no jitter", "0")
    if hf.get("attention_bias", False):
        yield refuse("attention_bias", "moe-train's output projection has no bias", "false")
    if hf.get("mlp_only_layers") or hf.get("decoder_sparse_step", 1) != 1:
        yield refuse(
            "mlp_only_layers" if hf.get("mlp_only_layers") else "decoder_sparse_step",
            "every moe-train layer is an MoE layer",
            "[] and decoder_sparse_step 1",
        )
    if family.model_type == "deepseek_v3":
        yield from _deepseek_refusals(hf, refuse)
    theta = hf.get("rope_theta", 10000.0)
    if not isinstance(theta, int | float) or not float(theta).is_integer():
        yield refuse("rope_theta", "moe-train's rotary base is a whole number", "an integer")
    dense_ffn = ("intermediate_size",) if family.model_type == "deepseek_v3" and hf.get("first_k_dense_replace") else ()
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        family.num_experts_key,
        family.expert_ffn_key,
        "num_experts_per_tok",
        *family.required,
        *dense_ffn,
    ):
        if not isinstance(hf.get(key), int):
            yield refuse(key, "a required size is missing", "a positive integer")


def _deepseek_refusals(hf: Mapping, refuse) -> Iterable[str]:
    if not 0 <= (hf.get("first_k_dense_replace") or 0) < (hf.get("num_hidden_layers") or 1):
        yield refuse("first_k_dense_replace", "needs at least one MoE layer", "0 to num_hidden_layers - 1")
    if not hf.get("rope_interleave", True):
        # megatron's MLA always takes the rotated part as interleaved pairs (rope_utils.py,
        # multi_latent_attention), the layout of DeepSeek's own checkpoints.
        yield refuse("rope_interleave", "megatron's multi-latent attention rotates interleaved pairs", "true")
    top_k, groups, chosen = hf.get("num_experts_per_tok") or 0, hf.get("n_group") or 1, hf.get("topk_group") or 1
    if not hf.get("norm_topk_prob", True) and top_k > 1:
        yield refuse("norm_topk_prob", "megatron renormalises sigmoid weights over the top-k", "true")
    if groups > 1 and (not chosen or top_k % chosen or top_k // chosen != 2):
        # transformers scores a group by its best 2 experts (DeepseekV3TopkRouter); megatron by its
        # best top_k / group_top_k (moe_utils.group_limited_topk).
        yield refuse(
            "topk_group",
            "a group's score must be its best 2 experts, as transformers computes it",
            f"num_experts_per_tok / 2 ({top_k / 2:g})",
        )


def profile_sections(hf: Mapping) -> dict:
    """The ``model`` and ``moe`` sections of a moe-train profile for this Hugging Face configuration."""
    family = family_of(hf)
    refusals = list(_refusals(hf, family))
    if refusals:
        raise ConfigError(refusals)
    heads = hf["num_attention_heads"]
    model = {
        "num_layers": hf["num_hidden_layers"],
        "hidden_size": hf["hidden_size"],
        "num_attention_heads": heads,
        **(
            _deepseek_model(hf)
            if family.model_type == "deepseek_v3"
            else {
                "num_query_groups": hf.get("num_key_value_heads") or heads,
                "kv_channels": hf.get("head_dim") or hf["hidden_size"] // heads,
                "qk_layernorm": family.model_type == "qwen3_moe",
                "qkv_bias": family.model_type == "qwen2_moe" and bool(hf.get("qkv_bias", True)),
            }
        ),
        "ffn_hidden_size": hf[family.expert_ffn_key],
        "seq_length": min(hf.get("max_position_embeddings") or _IMPORTED_SEQ_LENGTH, _IMPORTED_SEQ_LENGTH),
        "rotary_base": int(hf.get("rope_theta", 10000)),
        "norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
        "init_method_std": float(hf.get("initializer_range", 0.02)),
        "vocab_size": hf["vocab_size"],
        # The checkpoint's tensor names are those of megatron's local layer spec (Transformer
        # Engine's fuse the norms into the linears and name them otherwise).
        "spec": "local",
    }
    moe = {
        "num_experts": hf[family.num_experts_key],
        "top_k": hf["num_experts_per_tok"],
        "aux_loss_coeff": float(hf.get("router_aux_loss_coef", 0.0)),
        "z_loss_coeff": 0.0,
        "capacity_factor": None,
        "score_function": "softmax",
        "normalize_top_k": family.model_type == "mixtral" or bool(hf.get("norm_topk_prob", False)),
    }
    if family.model_type == "qwen2_moe":
        moe["shared_expert_ffn_hidden_size"] = hf["shared_expert_intermediate_size"]
        moe["shared_expert_gate"] = True
    if family.model_type == "deepseek_v3":
        moe.update(_deepseek_router(hf))
    return {"model": model, "moe": moe}


def _deepseek_model(hf: Mapping) -> dict:
    """DeepSeek-V3's attention and layers: multi-latent attention, and its dense first layers."""
    dense = hf.get("first_k_dense_replace") or 0
    return {
        **({"dense_layers": dense, "dense_ffn_hidden_size": hf["intermediate_size"]} if dense else {}),
        "multi_latent_attention": True,
        "q_lora_rank": hf.get("q_lora_rank"),
        "kv_lora_rank": hf["kv_lora_rank"],
        "qk_head_dim": hf["qk_nope_head_dim"],
        "qk_pos_emb_head_dim": hf["qk_rope_head_dim"],
        "v_head_dim": hf["v_head_dim"],
        "qk_layernorm": True,
    }


def _deepseek_router(hf: Mapping) -> dict:
    """DeepSeek-V3's aux-loss-free routing: sigmoid scores, the correction bias, groups, scaling."""
    groups = hf.get("n_group") or 1
    shared = hf.get("n_shared_experts") or 0
    return {
        "score_function": "sigmoid",
        "expert_bias": True,
        "aux_loss_coeff": 0.0,
        "normalize_top_k": True,
        "shared_expert_ffn_hidden_size": shared * hf["moe_intermediate_size"] if shared else None,
        "num_groups": groups if groups > 1 else None,
        "group_top_k": hf.get("topk_group") if groups > 1 else None,
        "top_k_scaling_factor": float(hf["routed_scaling_factor"])
        if hf.get("routed_scaling_factor", 1.0) != 1.0
        else None,
    }


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes an export writes, by config.json's ``torch_dtype`` name."""
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


_TRAINING_ONLY = {
    "seq_length",
    "spec",
    "dropout",
    "init_method_std",
    "vocab_size",
    "aux_loss_coeff",
    "z_loss_coeff",
    "capacity_factor",
    "bias_update_rate",
    "token_dispatcher",
    "grouped_gemm",
    "permute_fusion",
    "router_dtype",
}
"""Profile keys a config.json does not hold: how a run trains, not what the model is."""


def hf_config(config, family: Family, vocab_size: int, dtype: torch.dtype, base: Mapping | None = None) -> dict:
    """``config.json`` for a moe-train ``config`` in ``family``'s format: ``base`` (the imported
    model's own file, for token ids and everything moe-train does not model) with every size
    and option taken from ``config``.

    The file is checked by reading it back: ``profile_sections`` of it must give the profile's
    own value for every key that describes the model, so a profile the family cannot express
    (sigmoid routing written as Mixtral, a shared expert written as Qwen3) is an error naming
    the key, not a file that loads into a different model."""
    m, moe = config.model, config.moe
    out = {k: v for k, v in (base or {}).items() if k not in ("torch_dtype", "dtype", "transformers_version")}
    out.update(
        {
            "architectures": [family.architecture],
            "model_type": family.model_type,
            "hidden_size": m.hidden_size,
            "num_hidden_layers": m.num_layers,
            "num_attention_heads": m.num_attention_heads,
            family.expert_ffn_key: m.ffn_hidden_size,
            family.num_experts_key: moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            "rms_norm_eps": m.norm_epsilon,
            "rope_theta": float(m.rotary_base),
            "vocab_size": vocab_size,
            "initializer_range": m.init_method_std,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": _DTYPE_NAMES[dtype],
        }
    )
    out.setdefault("max_position_embeddings", m.seq_length)
    if family.model_type == "deepseek_v3":
        shared = moe.shared_expert_ffn_hidden_size or 0
        out.update(
            {
                "q_lora_rank": m.q_lora_rank,
                "kv_lora_rank": m.kv_lora_rank,
                "qk_nope_head_dim": m.qk_head_dim,
                "qk_rope_head_dim": m.qk_pos_emb_head_dim,
                "v_head_dim": m.v_head_dim,
                # DeepseekV3Config's head_dim is the rotated width, the rotary embedding's.
                "head_dim": m.qk_pos_emb_head_dim,
                "num_key_value_heads": m.num_attention_heads,
                "n_shared_experts": shared // m.ffn_hidden_size,
                "n_group": moe.num_groups or 1,
                "topk_group": moe.group_top_k or 1,
                "routed_scaling_factor": moe.top_k_scaling_factor or 1.0,
                "norm_topk_prob": True,
                "first_k_dense_replace": m.dense_layers,
                "rope_interleave": True,
                # DeepSeek-V3's own config.json names its router so (deepseek-ai/DeepSeek-V3): sigmoid scores with
                # the correction bias. transformers routes so regardless; vLLM builds the bias only for noaux_tc
                # (without it, loading stops at "KeyError: 'layers.1.mlp.gate.e_score_correction_bias'").
                "topk_method": "noaux_tc",
                "scoring_func": "sigmoid",
            }
        )
        if m.dense_layers:
            out["intermediate_size"] = m.dense_ffn_hidden_size
    else:
        out.update(
            {
                "num_key_value_heads": m.num_query_groups or m.num_attention_heads,
                "head_dim": m.head_size,
                "router_aux_loss_coef": moe.aux_loss_coeff,
            }
        )
    if family.model_type in ("qwen3_moe", "qwen2_moe"):
        out.update({"norm_topk_prob": moe.normalize_top_k, "decoder_sparse_step": 1, "mlp_only_layers": []})
    if family.model_type == "qwen2_moe":
        out.update({"shared_expert_intermediate_size": moe.shared_expert_ffn_hidden_size, "qkv_bias": m.qkv_bias})
    problems = []
    for section_name, implied in profile_sections(out).items():
        section = getattr(config, section_name)
        for field in dataclasses.fields(section):
            if field.name in _TRAINING_ONLY:
                continue
            ours, theirs = _plain(getattr(section, field.name)), implied.get(field.name, _plain(field.default))
            if field.name == "kv_channels":
                ours = m.head_size if not m.multi_latent_attention else ours
            if field.name == "num_query_groups" and not m.multi_latent_attention:
                ours = ours or m.num_attention_heads
            if ours != theirs:
                problems.append(
                    problem(f"a {family.model_type} config.json cannot hold this", got=ours, allowed=theirs).at(
                        f"{section_name}.{field.name}"
                    )
                )
    if problems:
        raise ConfigError(problems)
    return out


def _plain(value):
    return value.value if isinstance(value, enum.Enum) else value


# -- tensors -------------------------------------------------------------------------------


class Kind(enum.Enum):
    COPY = "copy"
    VOCAB = "vocab"
    """One table, padded with zero rows to the model's padded vocabulary (truncated on export)."""
    QKV = "qkv"
    """q, k, v projections (weights or biases) interleaved per query group, as megatron's linear_qkv holds them."""
    GLU = "glu"
    """Gate and up projections stacked, as megatron's SwiGLU linear_fc1 holds them."""


@dataclasses.dataclass(frozen=True)
class Link:
    megatron: str
    hf: tuple[str, ...]
    kind: Kind


def links(config, family: Family) -> list[Link]:
    """Every megatron parameter (named as in a one-rank model) with the Hugging Face tensors it is made of."""
    m, moe = config.model, config.moe
    gate, up, down = family.expert_projections
    out = [
        Link("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), Kind.VOCAB),
        Link("output_layer.weight", ("lm_head.weight",), Kind.VOCAB),
        Link("decoder.final_layernorm.weight", ("model.norm.weight",), Kind.COPY),
    ]
    for i in range(m.num_layers):
        ours, theirs = f"decoder.layers.{i}.", f"model.layers.{i}."
        attention, attn = ours + "self_attention.", theirs + "self_attn."
        out += [
            Link(ours + "input_layernorm.weight", (theirs + "input_layernorm.weight",), Kind.COPY),
            Link(ours + "pre_mlp_layernorm.weight", (theirs + "post_attention_layernorm.weight",), Kind.COPY),
            Link(attention + "linear_proj.weight", (attn + "o_proj.weight",), Kind.COPY),
        ]
        out += _mla_links(m, attention, attn) if m.multi_latent_attention else _attention_links(m, attention, attn)
        if i < m.dense_layers:  # one dense SwiGLU MLP, no router or experts
            out += [
                Link(
                    ours + "mlp.linear_fc1.weight",
                    (theirs + "mlp.gate_proj.weight", theirs + "mlp.up_proj.weight"),
                    Kind.GLU,
                ),
                Link(ours + "mlp.linear_fc2.weight", (theirs + "mlp.down_proj.weight",), Kind.COPY),
            ]
            continue
        out.append(Link(ours + "mlp.router.weight", (f"{theirs}{family.moe_module}.gate.weight",), Kind.COPY))
        if moe.expert_bias:
            # megatron keeps the bias as a buffer that the checkpoint holds (router.py).
            out.append(
                Link(
                    ours + "mlp.router.expert_bias",
                    (f"{theirs}{family.moe_module}.gate.e_score_correction_bias",),
                    Kind.COPY,
                )
            )
        for e in range(moe.num_experts):
            expert, theirs_e = f"{ours}mlp.experts.local_experts.{e}.", f"{theirs}{family.moe_module}.experts.{e}."
            out += [
                Link(expert + "linear_fc1.weight", (f"{theirs_e}{gate}.weight", f"{theirs_e}{up}.weight"), Kind.GLU),
                Link(expert + "linear_fc2.weight", (f"{theirs_e}{down}.weight",), Kind.COPY),
            ]
        if moe.shared_expert_ffn_hidden_size is not None:
            shared, theirs_s = ours + "mlp.shared_experts.", f"{theirs}mlp.{family.shared_expert or 'shared_expert'}."
            out += [
                Link(
                    shared + "linear_fc1.weight", (theirs_s + "gate_proj.weight", theirs_s + "up_proj.weight"), Kind.GLU
                ),
                Link(shared + "linear_fc2.weight", (theirs_s + "down_proj.weight",), Kind.COPY),
            ]
            if moe.shared_expert_gate:
                out.append(Link(shared + "gate_weight", (theirs + "mlp.shared_expert_gate.weight",), Kind.COPY))
    return out


def _attention_links(m, attention: str, attn: str) -> list[Link]:
    out = [Link(attention + "linear_qkv.weight", tuple(f"{attn}{p}_proj.weight" for p in "qkv"), Kind.QKV)]
    if m.qkv_bias:
        out.append(Link(attention + "linear_qkv.bias", tuple(f"{attn}{p}_proj.bias" for p in "qkv"), Kind.QKV))
    if m.qk_layernorm:
        out += [
            Link(attention + "q_layernorm.weight", (attn + "q_norm.weight",), Kind.COPY),
            Link(attention + "k_layernorm.weight", (attn + "k_norm.weight",), Kind.COPY),
        ]
    return out


def _mla_links(m, attention: str, attn: str) -> list[Link]:
    """Multi-latent attention: the same matrices on both sides, row for row (both split the key/value
    down projection into latent then rotated key, and each head's rows into unrotated then rotated)."""
    pairs = [
        ("linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight"),
        ("linear_kv_up_proj.weight", "kv_b_proj.weight"),
    ]
    if m.q_lora_rank is None:
        pairs.append(("linear_q_proj.weight", "q_proj.weight"))
    else:
        pairs += [("linear_q_down_proj.weight", "q_a_proj.weight"), ("linear_q_up_proj.weight", "q_b_proj.weight")]
    if m.qk_layernorm:
        pairs.append(("kv_layernorm.weight", "kv_a_layernorm.weight"))
        if m.q_lora_rank is not None:
            pairs.append(("q_layernorm.weight", "q_a_layernorm.weight"))
    return [Link(attention + ours, (attn + theirs,), Kind.COPY) for ours, theirs in pairs]


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What the interleaving needs: query heads per group and the head width."""

    num_query_groups: int
    heads_per_group: int
    head_size: int
    padded_vocab: int
    vocab_size: int


def shapes_of(config, vocab_size: int) -> Shapes:
    from moe_cdk.training.step.sizes import padded_vocab_size

    m = config.model
    groups = m.num_query_groups or m.num_attention_heads
    return Shapes(groups, m.num_attention_heads // groups, m.head_size, padded_vocab_size(vocab_size), vocab_size)


def join(link: Link, tensors: list[torch.Tensor], shapes: Shapes) -> torch.Tensor:
    """The megatron tensor of ``link`` from its Hugging Face tensors."""
    if link.kind is Kind.COPY:
        return tensors[0]
    if link.kind is Kind.VOCAB:
        table = tensors[0]
        return torch.cat([table, table.new_zeros(shapes.padded_vocab - table.shape[0], *table.shape[1:])])
    if link.kind is Kind.GLU:
        return torch.cat(tensors)
    q, k, v = tensors
    g, d = shapes.num_query_groups, shapes.head_size
    rest = q.shape[1:]
    grouped = [q.reshape(g, shapes.heads_per_group * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)]
    return torch.cat(grouped, dim=1).reshape(-1, *rest)


def split(link: Link, tensor: torch.Tensor, shapes: Shapes) -> list[torch.Tensor]:
    """The Hugging Face tensors of ``link`` from its megatron tensor (contiguous copies)."""
    if link.kind is Kind.COPY:
        parts = [tensor]
    elif link.kind is Kind.VOCAB:
        parts = [tensor[: shapes.vocab_size]]
    elif link.kind is Kind.GLU:
        parts = list(torch.chunk(tensor, 2))
    else:
        g, d = shapes.num_query_groups, shapes.head_size
        rest = tensor.shape[1:]
        grouped = tensor.reshape(g, (shapes.heads_per_group + 2) * d, *rest)
        q, k, v = torch.split(grouped, [shapes.heads_per_group * d, d, d], dim=1)
        parts = [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]
    return [p.clone(memory_format=torch.contiguous_format) for p in parts]


def megatron_problems(table: list[Link], megatron_names: Iterable[str]) -> list[Problem]:
    """Problems when a megatron tensor has no link, or a link names one megatron did not build."""
    built, linked = set(megatron_names), {link.megatron for link in table}
    return [
        problem(
            "a megatron tensor moe-checkpoint does not map", got=name, allowed="the tensors of the families it converts"
        ).at(f"model: {name}")
        for name in sorted(built - linked)
    ] + [
        problem("mapped, but megatron did not build it", got=name, allowed="the tensors of this profile's model").at(
            f"model: {name}"
        )
        for name in sorted(linked - built)
    ]


def hf_problems(table: list[Link], hf_names: Iterable[str], *, where: str) -> list[Problem]:
    """Problems when a tensor the configuration implies is missing, or one it does not imply is there."""
    wanted, present = {name for link in table for name in link.hf}, set(hf_names)
    return [
        problem("missing from the checkpoint", got="absent", allowed="a tensor the configuration implies").at(
            f"{where}: {name}"
        )
        for name in sorted(wanted - present)
    ] + [
        problem(
            "a tensor the configuration does not account for",
            got=name,
            allowed="only the tensors of the model config.json describes",
        ).at(f"{where}: {name}")
        for name in sorted(present - wanted)
    ]
