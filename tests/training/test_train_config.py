"""The trainer's configuration: shipped profiles load; bad values and layouts are rejected by key."""

from __future__ import annotations

import pytest
from conftest import ROOT

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.config import Dispatcher, load_train_config
from moe_cdk.training.step.parallel import plan_layout

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


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["moe.top_k=5"], "moe.top_k: out of range (got 5; allowed 1 to num_experts (4))"),
        (["moe.num_experts=1"], "moe.num_experts: an MoE needs at least 2 experts (got 1;"),
        (
            ["moe.token_dispatcher=flex"],
            "moe.token_dispatcher: unknown value (got 'flex'; allowed alltoall, allgather)",
        ),
        (["parallel.expert=3"], "parallel.expert: must divide moe.num_experts (got 3; allowed a divisor of 4)"),
        (
            ["checkpoint.keep_last=1"],
            "checkpoint.keep_last: keep at least two, so a bad latest one has a fallback (got 1;",
        ),
        (["model.dropout=1.5"], "model.dropout: out of range (got 1.5;"),
        (["optim.lr_warmup=3"], "optim.lr_warmup: unknown key (got 'lr_warmup';"),
        (["metrics.prometheus_port=70000"], "metrics.prometheus_port: not a TCP port (got 70000;"),
        (["data.weights=[1.0, 2.0]"], "data.weights: needs one weight per prefix (got [1.0, 2.0]; allowed 1 weights)"),
        (["nonsense"], "--set: not a key=value assignment (got 'nonsense';"),
        (["model.norm_epsilon=0"], "model.norm_epsilon: out of range (got 0.0;"),
        (
            ["model.dense_layers=2"],
            "model.dense_layers: out of range: an MoE model needs at least one MoE layer (got 2;",
        ),
        (["model.dense_layers=1"], "model.dense_ffn_hidden_size: the dense layers need a positive MLP size (got None;"),
        (
            ["model.multi_latent_attention=true", "model.num_query_groups=2"],
            "model.num_query_groups: multi-latent attention has no key/value groups or kv_channels (got 2;",
        ),
        (
            ["model.multi_latent_attention=true", "model.qk_pos_emb_head_dim=7"],
            "model.qk_pos_emb_head_dim: the rotary embedding rotates pairs (got 7;",
        ),
        # Router options, checked here with the key named rather than in megatron's __post_init__.
        (["moe.expert_bias=true"], "moe.expert_bias: aux-loss-free expert bias needs sigmoid scores (got True;"),
        (
            ["moe.num_groups=3", "moe.group_top_k=1"],
            "moe.num_groups: must divide num_experts (got 3; allowed a divisor of 4)",
        ),
        (
            ["moe.num_groups=2"],
            "moe.group_top_k: group-limited routing needs both num_groups and group_top_k (got None;",
        ),
        (
            ["moe.num_groups=4", "moe.group_top_k=3"],
            "moe.group_top_k: must divide top_k into shares that fit a group (got 3;",
        ),
        (["moe.shared_expert_ffn_hidden_size=0"], "moe.shared_expert_ffn_hidden_size: must be positive (got 0;"),
        (
            ["moe.score_function=sigmoid", "moe.normalize_top_k=false"],
            "moe.normalize_top_k: only softmax scores can skip renormalising (got False;",
        ),
        (
            ["moe.shared_expert_gate=true"],
            "moe.shared_expert_gate: gates a shared expert, and there is none (got True;",
        ),
    ],
)
def test_bad_value_is_rejected_by_key(overrides, expected):
    with pytest.raises(ConfigError) as caught:
        load_train_config(TINY, overrides)
    assert any(line.startswith(expected) for line in caught.value.errors), caught.value.errors


def test_data_parallel_size_is_derived_from_the_world_size():
    assert plan_layout(load_train_config(TINY, ["parallel.expert=2"]), world_size=2).data == 2


def test_expert_data_parallel_size_is_what_the_experts_leave():
    layout = plan_layout(load_train_config(TINY, ["parallel.expert=2", "optim.micro_batch_size=2"]), world_size=4)
    assert (layout.data, layout.expert_data, layout.expert_tensor) == (4, 2, 1)


