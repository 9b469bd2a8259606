"""A moe-train profile as NxD Training's configuration (jobs/nxdt.py), compared key by key with AWS's own example
configurations (tests/fixtures/neuron/nxdt_reference.yaml), and every key NxD Training cannot express refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.nxdt import FIXED, MAPPED, nxdt_problems, profile_keys, render_nxdt_config
from moe_cdk.training.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/neuron"
REFERENCE = yaml.safe_load((FIXTURES / "nxdt_reference.yaml").read_text())
EXAMPLE = REFERENCE["mixtral_example"]
TRN2_PROFILE = ROOT / "training/configs/mixtral-8x7b-trn2.yaml"

# Where the example's values and ours differ on purpose, and why.
DELIBERATE = {
    "exp_manager.explicit_log_dir": "checkpoint.dir (train.sh passes a folder per job id; the profile's folder lets "
    "a later job resume)",
    "data.splits_string": "no validation split: moe-train trains on the whole dataset",
    "trainer.limit_val_batches": "no validation run",
    "trainer.limit_test_batches": "no test run",
    "model.activations_checkpoint_granularity": "moe-train's recompute is selective (core attention), never full",
    "model.activations_checkpoint_recompute": "with selective granularity NxD Training iterates it: [CoreAttention], "
    "as every AWS selective configuration has it (the example's full granularity leaves it null)",
    "compiler_cache_url": "on FSx, shared by the nodes",
    "exp_manager.checkpoint_callback_params.save_top_k": "checkpoint.keep_last, at least 2 in moe-train",
    "compiler_flags": "the trn2 configurations' flags (trn2_example)",
    "aync_exec_max_inflight_requests": "the trn2 configurations' value (trn2_example)",
    "model.moe.router_activation": "the example says sigmoid, but its top_k router is built without act_fn and "
    "scores with softmax (transformer.py, lines 438-444): the rendering writes what trains",
}
# The example's keys that NxD Training reads only with sinkhorn routing, which moe-train has not.
OMITTED = {"model.moe.sinkhorn_iterations", "model.moe.sinkhorn_tol"}
# Keys NxD Training reads that the Mixtral example leaves at their defaults: trn2's LNC (trn2_example) and the
# rotary base (megatron_gpt_model.py reads model.position_freq_base, default 10000).
ADDED = {"trainer.lnc", "model.position_freq_base"}


def flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolved_example() -> dict:
    """The example's values with its three interpolations worked out as NxD Training does."""
    example = dict(EXAMPLE)
    example["data.seq_length"] = example["model.max_position_embeddings"] = example["model.encoder_seq_length"]
    example["exp_manager.checkpoint_callback_params.model_parallel_size"] = (
        example["distributed_strategy.tensor_model_parallel_size"]
        * example["distributed_strategy.pipeline_model_parallel_size"]
    )
    return example


@pytest.fixture(scope="module")
def rendered_example() -> dict:
    train = load_train_config(FIXTURES / "mixtral-example-profile.yaml")
    rendered = render_nxdt_config(
        train,
        name="megatron_mixtral",
        nodes=EXAMPLE["trainer.num_nodes"],
        ranks_per_node=EXAMPLE["trainer.devices"],
        compile_cache="/fsx/neuron-compile-cache",
    )
    return flatten(rendered)


def test_every_profile_key_is_mapped_or_refused():
    keys = set(profile_keys(load_train_config(TRN2_PROFILE)))
    assert keys == MAPPED | FIXED
    assert not MAPPED & FIXED


def test_rendered_keys_are_the_keys_of_aws_example(rendered_example):
    assert set(rendered_example) == (set(EXAMPLE) - OMITTED) | ADDED


def test_aws_mixtral_example_renders_key_for_key(rendered_example):
    example = resolved_example()
    differing = {
        key: (example[key], rendered_example[key])
        for key in set(example) - OMITTED
        if key not in DELIBERATE and rendered_example[key] != example[key]
    }
    assert differing == {}


def test_deliberate_differences_really_differ(rendered_example):
    example = resolved_example()
    assert all(rendered_example[key] != example[key] for key in DELIBERATE)


def test_trn2_settings_are_those_of_aws_trn2_configurations():
    rendered = flatten(
        render_nxdt_config(
            load_train_config(TRN2_PROFILE), name="t", nodes=2, ranks_per_node=64, compile_cache="/fsx/c"
        )
    )
    assert {key: rendered[key] for key in REFERENCE["trn2_example"]} == REFERENCE["trn2_example"]


def test_shipped_trn2_profile_keeps_its_layout():
    train = load_train_config(TRN2_PROFILE)
    rendered = render_nxdt_config(train, name="t", nodes=2, ranks_per_node=64, compile_cache="/fsx/c")
    strategy, moe = rendered["distributed_strategy"], rendered["model"]["moe"]
    # AWS's Mixtral example's layout (megatron_mixtral_8x7b_config.yaml): tensor 32, expert 1, 32 key/value heads.
    assert (strategy["tensor_model_parallel_size"], strategy["expert_model_parallel_size"]) == (32, 1)
    assert (moe["capacity_factor"], moe["dropless"], moe["top_k"], moe["num_experts"]) == (2.0, False, 2, 8)
    assert rendered["model"]["num_kv_heads"] == 32 and rendered["trainer"]["num_nodes"] == 2


def test_a_profile_without_capacity_factor_renders_dropless():
    train = load_train_config(TRN2_PROFILE, ["moe.capacity_factor=null", "parallel.expert=1"])
    moe = render_nxdt_config(train, name="t", nodes=2, ranks_per_node=64, compile_cache="/c")["model"]["moe"]
    assert (moe["dropless"], moe["capacity_factor"]) == (True, 0.0)


