"""moe-train plot: records read as the trainer writes them, the experts' load by hand, and the PNG."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.metrics_plot import expert_load, read_records, render

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _record(step: int, loss: float, tokens: list[list[int]]) -> dict:
    return {"step": step, "loss": loss, "lr": 1e-3, "tokens_per_expert": tokens, "expert_imbalance": [None, 1.5]}


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_step_written_twice_keeps_the_record_of_the_run_that_continued(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [_record(1, 5.0, []), _record(2, 4.0, []), _record(2, 3.9, []), _record(3, 3.5, [])])
    assert [(r["step"], r["loss"]) for r in read_records(path)] == [(1, 5.0), (2, 3.9), (3, 3.5)]


def test_load_is_each_experts_share_over_an_even_one_averaged_and_without_dense_layers():
    # Layer 0 is dense (nothing routed); layer 1 sends 3/4 then 1/2 of its tokens to expert 0 of 2.
    records = [_record(1, 5.0, [[0, 0], [30, 10]]), _record(2, 4.0, [[0, 0], [20, 20]])]
    assert expert_load(records) == ([1], [[1.25, 0.75]])
    assert expert_load(records, window=1) == ([1], [[1.0, 1.0]])


def test_a_line_that_is_not_a_record_is_named_by_its_number(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_record(1, 5.0, [])) + "\nnot json\n" + json.dumps({"step": 3}) + "\n")
    with pytest.raises(ConfigError) as error:
        read_records(path)
    assert [line.split(":", 2)[1] for line in error.value.errors] == ["2", "3"]


def test_an_unfinished_last_line_is_left_out_and_the_rest_read(tmp_path):
    # What a running or crashed trainer leaves: the last record cut short, without its newline.
    path = tmp_path / "metrics.jsonl"
    whole = json.dumps(_record(1, 5.0, [])) + "\n" + json.dumps(_record(2, 4.0, [])) + "\n"
    path.write_text(whole + json.dumps(_record(3, 3.0, []))[:25])
    assert [r["step"] for r in read_records(path)] == [1, 2]


def test_a_file_that_is_not_utf8_is_one_problem_naming_the_byte(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 5.0}\n\xff\xfe\n')
    with pytest.raises(ConfigError) as error:
        read_records(path)
    assert error.value.errors == [
        f"{path}: not UTF-8 text (got 'byte 0xff at offset 25'; allowed a metrics.jsonl the trainer wrote)"
    ]


def test_an_empty_file_has_no_records(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match="no records"):
        read_records(tmp_path / "metrics.jsonl")


def test_render_writes_a_png(tmp_path):
    records = [_record(s, 5.0 - s / 10, [[0, 0], [10 + s, 30 - s]]) for s in range(1, 21)]
    out = render(records, tmp_path / "run.png", title="test", window=5)
    assert out.read_bytes()[:8] == PNG_SIGNATURE and out.stat().st_size > 10_000


def test_the_command_writes_beside_the_file_and_refuses_a_missing_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [_record(s, 5.0 - s / 10, [[0, 0], [10 + s, 30 - s]]) for s in range(1, 4)])
    command = [sys.executable, "-m", "moe_cdk.cli.train", "plot"]
    done = subprocess.run([*command, str(path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote {tmp_path / 'metrics.png'}\n"
    assert (tmp_path / "metrics.png").read_bytes()[:8] == PNG_SIGNATURE
    missing = subprocess.run([*command, str(tmp_path / "none.jsonl")], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert f"  {tmp_path / 'none.jsonl'}: cannot read the file (got 'No such file or directory'" in missing.stderr
