"""``moe-cdk plan`` on Trainium2: the tensor-parallel sizes a trn2 node runs at LNC 2, the shipped layout, and the
note on where the expert-parallel all-to-all runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_cdk.cli.main import main
from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError
from moe_cdk.schema.config import load_config
from moe_cdk.tools.plan import plan
from moe_cdk.training.config import load_train_config
from moe_cdk.training.step.parallel import plan_layout, tensor_limit

ROOT = Path(__file__).resolve().parents[2]
TRN2 = load_config(ROOT / "config/trn2.yaml")
PROFILE = ROOT / "training/configs/mixtral-8x7b-trn2.yaml"
TRN2_LIMIT = tensor_limit(catalog.lookup("ml.trn2.48xlarge"))


def test_the_shipped_trn2_layout_is_accepted_and_fits():
    result = plan(TRN2)
    assert (result.memory.layout.tensor, result.memory.layout.expert) == (32, 1)
    assert result.memory.fits and not result.problems


def test_plan_command_accepts_the_shipped_trn2_configuration(capsys):
    assert main(["plan", "--config", str(ROOT / "config/trn2.yaml")]) == 0


@pytest.mark.parametrize("tensor", [16, 32])
def test_a_trn2_node_takes_tensor_parallel_sizes_beyond_8(tensor):
    train = load_train_config(PROFILE, [f"parallel.tensor={tensor}"])
    assert plan_layout(train, 128, limit=TRN2_LIMIT).tensor == tensor


def test_tensor_8_at_lnc_2_is_refused_with_the_neuronx_distributed_source():
    train = load_train_config(PROFILE, ["parallel.tensor=8"])
    with pytest.raises(ConfigError) as error:
        plan_layout(train, 128, limit=TRN2_LIMIT)
    [found] = error.value.problems
    assert found.key == "parallel.tensor" and "parallel_state.py@fecfe75, line 360" in found.message
    assert found.allowed == "1, 2, 4, 16, 32, 64"


def test_plan_command_refuses_tensor_8_on_trn2(capsys):
    assert main(["plan", "--config", str(ROOT / "config/trn2.yaml"), "--set", "parallel.tensor=8"]) == 2
    assert "training.profile: parallel.tensor" in capsys.readouterr().err


def test_gpu_nodes_keep_their_nvlink_limit():
    train = load_train_config(PROFILE, ["parallel.tensor=16"])
    with pytest.raises(ConfigError, match="one node's 8 GPUs"):
        plan_layout(train, 128)


def test_an_expert_group_of_one_trn2_nodes_ranks_is_not_noted_as_crossing_efa():
    # EP 4 x TP 16 = 64 consecutive ranks: one trn2 node at LNC 2, so the all-to-all stays on NeuronLink.
    result = plan(TRN2, train_overrides=["parallel.tensor=16", "parallel.expert=4"])
    assert not any("spans nodes" in note for note in result.notes)


def test_an_expert_group_past_a_trn2_node_is_noted_with_neuronlink():
    result = plan(TRN2, train_overrides=["parallel.tensor=32", "parallel.expert=4"])
    [note] = [note for note in result.notes if "spans nodes" in note]
    assert "128 ranks, 64 ranks per node" in note and note.endswith("crosses EFA, not NeuronLink")