def test_schedule_holds_min_lr_after_the_decay_as_moe_train_does():
    train = load_train_config(TRN2_PROFILE)  # 50,000 steps: 2,000 warm-up, 48,000 decay
    sched = render_nxdt_config(train, name="t", nodes=2, ranks_per_node=64, compile_cache="/c")["model"]["optim"]
    assert sched["sched"] | {"lr": sched["lr"]} == {
        "name": "CosineAnnealing",
        "warmup_steps": 2000,
        "constant_steps": 0,
        "min_lr": 3e-5,
        "lr": 3e-4,
    }
    shorter = load_train_config(TRN2_PROFILE, ["optim.decay_steps=40000"])
    rendered = render_nxdt_config(shorter, name="t", nodes=2, ranks_per_node=64, compile_cache="/c")
    assert rendered["model"]["optim"]["sched"]["constant_steps"] == 8000


def refused_keys(overrides: list[str], world_size: int = 128) -> set[str]:
    return {p.key for p in nxdt_problems(load_train_config(TRN2_PROFILE, overrides), world_size=world_size)}


@pytest.mark.parametrize(
    "override",
    [
        "moe.z_loss_coeff=0.001",
        "model.qk_layernorm=true",
        "model.multi_latent_attention=true,model.num_query_groups=null",
        "model.qkv_bias=true",
        "model.dense_layers=1,model.dense_ffn_hidden_size=14336",
        "moe.expert_bias=true,moe.score_function=sigmoid",
        "moe.shared_expert_ffn_hidden_size=1024",
        "moe.token_dispatcher=allgather",
        "data.pin_memory=true",
        "metrics.prometheus_port=9410",
        "checkpoint.save_initial=true",
    ],
)
def test_a_key_nxd_training_cannot_express_is_refused_by_name(override):
    # The first key is the one refused; the others make a profile moe-train accepts.
    assert override.split("=")[0] in refused_keys(override.split(","))


def test_the_shipped_trn2_profile_has_nothing_refused():
    assert refused_keys([]) == set()


def test_the_gpu_mixtral_profile_is_refused_key_by_key():
    train = load_train_config(ROOT / "training/configs/mixtral-8x7b.yaml")
    keys = {p.key for p in nxdt_problems(train, world_size=128)}
    assert {"moe.z_loss_coeff", "parallel.expert_tensor", "moe.capacity_factor", "metrics.file"} <= keys


def refusal(key: str, overrides: list[str], world_size: int = 128):
    train = load_train_config(TRN2_PROFILE, overrides)
    return next(p for p in nxdt_problems(train, world_size=world_size) if p.key == key)


def test_dropless_with_expert_parallelism_is_refused():
    assert "moe.capacity_factor" in refused_keys(["moe.capacity_factor=null", "parallel.expert=2"])


def test_the_dropless_hint_offers_only_capacity_factors_below_full_capacity():
    # 8 experts, top 2: 4.0 or more is full capacity, whose path cannot split experts over ranks in training.
    assert (
        "below moe.num_experts / moe.top_k (4)"
        in refusal("moe.capacity_factor", ["moe.capacity_factor=null", "parallel.expert=2"]).allowed
    )


def test_full_capacity_with_expert_parallelism_is_refused():
    assert "moe.capacity_factor" in refused_keys(["moe.capacity_factor=4.0", "parallel.expert=2"])


def test_a_capacity_factor_below_full_capacity_is_not_refused_for_expert_parallelism():
    assert "moe.capacity_factor" not in refused_keys(["moe.capacity_factor=3.9", "parallel.expert=2"])


def test_expert_parallelism_is_refused():
    assert "parallel.expert" in refused_keys(["parallel.expert=2"])


def test_tensor_8_at_lnc_2_is_refused_with_neuronx_distributed_named():
    found = refusal("parallel.tensor", ["parallel.tensor=8"])
    assert "parallel_state.py" in found.message and found.got == 8


@pytest.mark.parametrize("tensor", [16, 32])
def test_tensor_16_and_32_are_accepted_on_trn2(tensor):
    assert refused_keys([f"parallel.tensor={tensor}"]) == set()


def test_tensor_parallel_must_divide_the_key_value_heads():
    assert "parallel.tensor" in refused_keys(["model.num_query_groups=8"])


def test_a_sigmoid_router_is_refused():
    # NxD Training's top_k router scores with softmax whatever router_activation says.
    assert "moe.score_function" in refused_keys(["moe.score_function=sigmoid"])


def test_a_separate_expert_tensor_size_is_refused():
    assert "parallel.expert_tensor" in refused_keys(["parallel.expert=2", "parallel.expert_tensor=1"])


def test_a_decay_past_max_steps_is_refused():
    assert "optim.decay_steps" in refused_keys(["optim.decay_steps=49000"])


def test_the_byte_tokenizer_is_refused():
    assert "data.tokenizer" in refused_keys(["data.tokenizer=byte"])


def test_blended_data_needs_weights():
    assert "data.weights" in refused_keys(["data.prefixes=[/fsx/a,/fsx/b]"])


def test_render_raises_with_every_refused_key():
    train = load_train_config(TRN2_PROFILE, ["moe.z_loss_coeff=0.01", "data.pin_memory=true"])
    with pytest.raises(ConfigError) as error:
        render_nxdt_config(train, name="t", nodes=2, ranks_per_node=64, compile_cache="/c")
    assert {p.key for p in error.value.problems} == {"moe.z_loss_coeff", "data.pin_memory"}
