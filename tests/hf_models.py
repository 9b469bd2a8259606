"""Tiny random Hugging Face MoE models (2 layers) built with transformers, saved with a tokenizer.json."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "training/configs/tiny-corpus.txt"
VOCAB_SIZE = 300
"""config.json's vocab_size: more than the tokenizer's 256 rows, as published checkpoints have."""

_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    # Heads of 32: vLLM's CPU attention has no kernel for 16 ("Unsupported CPU attention configuration: head_dim=16"),
    # and tests/training/test_hf_checkpoint.py serves the trained exports with it.
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
)


def configs() -> dict:
    from transformers import DeepseekV3Config, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    return {
        "mixtral": MixtralConfig(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, **_COMMON),
        # head_dim 32 is not hidden / heads (16), as in Qwen3-30B-A3B (128 at 2048 / 32).
        "qwen3_moe": Qwen3MoeConfig(
            moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2, head_dim=32, norm_topk_prob=True, **_COMMON
        ),
        "qwen2_moe": Qwen2MoeConfig(
            moe_intermediate_size=48,
            shared_expert_intermediate_size=80,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            **_COMMON,
        ),
        # A dense first layer, then an MoE one. Multi-latent attention with a query latent, query/key
        # heads (16 + 8 rotated) wider than the value heads (12); 8 experts in 4 groups, the best 2
        # groups used, top-4, scaled by 2.5, and 2 shared experts.
        "deepseek_v3": DeepseekV3Config(
            moe_intermediate_size=32,
            n_routed_experts=8,
            n_shared_experts=2,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            q_lora_rank=24,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=12,
            intermediate_size=128,
            **(_COMMON | {"num_key_value_heads": 4}),
        ),
    }


def _tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer.json trained on the bundled corpus, with Qwen's end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train([str(CORPUS)], trainer)
    tokenizer.save(str(out / "tokenizer.json"))


def save(family: str, out: Path, seed: int = 0) -> Path:
    """A random ``family`` model saved as save_pretrained writes it (fp32 safetensors), with a tokenizer."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs()[family], torch_dtype=torch.float32)
    # Norm weights start at 1 and routers and DeepSeek's score correction at 0, which would test
    # nothing there: randomise every tensor the checkpoint holds (parameters and persistent buffers).
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if name.endswith("e_score_correction_bias"):
                # Non-negative, with small router weights below (sigmoid scores near 0.5): transformers
                # masks the groups a token does not choose with 0 (DeepseekV3TopkRouter.get_topk_indices)
                # and megatron with -inf, so the two choose alike only while every biased score is
                # positive, also after training has moved the bias.
                tensor.copy_(torch.rand_like(tensor) * 0.1)
            elif name.endswith("mlp.gate.weight") and "deepseek" in type(model).__name__.lower():
                tensor.copy_(torch.randn_like(tensor) * 0.02)
            elif tensor.is_floating_point():
                tensor.copy_(
                    torch.randn_like(tensor) * (0.2 if tensor.dim() > 1 else 0.5) + (1.0 if tensor.dim() == 1 else 0.0)
                )
    model.save_pretrained(out, safe_serialization=True)
    _tokenizer(out)
    return out
