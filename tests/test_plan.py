"""`moe-cdk plan`: the memory formula by hand, the shipped configurations, cost, recommendation and the CLI."""

from __future__ import annotations

import argparse
import copy
import json

import pytest
import yaml

from conftest import ROOT, SHIPPED_CONFIGS
from moe_cdk.stacks.config import load_config, parse_config
from moe_cdk.stacks.plan import (GIB, PlanError, add_parser, load_prices, memory_per_device, plan, render_table,
                                 to_json)
from moe_cdk.training.config import load_train_config

TINY = ROOT / "training/configs/tiny.yaml"
MIXTRAL = ROOT / "training/configs/mixtral-8x7b.yaml"
MOE_8X1B = ROOT / "training/configs/moe-8x1b.yaml"
DEFAULT_DATA = yaml.safe_load((ROOT / "config/default.yaml").read_text())


def config_with(*, compute: str = "ml.p5en.48xlarge", count: int = 2, orchestrator: str = "slurm",
                profile: str = "training/configs/mixtral-8x7b.yaml"):
    """config/default.yaml with its compute group, orchestrator and profile replaced."""
    data = copy.deepcopy(DEFAULT_DATA)
    data["cluster"]["orchestrator"] = orchestrator
    gpu = data["cluster"]["instance_groups"][2]
    gpu["instance_type"], gpu["instance_count"] = compute, count
    data["training"]["profile"] = profile
    return parse_config(data)


# ---------------------------------------------------------------------------------- the formula by hand


def test_memory_of_a_two_layer_toy_by_hand():
    # tiny.yaml: 2 layers, h=64, 4 heads (no GQA), ffn=128, seq 64, 4 experts top-2, micro-batch 4; byte vocab 257.
    train = load_train_config(TINY)
    est = memory_per_device(train, world_size=1, vocab_size=257, device_memory_gib=1.0)
    # Parameters. Vocab padded to a multiple of 1024 (128 per shard up to TP 8): 1024.
    attention = 64 * (64 + 2 * 64) + 64 * 64  # QKV + output = 16,384
    router, norms = 64 * 4, 2 * 64  # 256, 128
    embeddings = 2 * 1024 * 64 + 64  # input + output + final norm = 131,136
    dense = 2 * (attention + router + norms) + embeddings  # 33,536 + 131,136 = 164,672
    expert = 2 * 4 * 3 * 64 * 128  # 196,608
    assert dense + expert == 361_280
    per_device = dense + expert  # TP = EP = 1
    assert est.parameters_per_device == per_device
    assert est.parameters == pytest.approx(per_device * 4 / GIB)
    assert est.gradients == pytest.approx(per_device * 4 / GIB)
    assert est.optimizer == pytest.approx(per_device * 8 / GIB)
    # Activations: s*b*h = 64*4*64 = 16,384 bytes per unit;
    # per layer 15 (attention + norms) + 19*2*128/(4*64) = 19 (MoE MLP) + 5*4*64/64 = 20 (scores) = 54 units.
    per_layer = 16_384 * 54  # 884,736
    logits = 64 * 4 * 1024 * 4  # s*b*vocab*4 = 1,048,576
    assert est.activations == pytest.approx((2 * per_layer + logits) / GIB)
    assert est.total == pytest.approx((16 * per_device + 2 * per_layer + logits) / GIB)
    assert (est.tensor, est.pipeline, est.expert, est.data) == (1, 1, 1, 1)
    assert est.capacity == pytest.approx(0.9) and est.fits


def test_memory_of_the_toy_split_by_tensor_and_expert_parallel():
    # The same toy with TP=2, EP=2 (expert_tensor 1) on 4 devices: data-parallel 2; vocab padded to 1024.
    train = load_train_config(TINY, ["parallel.tensor=2", "parallel.expert=2"])
    est = memory_per_device(train, world_size=4, vocab_size=257, device_memory_gib=1.0)
    dense = 2 * (16_384 + 256 + 128) + (2 * 1024 * 64 + 64)  # 33,536 + 131,136 = 164,672
    expert = 196_608
    per_device = dense / 2 + expert / (2 * 1)  # 82,336 + 98,304 = 180,640
    assert est.parameters_per_device == 180_640 == per_device
    activations = (2 * 16_384 * 54) / 2 + 64 * 4 * 1024 * 4 / 2  # 884,736 + 524,288 (both / TP)
    assert est.activations == pytest.approx(activations / GIB)
    assert (est.tensor, est.expert, est.data) == (2, 2, 2)


