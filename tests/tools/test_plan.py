"""`moe-cdk plan`: the memory formula by hand, the shipped configurations, cost, recommendation and the CLI."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import yaml
from conftest import ROOT, SHIPPED_CONFIGS

from moe_cdk.cli.main import main
from moe_cdk.core.problems import ConfigError
from moe_cdk.schema.config import load_config, parse_config
from moe_cdk.tools.plan import (
    BAR_FILLS,
    GIB,
    cluster_cost_per_hour,
    cluster_prices,
    load_prices,
    memory_bar,
    memory_per_device,
    memory_terms,
    plan,
    render_table,
    to_json,
)
from moe_cdk.training.config import load_train_config
from moe_cdk.training.step.sizes import flops_per_token

TINY = ROOT / "training/configs/tiny.yaml"
MIXTRAL = ROOT / "training/configs/mixtral-8x7b.yaml"
MOE_8X1B = ROOT / "training/configs/moe-8x1b.yaml"
DEFAULT_DATA = yaml.safe_load((ROOT / "config/default.yaml").read_text())


def config_with(
    *,
    compute: str = "ml.p5en.48xlarge",
    count: int = 2,
    orchestrator: str = "slurm",
    profile: str = "training/configs/mixtral-8x7b.yaml",
):
    """config/default.yaml with its compute group, orchestrator and profile replaced."""
    data = copy.deepcopy(DEFAULT_DATA)
    data["cluster"]["orchestrator"] = orchestrator
    gpu = data["cluster"]["instance_groups"][2]
    gpu["instance_type"], gpu["instance_count"] = compute, count
    data["training"]["profile"] = profile
    return parse_config(data)


# ---------------------------------------------------------------------------------- the formula by hand


def test_memory_of_a_two_layer_toy_by_hand():
    # tiny.yaml: 2 layers, h=64, 4 heads (no GQA), ffn=128, seq 64, 4 experts top-2, micro-batch 4;
    # byte vocab 257; precision fp32.
    train = load_train_config(TINY)
    est = memory_per_device(train, world_size=1, vocab_size=257, device_memory_gib=1.0)
    # Parameters. Vocab padded to a multiple of 1024 (128 per shard up to TP 8): 1024.
    attention = 64 * (64 + 2 * 64) + 64 * 64  # QKV + output = 16,384
    router, norms = 64 * 4, 2 * 64  # 256, 128
    embeddings = 2 * 1024 * 64 + 64  # input + output + final norm = 131,136
    dense = 2 * (attention + router + norms) + embeddings  # 33,536 + 131,136 = 164,672
    expert = 2 * 4 * 3 * 64 * 128  # 196,608
    per_device = dense + expert  # TP = EP = PP = 1
    assert est.parameters_per_device == per_device == 361_280
    # fp32: weight 4, gradient 4, Adam 8; no distributed optimizer.
    assert (est.parameters, est.gradients, est.optimizer) == pytest.approx(
        (per_device * 4 / GIB, per_device * 4 / GIB, per_device * 8 / GIB)
    )
    # Activations per layer, T = 64 x 4 = 256 tokens, 4 bytes each:
    hidden = (8 * 64 + (64 + 2 * 64) + 2 * 64) * 256 * 4  # streams, fused QKV, q and k: 851,968
    scores = 4 * 64 * 64 * 4 * 4  # heads x s^2 x b, unfused: 262,144
    bookkeeping = 256 * (13 * 4 + 20 * 2) + 2 * 256 * 4  # router, norm statistics: 25,600
    experts = 256 * 2 * (64 + 6 * 128) * 4  # routed tokens x (input + SwiGLU intermediates): 1,703,936
    rotary = 4 * 64 * 16 * 4  # 16,384
    per_layer = hidden + scores + bookkeeping + experts + rotary  # 2,860,032
    final_norm, logits = 256 * 64 * 4, 256 * 1024 * 4  # 65,536 and 1,048,576
    assert est.activations * GIB == pytest.approx(2 * per_layer + final_norm + logits)  # 6,834,176
    assert (est.layout.tensor, est.layout.pipeline, est.layout.expert, est.layout.data) == (1, 1, 1, 1)
    assert (est.precision, est.attention, est.distributed_optimizer) == ("fp32", "unfused", False)
    assert est.capacity == pytest.approx(0.9) and est.fits


def test_pipeline_stages_hold_their_layers_and_one_table_each():
    # 4 layers, pipeline 2 x virtual 2 on 2 devices: 2 micro-batches per step (8 / 4).
    train = load_train_config(TINY, ["model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_pipeline=2"])
    est = memory_per_device(train, world_size=2, vocab_size=257, device_memory_gib=1.0)
    layer = 16_384 + 256 + 128
    assert est.parameters_per_device == 4 * layer / 2 + (1024 * 64 + 64) + 4 * 4 * 3 * 64 * 128 / 2
    # 4 layers x min(1, 2 micro-batches / 2 stages) x (1 + (2 - 1) / (2 x 2)) = 5 layers in flight.
    assert est.activations * GIB == pytest.approx(5 * 2_860_032 + 65_536 + 1_048_576)


def test_transformer_engine_attention_keeps_only_softmax_statistics():
    unfused = memory_per_device(load_train_config(TINY), world_size=1, vocab_size=257, device_memory_gib=1.0)
    fused = memory_per_device(
        load_train_config(TINY, ["model.spec=transformer_engine"]), world_size=1, vocab_size=257, device_memory_gib=1.0
    )
    assert (unfused.activations - fused.activations) * GIB == pytest.approx(2 * (262_144 - 4 * 64 * 4 * 4))
    assert fused.attention == "fused"


def test_mixtral_on_16_h200_by_hand():
    train = load_train_config(MIXTRAL)
    est = memory_per_device(train, world_size=16, vocab_size=32000, device_memory_gib=131.3)
    # 46.71B total: dense 1,611,927,552 (32 layers x (GQA attention 41,943,040 + router 32,768 + norms 8,192)
    # + embeddings 2 x 32,768 (32,000 padded to 1024) x 4,096 + 4,096); experts 32 x 8 x 3 x 4,096 x 14,336.
    dense, expert = 1_611_927_552 / 2, 45_097_156_608 / 8  # TP 2; EP 8 x ETP 1
    assert est.parameters_per_device == dense + expert == 6_443_108_352
    # bf16 weights (2) and fp32 gradients (4); the distributed optimizer shards the fp32 main weights
    # and Adam moments (12) over data-parallel 8 (dense) and expert-data-parallel 2 (experts).
    assert (est.parameters + est.gradients) * GIB == pytest.approx(6 * 6_443_108_352)
    assert est.optimizer * GIB == pytest.approx(12 * (dense / 8 + expert / 2))  # 35,031,813,120
    # Activations per layer (bf16, T = 4096, t = 2, core-attention recompute: no scores):
    hidden = (8 * 4096 + (4096 + 2 * 1024) + 2 * 4096 + 4096) * 4096 * 2  # GQA: v expanded: 419,430,400
    bookkeeping = 4096 * (13 * 8 + 20 * 2) + 2 * 4096 * 4  # 622,592
    experts = 4096 / 2 * 2 * (4096 + 6 * 14336) * 2  # 738,197,504
    per_layer = (hidden + bookkeeping) / 2 + experts + 4 * 4096 * 128 * 4  # 956,612,608
    logits = 4096 * 32768 * 4 / 2
    assert est.activations * GIB == pytest.approx(32 * per_layer + 4096 * 4096 * 2 / 2 + logits)
    assert est.total == pytest.approx(97.40, abs=0.01)
    assert est.capacity == pytest.approx(118.17) and est.fits
    assert est.layout.describe().startswith("TP2 PP1 EP8 ETP1 DP8 (expert DP2) SP")
    assert est.checkpoint_gb == pytest.approx(46_709_084_160 * 14 / 1e9)  # 654 GB: weights, main weights, Adam


def test_the_memory_bar_stacks_each_term_to_scale_against_the_capacity():
    train = load_train_config(MIXTRAL)
    est = memory_per_device(train, world_size=16, vocab_size=32000, device_memory_gib=131.3)
    bar, legend = memory_bar(est, width=60)
    cells = bar[1:-1]
    assert len(cells) == 61 and cells.index("|") == round(est.capacity / 131.3 * 60)  # 60 cells and the mark
    for term, gib in memory_terms(est).items():
        assert abs(cells.count(BAR_FILLS[term]) - gib / 131.3 * 60) <= 1, term
        assert f"{BAR_FILLS[term]} {term}" in legend
    assert cells.count("·") == 60 - round(est.capacity / 131.3 * 60) and "‖" not in bar


def test_a_plan_past_the_device_marks_where_its_memory_ends():
    train = load_train_config(MIXTRAL)
    est = memory_per_device(train, world_size=8, vocab_size=32000, device_memory_gib=74.5)
    bar, legend = memory_bar(est, width=60)
    assert est.total > 74.5 and not est.fits
    assert bar[1:-1].index("‖") == round(74.5 / est.total * 60) + 1  # after the capacity mark
    assert "‖ device memory" in legend and " " not in bar


def test_the_table_shows_the_bar_under_the_memory_terms():
    lines = render_table(plan(load_config(ROOT / "config/default.yaml"))).splitlines()
    fits = next(i for i, line in enumerate(lines) if line.strip().startswith("fits"))
    assert lines[fits + 1].strip().startswith("[█") and "· reserve" in lines[fits + 2]


# ---------------------------------------------------------------------------------- errors


def test_mixtral_without_expert_parallel_on_one_p4de_does_not_fit():
    config = config_with(compute="ml.p4de.24xlarge", count=1)
    result = plan(config, train_overrides=["parallel.expert=1", "parallel.tensor=1"])
    [line] = [str(p) for p in result.problems]
    assert line.startswith(
        "training.profile: training/configs/mixtral-8x7b.yaml does not fit in device memory; the largest term is "
    )
    assert "GiB per device'; allowed at most 67.1 GiB per device: 74.5 GiB A100 less 10% reserve)" in line
    assert not result.memory.fits
    assert result.memory.total > 260  # 46.7B x 6 bytes (bf16 weights, fp32 gradients) alone is 261 GiB


def test_a_layout_that_does_not_fit_the_world_size_is_a_plan_error():
    config = config_with(count=1)  # 8 GPUs, but expert 8 x expert_tensor 2 needs 16
    with pytest.raises(ConfigError) as caught:
        plan(config, train_overrides=["parallel.expert_tensor=2"])
    assert caught.value.errors == [
        "training.profile: parallel.expert: expert x expert_tensor x pipeline must divide the world size "
        "(got '8 x 2 x 1 for 8 processes'; allowed a product dividing 8)"
    ]


# ---------------------------------------------------------------------------------- shipped configurations


@pytest.mark.parametrize("path", SHIPPED_CONFIGS)
def test_every_shipped_configuration_plans(path):
    result = plan(load_config(ROOT / path))
    assert result.memory.fits
    assert result.cost_per_hour_usd and result.cost_per_hour_usd > 0
    assert result.tokens_per_second > 0 and result.cost_per_billion_tokens_usd > 0
    assert "does not fit" not in render_table(result)


MODERN_PROFILES = ("training/configs/qwen3-30b-a3b.yaml", "training/configs/deepseek-v3-style-16b.yaml")
# Configurations whose GPU nodes are all ml.p5en.48xlarge (none that may fall back to another type).
P5EN_CONFIGS = [
    p for p in SHIPPED_CONFIGS if "ml.p5en.48xlarge" in (text := (ROOT / p).read_text()) and "fallback" not in text
]


@pytest.mark.parametrize("profile", MODERN_PROFILES)
@pytest.mark.parametrize("path", P5EN_CONFIGS)
def test_modern_profiles_fit_every_p5en_configuration(path, profile):
    result = plan(load_config(ROOT / path), train_config_path=str(ROOT / profile))
    assert result.accelerator == "H200" and result.memory.fits


@pytest.mark.parametrize("profile", MODERN_PROFILES)
def test_modern_profiles_fit_four_p5en_nodes(profile):
    result = plan(config_with(count=4, profile=profile))
    assert result.world_size == 32 and result.memory.fits


def test_p5_fits_mixtral_with_tensor_parallel_4():
    result = plan(load_config(ROOT / "config/p5-efa-lustre.yaml"), train_overrides=["parallel.tensor=4"])
    assert result.world_size == 32 and result.memory.fits
    assert (result.memory.layout.tensor, result.memory.layout.expert, result.memory.layout.data) == (4, 8, 8)


def test_json_output_keys():
    result = to_json(plan(load_config(ROOT / "config/default.yaml")))
    json.dumps(result)
    assert set(result) == {
        "config",
        "region",
        "profile",
        "instance_type",
        "nodes",
        "world_size",
        "accelerators",
        "stack",
        "accelerator",
        "vocab_size",
        "parameters",
        "layout",
        "memory_gib",
        "cost_per_hour_usd",
        "prices",
        "mfu",
        "tokens_per_second",
        "cost_per_billion_tokens_usd",
        "run_tokens",
        "estimated_run_hours",
        "checkpoint",
        "recommendation",
        "notes",
        "problems",
    }
    assert set(result["memory_gib"]) == {
        "parameters",
        "gradients",
        "optimizer",
        "optimizer_step",
        "activations",
        "total",
        "capacity",
        "fits",
        "precision",
        "distributed_optimizer",
        "attention",
        "recompute",
    }
    assert result["layout"] == {
        "tensor": 2,
        "pipeline": 1,
        "virtual_pipeline": None,
        "expert": 8,
        "expert_tensor": 1,
        "data": 8,
        "expert_data": 2,
    }
    # 654 GB at 4,800 GiB x 250 MB/s/TiB = 1,172 MB/s: about 9.3 minutes a save.
    assert result["checkpoint"]["save_s"] == pytest.approx(654e3 / 1171.875, rel=1e-3)
    assert set(result["recommendation"]) == {"orchestrator", "reasons"}
    assert any("assumed a 32000-token vocabulary" in note for note in result["notes"])


def test_cost_is_the_sum_of_group_counts_times_price():
    config = load_config(ROOT / "config/default.yaml")
    prices = load_prices()
    expected = sum(g.instance_count * prices[(g.instance_type, config.region)] for g in config.cluster.instance_groups)
    assert expected == pytest.approx(
        2 * prices[("ml.m5.2xlarge", "us-east-2")] + 2 * prices[("ml.p5en.48xlarge", "us-east-2")]
    )
    result = plan(config)
    assert result.cost_per_hour_usd == pytest.approx(expected)
    assert result.cost_per_billion_tokens_usd == pytest.approx(expected / (result.tokens_per_second * 3600) * 1e9)


def test_prices_file_covers_the_catalog_in_three_regions():
    data = yaml.safe_load((ROOT / "tools/prices.yaml").read_text())
    for entry in data["prices"]:
        assert set(entry) - {"capacity"} == {
            "instance_type",
            "region",
            "usd_per_hour",
            "confirmed",
            "source",
            "retrieved",
        }
    types = {
        "ml.p5en.48xlarge",
        "ml.p5.48xlarge",
        "ml.p4de.24xlarge",
        "ml.trn2.48xlarge",
        *(f"ml.m5.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge")),
    }
    # EC2 rates for ParallelCluster's nodes: every type but trn2.48xlarge, whose EC2 rate could not be found.
    types |= {t.removeprefix("ml.") for t in types} - {"trn2.48xlarge"}
    assert set(load_prices()) == {(t, r) for t in types for r in ("us-east-1", "us-east-2", "us-west-2")}


def test_a_missing_price_gives_no_cost_and_a_note(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices: []\n")
    result = plan(load_config(ROOT / "config/default.yaml"), prices_path=prices)
    assert result.cost_per_hour_usd is None and result.cost_per_billion_tokens_usd is None
    assert any("no price for ml.p5en.48xlarge in us-east-2" in note for note in result.notes)


def test_throughput_follows_flops_per_token_and_mfu():
    result = plan(load_config(ROOT / "config/default.yaml"), mfu=0.5)
    flops = flops_per_token(load_train_config(MIXTRAL), 32000)
    assert result.tokens_per_second == pytest.approx(0.5 * 989e12 * 16 / flops)
    assert result.estimated_run_hours == pytest.approx(50_000 * 256 * 4096 / result.tokens_per_second / 3600)


# ---------------------------------------------------------------------------------- recommendation


def test_a_short_run_on_one_node_is_a_training_job():
    config = config_with(count=1, profile="training/configs/moe-8x1b.yaml")
    result = plan(config, train_overrides=["max_steps=100"])
    assert result.estimated_run_hours < 1
    assert result.recommendation == "training-job"
    assert any("under 24 h" in reason for reason in result.reasons)


def test_a_long_run_is_slurm():
    result = plan(load_config(ROOT / "config/default.yaml"))
    assert result.estimated_run_hours > 24
    assert result.recommendation == "slurm"
    assert any("automatic resume" in reason for reason in result.reasons)


def test_a_run_beyond_28_days_names_the_training_jobs_limit():
    result = plan(load_config(ROOT / "config/default.yaml"), train_overrides=["max_steps=500000"])
    assert result.estimated_run_hours > 28 * 24
    assert result.recommendation == "slurm"
    assert any("28-day Training Jobs limit" in reason for reason in result.reasons)


def test_an_eks_configuration_is_recommended_eks():
    result = plan(load_config(ROOT / "config/eks-p5en.yaml"))
    assert result.recommendation == "eks"
    assert any("eks" in reason for reason in result.reasons)


def test_a_flexible_spot_autoscaled_group_is_sized_on_its_smallest_type_and_its_cost_explained():
    result = plan(load_config(ROOT / "config/eks-autoscaling.yaml"))
    # ml.p5.48xlarge's H100 (80 GB) bounds the memory, not ml.p5en.48xlarge's H200.
    assert result.accelerator == "H100/H200" and result.memory.capacity == pytest.approx(80e9 / 2**30 * 0.9)
    notes = "\n".join(result.notes)
    assert "no Spot price for ml.p5en.48xlarge in us-east-2" in notes and "an upper bound" in notes
    assert "group gpu is autoscaled: the cost counts all 4 nodes" in notes
    assert "tiered storage keeps 410 GiB on each node (20 % of its host memory)" in notes


def test_a_spot_price_in_the_prices_file_is_used(tmp_path):
    prices = yaml.safe_load((ROOT / "tools/prices.yaml").read_text())
    prices["prices"].append(
        {
            "instance_type": "ml.p5en.48xlarge",
            "region": "us-east-2",
            "usd_per_hour": 20.0,
            "confirmed": False,
            "source": "a test's Spot rate",
            "retrieved": "2026-12-05",
            "capacity": "spot",
        }
    )
    (path := tmp_path / "prices.yaml").write_text(yaml.safe_dump(prices))
    config = load_config(ROOT / "config/eks-autoscaling.yaml")
    result = plan(config, prices_path=path)
    system = 2 * load_prices()[("ml.m5.2xlarge", "us-east-2")]
    assert result.cost_per_hour_usd == pytest.approx(system + 4 * 20.0)
    assert not any("no Spot price" in note for note in result.notes)


def test_a_spot_group_is_told_when_a_checkpoint_outlasts_the_interruption_notice():
    config = load_config(ROOT / "config/eks-autoscaling.yaml")
    result = plan(config, train_config_path=str(ROOT / "training/configs/mixtral-8x7b.yaml"))
    assert result.checkpoint_save_s > 120
    assert any(n.startswith("Spot group(s) gpu: a checkpoint takes about") for n in result.notes), result.notes


# Peak memory measured on one H200 by bench/gpu_check.sh (2026-12-04): 3 Mixtral layers, the local spec,
# no Transformer Engine, by sequence length; docs/benchmarks.md.
H200_PEAK_GIB = {1024: 93.36, 2048: 93.55, 3072: 93.87, 4096: 94.32}


@pytest.mark.parametrize("seq_length", sorted(H200_PEAK_GIB))
def test_the_plan_covers_the_peak_measured_on_an_h200_within_two_percent(seq_length):
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check import MIXTRAL as SHAPE, VOCAB, overrides

    train = load_train_config(SHAPE, overrides(layers=3, seq_length=seq_length, micro_batches=4, variant="local"))
    est = memory_per_device(train, world_size=1, vocab_size=VOCAB, device_memory_gib=141e9 / 2**30)
    assert 1.0 <= est.total / H200_PEAK_GIB[seq_length] <= 1.02


def test_torchs_adam_step_is_counted_instead_of_the_activations_when_larger():
    local = load_train_config(MIXTRAL, ["model.spec=local"])
    est = memory_per_device(local, world_size=16, vocab_size=32000, device_memory_gib=131.3)
    assert est.optimizer_step == pytest.approx(est.optimizer / 3)  # 4 of the 12 bytes a bf16 parameter's state takes
    states = est.parameters + est.gradients + est.optimizer
    assert est.total == pytest.approx(states + max(est.activations, est.optimizer_step))
    fused = load_train_config(MIXTRAL, ["model.spec=transformer_engine"])
    assert memory_per_device(fused, world_size=16, vocab_size=32000, device_memory_gib=131.3).optimizer_step == 0


def test_the_native_spec_holds_no_attention_scores_and_no_adam_step_temporary():
    no_recompute = ["recompute.granularity=none", "recompute.modules=[]"]
    local, native = (
        memory_per_device(
            load_train_config(MIXTRAL, [f"model.spec={spec}", *no_recompute]),
            world_size=16,
            vocab_size=32000,
            device_memory_gib=131.3,
        )
        for spec in ("local", "native")
    )
    assert (local.attention, native.attention) == ("unfused", "fused")
    assert native.activations < local.activations
    # torch's fused AdamW updates the parameters and moments in place, with no foreach sqrt copy (not yet
    # measured on a GPU: docs/benchmarks.md).
    assert native.optimizer_step == 0 < local.optimizer_step


def test_trn2_is_sized_per_logical_neuroncore_and_per_chip():
    result = plan(load_config(ROOT / "config/trn2.yaml"))
    assert (result.accelerators, result.world_size, result.stack) == (32, 128, "neuronx-distributed-training")
    assert result.memory.device_memory_gib == 24.0  # a quarter of a chip's 96 GiB at LNC 2
    table = render_table(result)
    assert "memory per NeuronCore" in table and f"{result.memory.total * 4:8.1f}   of 96.0 GiB" in table
    assert any("nothing here has run on Trainium" in note for note in result.notes)


def test_trn2_plan_counts_the_experts_over_the_tensor_parallel_ranks():
    layout = plan(load_config(ROOT / "config/trn2.yaml")).memory.layout
    assert (layout.tensor, layout.expert, layout.expert_tensor, layout.expert_data) == (32, 1, 32, 4)


def test_trn2_throughput_counts_chips_not_neuroncores():
    result = plan(load_config(ROOT / "config/trn2.yaml"))
    flops = flops_per_token(load_train_config(ROOT / "training/configs/mixtral-8x7b-trn2.yaml"), 32000)
    assert result.tokens_per_second == pytest.approx(result.mfu * 667e12 * 32 / flops)


def test_a_profile_nxd_training_cannot_run_is_a_plan_error_naming_its_key(capsys):
    args = ["plan", "--config", str(ROOT / "config/trn2.yaml"), "--set", "moe.capacity_factor=null"]
    assert main([*args, "--set", "parallel.expert=2"]) == 2
    assert "training.profile: moe.capacity_factor: dropless MoE (null)" in capsys.readouterr().err


def test_a_parallelcluster_cluster_is_costed_at_ec2_rates_and_its_capacity_block_said_so():
    # ParallelCluster's nodes are EC2 instances: no SageMaker markup. 1 x m5.8xlarge + 1 x m5.2xlarge + 2 x p5en.
    config = load_config(ROOT / "config/parallelcluster.yaml")
    assert [p.instance_type for p in cluster_prices(config)] == ["m5.8xlarge", "m5.2xlarge", "p5en.48xlarge"]
    cost, notes = cluster_cost_per_hour(config)
    assert cost == pytest.approx(1.536 + 0.384 + 2 * 63.296)
    assert "group gpu runs on a Capacity Block, paid upfront at its own rate: priced at On-Demand here" in notes
