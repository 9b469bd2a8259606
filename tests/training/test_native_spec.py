"""The native spec's modules give what the megatron modules they replace give, on the same weights and inputs.

Tolerances: in float32 both attentions reduce the same sums in another order (softmax over 64 keys, 16-wide
heads), so they may differ by a few units of float32's epsilon (2^-23) times the output's magnitude; 16 of them are
allowed. In bfloat16 each path rounds the attention probabilities and its output to bfloat16 (2^-7 between
neighbours near 1), so two such steps, relative to the largest value, are allowed. The experts' grouped GEMM
multiplies the same bfloat16 numbers as the per-expert GEMMs, and torch accumulates both in float32.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from trainer_runs import probe_result

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.config import load_train_config
from moe_cdk.training.step.model import resolve_spec

PROBE = ROOT / "tests/native_probe.py"
TINY = ROOT / "training/configs/tiny.yaml"
RELATIVE = {"float32": 16 * 2**-23, "bfloat16": 2 * 2**-7}
# Grouped-query heads (two query heads per key/value head), and multi-latent attention's wider query/key heads.
ATTENTION = {
    "gqa": ["model.num_query_groups=2"],
    "mla": [
        "model.multi_latent_attention=true",
        "model.num_query_groups=null",
        "model.kv_lora_rank=32",
        "model.qk_head_dim=16",
        "model.qk_pos_emb_head_dim=8",
        "model.v_head_dim=16",
    ],
}


@pytest.fixture(scope="module", params=ATTENTION)
def report(request) -> dict:
    return probe_result(PROBE, str(TINY), *ATTENTION[request.param])


def _within(case: dict, dtype: str) -> None:
    for name, found in case.items():
        if isinstance(found, dict):
            assert found["diff"] <= RELATIVE[dtype] * found["scale"], (name, found)


@pytest.mark.parametrize("dtype", RELATIVE)
def test_attention_matches_megatrons_dot_product_attention(report, dtype):
    _within(report[f"attention_{dtype}"], dtype)


def test_bfloat16_experts_run_as_two_grouped_gemms_with_sequential_mlps_results(report):
    case = report["experts_bfloat16"]
    assert case["grouped_gemms"] == 2
    _within(case, "bfloat16")


def test_float32_experts_take_the_per_expert_gemms(report):
    # torch 2.9's _grouped_mm has no float32 kernel, on CPU or CUDA.
    case = report["experts_float32"]
    assert case["grouped_gemms"] == 0
    assert all(found["diff"] == 0 for found in case.values() if isinstance(found, dict))


def test_the_optimizer_steps_with_torchs_fused_adamw_and_stays_fused_after_a_load(report):
    case = report["optimizer"]
    assert case["optimizers"] == 2  # megatron chains the dense and the expert parameters' optimizers
    assert case["fused"] and all(case["fused"]) and all(case["fused_after_load"])
    assert case["fused_kernels"] == len(case["fused"])  # one kernel per parameter group


def test_the_native_spec_refuses_megatrons_grouped_gemm():
    config = load_train_config(TINY, ["model.spec=native", "moe.grouped_gemm=true"])
    with pytest.raises(ConfigError, match="moe.grouped_gemm: the native spec runs its experts as torch's grouped GEMM"):
        resolve_spec(config, on_gpu=False)