def test_mixtral_on_16_h200_by_hand():
    train = load_train_config(MIXTRAL)
    est = memory_per_device(train, world_size=16, vocab_size=32000, device_memory_gib=141)
    # 46.71B total: dense 1,611,927,552 (32 layers x (GQA attention 41,943,040 + router 32,768 + norms 8,192)
    # + embeddings 2 x 32,768 (32,000 padded to 1024) x 4,096 + 4,096); experts 32 x 8 x 3 x 4,096 x 14,336.
    dense, expert = 1_611_927_552, 45_097_156_608
    assert dense + expert == 46_709_084_160
    per_device = dense / 2 + expert / (8 * 2)  # TP 2; EP 8 x ETP 2: 805,963,776 + 2,818,572,288 = 3,624,536,064
    assert est.parameters_per_device == 3_624_536_064
    states = est.parameters + est.gradients + est.optimizer
    assert states == pytest.approx(per_device * 16 / GIB)  # 57,992,577,024 bytes = 54.01 GiB
    assert states == pytest.approx(54.01, abs=0.01)
    # Activations: s*b*h/t = 4096*1*4096/2 = 8,388,608 x (15 + 19*2*14336/16384 = 33.25 + 5*32*4096/4096 = 160)
    # = 1,746,927,616 bytes per layer x 32 layers, + logits 4096*1*32768*4/2 = 268,435,456.
    assert est.activations == pytest.approx((1_746_927_616 * 32 + 268_435_456) / GIB)  # 52.31 GiB
    assert est.total == pytest.approx(106.32, abs=0.01)
    assert est.capacity == pytest.approx(126.9) and est.fits
    assert (est.tensor, est.pipeline, est.expert, est.data) == (2, 1, 8, 8)


# ---------------------------------------------------------------------------------- errors


def test_mixtral_without_expert_parallel_on_one_p4de_does_not_fit():
    config = config_with(compute="ml.p4de.24xlarge", count=1)
    with pytest.raises(PlanError) as caught:
        plan(config, train_overrides=["parallel.expert=1", "parallel.tensor=1", "parallel.expert_tensor=1"])
    [line] = caught.value.problems
    assert line.startswith("training.profile: training/configs/mixtral-8x7b.yaml does not fit in device memory (got ")
    assert "GiB per device; allowed at most 72.0 GiB per device: 80 GiB A100 less 10% reserve)" in line
    assert caught.value.plan is not None and not caught.value.plan.memory.fits
    assert caught.value.plan.memory.total > 700  # 46.7B x 16 bytes alone is 696 GiB


def test_a_layout_that_does_not_fit_the_world_size_is_a_plan_error():
    config = config_with(count=1)  # 8 GPUs, but expert 8 x expert_tensor 2 needs 16
    with pytest.raises(PlanError) as caught:
        plan(config)
    assert caught.value.problems == [
        "training.profile: parallel.expert: expert x expert_tensor x pipeline must divide the world size "
        "(got '8 x 2 x 1 for 8 processes'; allowed a product dividing 8)"]


# ---------------------------------------------------------------------------------- shipped configurations


@pytest.mark.parametrize("path", SHIPPED_CONFIGS)
def test_every_shipped_configuration_plans(path):
    result = plan(load_config(ROOT / path))
    assert result.memory.fits
    assert result.cost_per_hour_usd and result.cost_per_hour_usd > 0
    assert result.tokens_per_second > 0 and result.cost_per_billion_tokens_usd > 0
    assert "does not fit" not in render_table(result)


def test_p5_fits_mixtral_with_tensor_parallel_4():
    result = plan(load_config(ROOT / "config/p5-efa-lustre.yaml"), train_overrides=["parallel.tensor=4"])
    assert result.world_size == 32 and result.memory.fits
    assert (result.memory.tensor, result.memory.expert, result.memory.data) == (4, 8, 8)