def test_expert_tensor_defaults_to_tensor_when_experts_are_not_split():
    layout = plan_layout(load_train_config(TINY, ["parallel.tensor=2"]), world_size=2)
    assert (layout.expert_tensor, layout.sequence_parallel) == (2, True)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # megatron-core 0.16.1 reduces such expert gradients over the wrong group (experts.py).
        (
            ["parallel.tensor=2", "parallel.expert_tensor=1"],
            "parallel.expert_tensor: with parallel.expert 1, megatron-core",
        ),
        # megatron's MoE layer refuses tensor parallelism without sequence parallelism in training.
        (
            ["parallel.tensor=2", "parallel.sequence=false"],
            "parallel.sequence: megatron's MoE layer trains with tensor parallelism only",
        ),
        (["parallel.sequence=true"], "parallel.sequence: sequence parallelism splits over the tensor-parallel group"),
        (["parallel.virtual_pipeline=2"], "parallel.virtual_pipeline: needs pipeline parallelism"),
        (["recompute.granularity=selective"], "recompute.modules: selective recompute needs at least one module"),
        (["model.spec=tpu"], "model.spec: unknown value (got 'tpu'; allowed auto, transformer_engine, local, native)"),
    ],
)
def test_layout_option_that_cannot_work_is_rejected_by_key(overrides, expected):
    with pytest.raises(ConfigError) as caught:
        load_train_config(TINY, overrides)
    assert any(line.startswith(expected) for line in caught.value.errors), caught.value.errors


@pytest.mark.parametrize(
    ("overrides", "world", "expected"),
    [
        (["parallel.tensor=2"], 3, "parallel: tensor x pipeline must divide the world size"),
        (
            ["parallel.expert=4"],
            2,
            "parallel.expert: expert x expert_tensor x pipeline must divide the world size (got '4 x 1 x 1 for 2 "
            "processes';",
        ),
        (
            ["parallel.tensor=3", "model.num_attention_heads=3", "model.hidden_size=63"],
            3,
            "parallel.tensor: must divide the largest tensor-parallel size",
        ),
        (
            ["parallel.pipeline=2", "parallel.virtual_pipeline=2", "model.num_layers=4", "optim.global_batch_size=4"],
            2,
            "optim.global_batch_size: the interleaved pipeline schedule needs at least parallel.pipeline micro-batches",
        ),
        (
            ["optim.global_batch_size=12"],
            2,
            "optim.global_batch_size: must be a multiple of micro_batch_size x data-parallel size (4 x 2)",
        ),
    ],
)
def test_layout_that_does_not_fit_the_world_is_rejected(overrides, world, expected):
    with pytest.raises(ConfigError) as caught:
        plan_layout(load_train_config(TINY, overrides), world_size=world)
    assert any(line.startswith(expected) for line in caught.value.errors), caught.value.errors


DEEPSEEK_ROUTER = (
    "moe.num_experts=8",
    "moe.top_k=4",
    "moe.score_function=sigmoid",
    "moe.expert_bias=true",
    "moe.aux_loss_coeff=0",
    "moe.shared_expert_ffn_hidden_size=96",
    "moe.num_groups=4",
    "moe.group_top_k=2",
    "moe.top_k_scaling_factor=2.5",
)


def test_deepseek_style_router_options_reach_megatron():
    from moe_cdk.training.step.model import build_transformer_config

    built = build_transformer_config(load_train_config(TINY, list(DEEPSEEK_ROUTER)), on_gpu=False)
    assert (
        built.moe_router_score_function,
        built.moe_router_enable_expert_bias,
        built.moe_shared_expert_intermediate_size,
        built.moe_router_num_groups,
        built.moe_router_group_topk,
        built.moe_router_topk_scaling_factor,
    ) == ("sigmoid", True, 96, 4, 2, 2.5)


def test_a_vocabulary_smaller_than_the_tokenizer_names_model_vocab_size():
    from moe_cdk.training.step.sizes import model_vocab_size

    with pytest.raises(ConfigError) as caught:
        model_vocab_size(load_train_config(TINY, ["model.vocab_size=200"]), 256)
    assert caught.value.errors == [
        "model.vocab_size: smaller than the tokenizer's vocabulary (got 200; allowed 256 or more, or null)"
    ]


def test_an_unknown_key_does_not_hide_a_bad_value_in_another_section():
    with pytest.raises(ConfigError) as error:
        load_train_config(TINY, ["moe.top_k=9", "data.bogus=1"])
    assert [e.split(":")[0] for e in error.value.errors] == ["data.bogus", "moe.top_k"]
