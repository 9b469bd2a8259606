"""The shipped GPU profiles' speed options, checked by megatron-core's own TransformerConfig validation.

Transformer Engine cannot be installed here (no GPU, and its wheels are built against CUDA), so megatron's checks
that only ask whether a Transformer Engine kernel imports (fused permutation, fused RoPE, the fused router) are
answered with a stand-in function; every other check in TransformerConfig.__post_init__ is megatron's and runs.
"""

from __future__ import annotations

import importlib

import pytest
from conftest import ROOT

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.config import Spec, load_train_config
from moe_cdk.training.step import _megatron, model as model_module
from moe_cdk.training.step.model import build_transformer_config

GPU_PROFILES = ["moe-8x1b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3-style-16b"]
TE = Spec.TRANSFORMER_ENGINE
# Where megatron-core looks for Transformer Engine's kernels: module, names (absent or None without it).
TE_KERNELS = {
    "megatron.core.transformer.moe.moe_utils": [
        "fused_permute",
        "fused_permute_with_probs",
        "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs",
        "fused_unpermute",
    ],
    "megatron.core.models.common.embeddings.rope_utils": ["fused_apply_rotary_pos_emb"],
    "megatron.core.extensions.transformer_engine": ["fused_topk_with_score_function"],
}


def _kernel(*args, **kwargs):
    raise AssertionError("a stand-in for a Transformer Engine kernel ran")


@pytest.fixture
def te_kernels(monkeypatch):
    """Transformer Engine's kernels and Apex's weight-gradient kernel answer "importable"."""
    _megatron.import_core()
    for module, names in TE_KERNELS.items():
        for name in names:
            monkeypatch.setattr(importlib.import_module(module), name, _kernel, raising=False)
    monkeypatch.setattr(model_module, "_kernel_present", lambda extension: True)


def _profile(name: str, *overrides: str):
    return load_train_config(ROOT / f"training/configs/{name}.yaml", list(overrides))


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_megatron_accepts_every_speed_option_a_gpu_profile_gets_under_transformer_engine(te_kernels, name):
    config = _profile(name)
    built = build_transformer_config(config, on_gpu=True, spec=TE)
    assert built.moe_grouped_gemm and built.moe_permute_fusion and built.moe_router_fusion
    assert built.gradient_accumulation_fusion and built.bias_dropout_fusion
    assert built.apply_rope_fusion is not config.model.multi_latent_attention
    assert built.moe_shared_expert_overlap is (config.moe.shared_expert_ffn_hidden_size is not None)
    assert "core_attn" not in (built.recompute_modules if built.recompute_granularity else [])


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_the_local_spec_gets_no_transformer_engine_option_and_keeps_core_attention_recompute(name):
    built = build_transformer_config(_profile(name), on_gpu=True, spec=Spec.LOCAL)
    assert not (built.moe_grouped_gemm or built.moe_permute_fusion or built.moe_router_fusion)
    assert not (built.gradient_accumulation_fusion or built.bias_dropout_fusion or built.apply_rope_fusion)
    assert (built.recompute_granularity, built.recompute_modules) == ("selective", ["core_attn"])


def test_the_native_spec_recomputes_no_core_attention():
    built = build_transformer_config(_profile("mixtral-8x7b"), on_gpu=True, spec=Spec.NATIVE)
    assert built.recompute_granularity is None


def test_a_kernel_megatron_cannot_import_fails_with_its_message():
    # No stand-ins: the fused RoPE asked for under Transformer Engine, where its kernel is not importable.
    with pytest.raises(ConfigError, match=r"megatron-core: .*apply_rope_fusion is not available. Please install TE"):
        build_transformer_config(_profile("mixtral-8x7b"), on_gpu=True, spec=TE)


def test_megatrons_own_check_refuses_the_shared_expert_overlap_off_the_alltoall_dispatcher(te_kernels, monkeypatch):
    original = model_module.transformer_config_kwargs

    def allgather(config, on_gpu, spec):
        return {**original(config, on_gpu=on_gpu, spec=spec), "moe_token_dispatcher_type": "allgather"}

    monkeypatch.setattr(model_module, "transformer_config_kwargs", allgather)
    with pytest.raises(ConfigError, match="moe_shared_expert_overlap only works with alltoall token dispatcher"):
        build_transformer_config(_profile("deepseek-v3-style-16b"), on_gpu=True, spec=TE)