def test_json_output_keys():
    result = to_json(plan(load_config(ROOT / "config/default.yaml")))
    json.dumps(result)
    assert set(result) == {
        "config", "region", "profile", "instance_type", "nodes", "world_size", "accelerator", "vocab_size",
        "parameters", "layout", "memory_gib", "cost_per_hour_usd", "mfu", "tokens_per_second",
        "cost_per_billion_tokens_usd", "run_tokens", "estimated_run_hours", "recommendation", "notes"}
    assert set(result["memory_gib"]) == {"parameters", "gradients", "optimizer", "activations", "total", "capacity", "fits"}
    assert result["layout"] == {"tensor": 2, "pipeline": 1, "expert": 8, "data": 8}
    assert set(result["recommendation"]) == {"orchestrator", "reasons"}
    assert any("assumed a 32000-token vocabulary" in note for note in result["notes"])


def test_cost_is_the_sum_of_group_counts_times_price():
    config = load_config(ROOT / "config/default.yaml")
    prices = load_prices()
    expected = sum(g.instance_count * prices[(g.instance_type, config.region)] for g in config.cluster.instance_groups)
    assert expected == pytest.approx(2 * prices[("ml.m5.2xlarge", "us-east-2")] + 2 * prices[("ml.p5en.48xlarge", "us-east-2")])
    result = plan(config)
    assert result.cost_per_hour_usd == pytest.approx(expected)
    assert result.cost_per_billion_tokens_usd == pytest.approx(expected / (result.tokens_per_second * 3600) * 1e9)


def test_prices_file_covers_the_catalog_in_three_regions():
    data = yaml.safe_load((ROOT / "stacks/prices.yaml").read_text())
    assert data["source"] and data["retrieved"]
    for entry in data["prices"]:
        assert set(entry) == {"instance_type", "region", "usd_per_hour", "confirmed"}
    types = {"ml.p5en.48xlarge", "ml.p5.48xlarge", "ml.p4de.24xlarge", "ml.trn2.48xlarge",
             *(f"ml.m5.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge"))}
    assert set(load_prices()) == {(t, r) for t in types for r in ("us-east-1", "us-east-2", "us-west-2")}


def test_a_missing_price_gives_no_cost_and_a_note(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("source: test\nretrieved: today\nprices: []\n")
    result = plan(load_config(ROOT / "config/default.yaml"), prices_path=prices)
    assert result.cost_per_hour_usd is None and result.cost_per_billion_tokens_usd is None
    assert any("no price for ml.p5en.48xlarge in us-east-2" in note for note in result.notes)


def test_throughput_follows_flops_per_token_and_mfu():
    from moe_cdk.training.model import flops_per_token

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


# ---------------------------------------------------------------------------------- CLI


def run_cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="c")
    add_parser(sub)
    args = p.parse_args(["plan", *argv])
    return args.run(args)


def test_cli_prints_the_table_and_exits_0(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml")) == 0
    out = capsys.readouterr().out
    for label in ("layout", "parameters", "activations", "total", "cluster cost", "tokens/s", "recommendation"):
        assert label in out
    assert "tensor 2 x pipeline 1 x expert 8, data 8" in out


def test_cli_json(capsys):
    assert run_cli("--config", str(ROOT / "config/existing-vpc.yaml"), "--json", "--mfu", "0.4") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mfu"] == 0.4 and data["memory_gib"]["fits"] is True
    assert data["profile"] == "training/configs/moe-8x1b.yaml"


def test_cli_train_config_option(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml"), "--train-config", str(MOE_8X1B)) == 0
    assert "moe-8x1b.yaml" in capsys.readouterr().out


def test_cli_exits_2_when_it_does_not_fit(capsys):
    path = str(ROOT / "config/default.yaml")
    assert run_cli("--config", path, "--set", "parallel.expert=1", "--set", "parallel.tensor=1", "--set", "parallel.expert_tensor=1") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0] == f"{path}: 1 problem(s)"
    assert lines[1].startswith("  training.profile: training/configs/mixtral-8x7b.yaml does not fit in device memory (got ")


def test_cli_exits_2_on_an_invalid_configuration(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("region: nowhere\ncluster: {availability_zone: x, instance_groups: []}\n")
    assert run_cli("--config", str(bad)) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{bad}: ") and err[0].endswith("problem(s)")
    assert all(line.startswith("  ") for line in err[1:]) and len(err) > 1


def test_cli_exits_2_on_a_bad_mfu(capsys):
    assert run_cli("--config", str(ROOT / "config/default.yaml"), "--mfu", "1.5") == 2
    assert "--mfu: model FLOPs utilisation out of range" in capsys.readouterr().err
