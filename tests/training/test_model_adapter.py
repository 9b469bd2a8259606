"""Our adapter over megatron-core's TransformerConfig and the CPU compatibility layer, against the real megatron
code."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.config import load_train_config
from moe_cdk.training.step import cpu_compat, model as model_module
from moe_cdk.training.step.model import build_transformer_config, transformer_config_kwargs
from moe_cdk.training.step.sizes import parameter_counts

TINY = load_train_config(ROOT / "training/configs/tiny.yaml")


def test_transformer_config_keeps_every_value_we_set():
    built = build_transformer_config(TINY, on_gpu=False)
    for key, value in transformer_config_kwargs(TINY, on_gpu=False).items():
        assert getattr(built, key) == value, key


def test_a_value_megatron_would_rewrite_is_an_error(monkeypatch):
    original = model_module.transformer_config_kwargs
    # megatron fills num_query_groups in when it is None: the adapter must refuse that.
    monkeypatch.setattr(
        model_module,
        "transformer_config_kwargs",
        lambda config, on_gpu, spec: {**original(config, on_gpu=on_gpu, spec=spec), "num_query_groups": None},
    )
    with pytest.raises(
        ConfigError,
        match=r"megatron-core: TransformerConfig changed values moe-cdk set \(got 'num_query_groups: None -> 4'",
    ):
        build_transformer_config(TINY, on_gpu=False)


def test_moe_settings_reach_megatron():
    built = build_transformer_config(TINY, on_gpu=False)
    assert (built.num_moe_experts, built.moe_router_topk, built.moe_token_dispatcher_type) == (4, 2, "alltoall")
    assert (built.moe_aux_loss_coeff, built.moe_z_loss_coeff, built.moe_expert_capacity_factor) == (0.01, 0.001, None)


def test_active_parameters_count_top_k_of_the_experts():
    counts = parameter_counts(TINY, vocab_size=257)
    expert = 3 * 64 * 128
    assert counts.total - counts.active == 2 * (4 - 2) * expert


@pytest.mark.skipif(torch.cuda.is_available(), reason="the layer is only active without CUDA")
def test_cpu_rng_tracker_forks_and_restores_named_states():
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    assert cpu_compat.activate()
    tracker = get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("model-parallel-rng", 42)
    outer = torch.get_rng_state()
    with tracker.fork("model-parallel-rng"):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer)
    tracker.reset()
    tracker.add("model-parallel-rng", 42)
    with tracker.fork("model-parallel-rng"):
        assert torch.equal(torch.rand(3), first)


def test_te_general_gemm_is_bound_on_a_gpu_without_transformer_engine(monkeypatch):
    # moe_utils.py refers to te_general_gemm, which it defines only when Transformer Engine imports.
    from megatron.core.transformer.moe import moe_utils

    monkeypatch.delattr(moe_utils, "te_general_gemm", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_compat.activate() is False  # CUDA "present": no CPU shims
    assert moe_utils.te_general_gemm is None


def test_recompute_rng_state_is_the_cpu_generator_on_cpu():
    # tensor_parallel/random.py's CheckpointFunction saves and restores the "CUDA" generator.
    from megatron.core.tensor_parallel import random as mrandom

    assert cpu_compat.activate()
    state = mrandom._get_cuda_rng_state()
    first = torch.rand(3)
    mrandom._set_cuda_rng_state(state)
    assert torch.equal(torch.rand(3), first)


def test_tensor_cuda_is_the_tensor_itself_under_the_cpu_mode():
    # dist_checkpointing/exchange_utils.py moves each shard to "cuda" to broadcast it.
    tensor = torch.ones(2)
    with cpu_compat.cuda_factories_on_cpu():
        assert tensor.cuda() is tensor


def test_a_megatron_internal_gone_from_the_cpu_shims_is_left_alone_with_one_warning(monkeypatch, caplog):
    from megatron.core.optimizer import optimizer as moptimizer
    from megatron.core.transformer.moe import token_dispatcher

    from moe_cdk.training import compat

    cpu_compat.activate()  # the shims in place, as the rest of this file has them
    monkeypatch.delattr(token_dispatcher, "maybe_move_tensor_to_cpu")
    monkeypatch.setattr(moptimizer, "clip_grad_by_total_norm_fp32", "megatron's")
    monkeypatch.setattr(cpu_compat, "_active", False)
    monkeypatch.setattr(compat, "_warned", set())
    with caplog.at_level("WARNING", logger="moe_cdk.training.compat"):
        assert cpu_compat.activate()
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "moe_cdk.training.compat"]
    assert "megatron.core.transformer.moe.token_dispatcher.maybe_move_tensor_to_cpu: absent" in warning
    assert compat.versions() in warning
    assert not hasattr(token_dispatcher, "maybe_move_tensor_to_cpu")
    assert moptimizer.clip_grad_by_total_norm_fp32 is cpu_compat._clip_grad_by_total_norm_fp32_cpu


def test_gpu_attention_softmax_runs_without_megatrons_compiled_fused_kernel():
    """On a GPU the local spec's softmax must not ask for scaled_masked_softmax_cuda, which the
    megatron-core wheel does not ship: its check is the same on CPU, so a bf16 forward shows it."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import attention_mask_func

    softmax = FusedScaleMaskSoftmax(
        input_in_fp16=False,
        input_in_bf16=True,
        attn_mask_type=AttnMaskType.causal,
        scaled_masked_softmax_fusion=transformer_config_kwargs(TINY, on_gpu=True)["masked_softmax_fusion"],
        mask_func=attention_mask_func,
        softmax_in_fp32=True,
        scale=None,
    )
    scores = torch.randn(1, 4, 64, 64, dtype=torch.bfloat16)
    causal = torch.ones(1, 1, 64, 64).triu(diagonal=1).bool()
    assert softmax(scores, causal).shape == scores.shape
