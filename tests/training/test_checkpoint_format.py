"""The trainer's checkpoint reader and writer (training/checkpoints/format.py) against torch's own
reader and megatron's stock writer, through tests/checkpoint_format_probe.py in one process."""

from __future__ import annotations

import pytest
from trainer_runs import ROOT, probe_result

PROBE = ROOT / "tests/checkpoint_format_probe.py"


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    return probe_result(PROBE, str(tmp_path_factory.mktemp("checkpoint-format")))


def test_every_case_loads_what_torchs_reader_loads(probe):
    assert probe["cases"] == {name: {"equals_reference": True, "equals_saved": True} for name in probe["cases"]}


def test_whole_contiguous_tensors_are_read_in_place_and_the_rest_copied(probe):
    # in place: fp32, bf16, int64, a scalar, 3 floats; copied: a transposed tensor, and the
    # archive two fragments are read from
    assert probe["paths"] == {"in_place": 5, "copied": 2}


def test_a_non_contiguous_target_is_copied_into(probe):
    assert probe["non_contiguous_target"] == {"equals_reference": True, "equals_saved": True}
    assert probe["non_contiguous_paths"] == {"in_place": 4, "copied": 3}


def test_a_wrong_guess_of_where_the_bytes_start_is_caught_and_copied_instead(probe):
    assert probe["wrong_offset_paths"] == {"in_place": 0, "copied": 7}
    assert all(case == {"equals_reference": True, "equals_saved": True} for case in probe["wrong_offset"].values())


def test_archives_are_written_without_checksums(probe):
    assert not any(probe["checksums"]["ours"]["written"])
    # the check can tell: megatron's stock writer sets them, and right
    assert all(probe["checksums"]["stock"]["written"]) and all(probe["checksums"]["stock"]["right"])


def test_the_checksum_setting_is_restored_after_a_save(probe):
    assert probe["crc_setting_after_save"] is True


def test_files_are_written_by_threads_without_a_fork(probe):
    # a fork write-protects every page of the rank, and each page it writes next faults
    assert probe["forks_during_save"]["ours"] == 0
    assert probe["forks_during_save"]["stock"] > 0  # the count can tell: megatron's writer forks


def test_every_data_file_has_a_crc32c_record_of_itself_and_each_item(probe):
    assert probe["records_match"] and all(probe["records_match"].values())


def test_a_flipped_byte_fails_the_load_naming_the_file_and_the_item(probe):
    name, byte = probe["flipped_file"], probe["flipped_byte"]
    assert probe["flipped_load"].startswith(f"{name}: the ") and "has CRC32C" in probe["flipped_load"]
    at = int(probe["flipped_load"].split(" at byte ")[1].split()[0])
    length = int(probe["flipped_load"].split(": the ")[1].split("-byte")[0])
    assert at <= byte < at + length


def test_verify_file_reports_the_flipped_byte_and_passes_intact_files(probe):
    assert probe["verify_flipped"] == probe["flipped_load"]
    assert probe["verify_ours"] == [None] * len(probe["records_match"])


def test_files_without_a_record_load_unchecked_with_one_warning(probe):
    assert probe["unrecorded_equals_saved"] is True
    [warning] = probe["unrecorded_warnings"]
    assert "4 file(s) read without a checksum record" in warning


def test_a_planner_that_keeps_state_between_resolve_and_commit_is_held_by_one_reader(probe):
    assert probe["planner_lock"] == {
        "stateful": {"held_in_block": True, "committed": True, "released": True},
        "stateless": {"held_in_block": False, "committed": True, "released": True},
    }
