"""Each torch and megatron-core internal that training/checkpoints/format.py uses, taken away: the
module still imports, names the internal, and hands out megatron's stock strategy for that side,
which saves and loads (tests/checkpoint_fallback_probe.py, in one process)."""

from __future__ import annotations

import pytest
from trainer_runs import ROOT, probe_result

PROBE = ROOT / "tests/checkpoint_fallback_probe.py"
SAVE_INTERNALS = 5
LOAD_INTERNALS = 7


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    return probe_result(PROBE, str(tmp_path_factory.mktemp("checkpoint-fallback")))


def _internals(probe, side: str) -> dict:
    return {key: case for key, case in probe["internals"].items() if case[f"{side}_problems"]}


def test_every_internal_is_present_on_the_suites_versions(probe):
    assert probe["all_present"] == {"save_problems": [], "load_problems": []}
    assert len(probe["internals"]) == SAVE_INTERNALS + LOAD_INTERNALS


def test_each_missing_internal_is_the_one_problem_named(probe):
    for key, case in probe["internals"].items():
        (problem,) = case["save_problems"] + case["load_problems"]
        assert problem.startswith(f"{key}: "), problem


def test_a_missing_save_internal_hands_out_megatrons_save_and_keeps_our_load(probe):
    cases = _internals(probe, "save")
    assert len(cases) == SAVE_INTERNALS
    assert {(c["save"], c["load"]) for c in cases.values()} == {
        ("TorchDistSaveShardedStrategy", "SequentialLoadShardedStrategy")
    }


def test_a_missing_load_internal_hands_out_megatrons_load_and_keeps_our_save(probe):
    cases = _internals(probe, "load")
    assert len(cases) == LOAD_INTERNALS
    assert {(c["save"], c["load"]) for c in cases.values()} == {
        ("ChecksummedSaveStrategy", "TorchDistLoadShardedStrategy")
    }


def test_the_fallback_warns_once_with_the_versions_and_the_internal(probe):
    for key, case in probe["internals"].items():
        (warning,) = case["warnings"]
        assert f"is off on {probe['versions']}" in warning and key in warning


def test_the_strategies_handed_out_without_an_internal_save_and_load(probe):
    assert all(case["round_trip"] for case in probe["internals"].values())


def test_a_save_request_that_runs_another_writer_is_left_to_megatron(probe):
    other = probe["other_writer"]
    assert other["round_trip"] and other["checksum_records"] == 0
    (warning,) = other["warnings"]
    assert "megatron-core's writer runs instead" in warning
