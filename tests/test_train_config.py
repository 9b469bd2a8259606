"""The trainer's configuration: shipped profiles load; bad values and layouts are rejected by key."""

from __future__ import annotations

import pytest

from conftest import ROOT
from moe_cdk.training.config import Dispatcher, check_layout, load_train_config
from moe_cdk.training.schema import ConfigError

PROFILES = sorted((ROOT / "training/configs").glob("*.yaml"))
TINY = ROOT / "training/configs/tiny.yaml"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_shipped_profile_loads(path):
    assert load_train_config(path).max_steps > 0


def test_alltoall_is_the_default_dispatcher():
    assert load_train_config(TINY).moe.token_dispatcher is Dispatcher.ALLTOALL


def test_overrides_replace_values_by_dotted_key():
    config = load_train_config(TINY, ["moe.token_dispatcher=allgather", "parallel.expert=2", "max_steps=7"])
    assert (config.moe.token_dispatcher, config.parallel.expert, config.max_steps) == (Dispatcher.ALLGATHER, 2, 7)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["moe.top_k=5"], "moe.top_k: out of range (got 5; allowed 1 to num_experts (4))"),
    (["moe.num_experts=1"], "moe.num_experts: an MoE needs at least 2 experts (got 1;"),
    (["moe.token_dispatcher=flex"], "moe.token_dispatcher: unknown value (got 'flex'; allowed alltoall, allgather)"),
    (["parallel.expert=3"], "parallel.expert: must divide moe.num_experts (got 3; allowed a divisor of 4)"),
    (["parallel.pipeline=2"], "parallel.pipeline: pipeline parallelism is not supported by moe-train yet (got 2; allowed 1)"),
    (["checkpoint.keep_last=1"], "checkpoint.keep_last: keep at least two, so a bad latest one has a fallback (got 1;"),
    (["model.dropout=1.5"], "model.dropout: out of range (got 1.5;"),
    (["optim.lr_warmup=3"], "optim.lr_warmup: unknown key (got 'lr_warmup';"),
    (["metrics.prometheus_port=70000"], "metrics.prometheus_port: not a TCP port (got 70000;"),
    (["data.weights=[1.0, 2.0]"], "data.weights: needs one weight per prefix (got [1.0, 2.0]; allowed 1 weights)"),
    (["nonsense"], "--set: not a key=value assignment (got 'nonsense';"),
])
def test_bad_value_is_rejected_by_key(overrides, expected):
    with pytest.raises(ConfigError) as caught:
        load_train_config(TINY, overrides)
    assert any(line.startswith(expected) for line in caught.value.errors), caught.value.errors


def test_data_parallel_size_is_derived_from_the_world_size():
    assert check_layout(load_train_config(TINY, ["parallel.expert=2"]), world_size=2) == 2


@pytest.mark.parametrize(("overrides", "world", "expected"), [
    (["parallel.tensor=2"], 3, "parallel: tensor x pipeline must divide the world size"),
    (["parallel.expert=4"], 2, "parallel.expert: expert x tensor x pipeline must divide the world size (got 4;"),
    (["optim.global_batch_size=12"], 2, "optim.global_batch_size: must be a multiple of micro_batch_size x data-parallel size (4 x 2)"),
])
def test_layout_that_does_not_fit_the_world_is_rejected(overrides, world, expected):
    with pytest.raises(ConfigError) as caught:
        check_layout(load_train_config(TINY, overrides), world_size=world)
    assert any(line.startswith(expected) for line in caught.value.errors), caught.value.errors
