"""``prepare``: documents into megatron-core's .bin/.idx, atomically, with every bad line reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from data_files import PLAIN_DOCUMENTS, PLAIN_TEXT, documents_of, indexed_dataset

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.data import prepare as prepare_module
from moe_cdk.training.data.prepare import prepare
from moe_cdk.training.data.tokenizers import ByteTokenizer, load_tokenizer


def test_prepare_plain_text_splits_documents_on_blank_lines(tmp_path):
    source = tmp_path / "corpus.txt"
    source.write_text(PLAIN_TEXT)
    result = prepare([source], tmp_path / "corpus", ByteTokenizer())
    expected_tokens = sum(len(d.encode("utf-8")) + 1 for d in PLAIN_DOCUMENTS)
    assert result == {
        "documents": 3,
        "tokens": expected_tokens,
        "bin": str(tmp_path / "corpus.bin"),
        "idx": str(tmp_path / "corpus.idx"),
    }
    assert documents_of(tmp_path / "corpus") == PLAIN_DOCUMENTS


def test_prepare_jsonl_reads_the_json_key(tmp_path):
    source = tmp_path / "corpus.jsonl"
    source.write_text(json.dumps({"body": "alpha", "id": 1}) + "\n\n" + json.dumps({"body": "beta"}) + "\n")
    result = prepare([source], tmp_path / "corpus", ByteTokenizer(), json_key="body")
    assert result["documents"] == 2
    assert indexed_dataset(tmp_path / "corpus").document_indices.tolist() == [0, 1, 2]
    assert documents_of(tmp_path / "corpus") == ["alpha", "beta"]


def test_prepare_bad_json_line_is_reported_and_writes_nothing(tmp_path):
    source = tmp_path / "corpus.jsonl"
    source.write_text('{"text": "fine"}\n{not json\n{"other": "x"}\n')
    with pytest.raises(ConfigError) as caught:
        prepare([source], tmp_path / "corpus", ByteTokenizer())
    assert caught.value.errors == [
        f"{source}:2: not valid JSON (got '{{not json'; allowed one JSON object per line)",
        f"{source}:3: missing key 'text' (got ['other']; allowed an object with the document text under 'text')",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]


def _mixed_corpus(folder):
    """A JSON-lines and a plain-text file, enough documents for several batches at BATCH_CHARS=64."""
    jsonl = folder / "a.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"document {i} " + "é" * (i % 7) * 9}) + "\n" for i in range(60)))
    text = folder / "b.txt"
    text.write_text("\n\n".join(f"plain {i}\nsecond line {i}" for i in range(40)) + "\n")
    return [jsonl, text]


def _bpe_tokenizer(folder, inputs):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.train([str(p) for p in inputs], trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "</s>"]))
    hf.save(str(folder / "tokenizer.json"))
    return load_tokenizer(str(folder / "tokenizer.json"))


@pytest.mark.parametrize("tokenizer_kind", ["byte", "bpe"])
def test_prepare_with_two_workers_writes_the_bytes_one_writes(tmp_path, monkeypatch, tokenizer_kind):
    monkeypatch.setattr(prepare_module, "BATCH_CHARS", 64)  # many batches, so their order is tested
    inputs = _mixed_corpus(tmp_path)
    tokenizer = ByteTokenizer() if tokenizer_kind == "byte" else _bpe_tokenizer(tmp_path, inputs)
    one = prepare(inputs, tmp_path / "one" / "c", tokenizer, workers=1)
    two = prepare(inputs, tmp_path / "two" / "c", tokenizer, workers=2)
    assert (one["documents"], one["tokens"]) == (two["documents"], two["tokens"]) == (one["documents"], one["tokens"])
    assert one["documents"] == 100
    for suffix in (".bin", ".idx"):
        assert (tmp_path / "one" / f"c{suffix}").read_bytes() == (tmp_path / "two" / f"c{suffix}").read_bytes()


def test_prepare_with_two_workers_reports_every_bad_line_and_writes_nothing(tmp_path):
    source = tmp_path / "corpus.jsonl"
    source.write_text('{"text": "fine"}\n' * 50 + "{not json\n" + '{"text": "fine"}\n' * 50 + '{"other": "x"}\n')
    with pytest.raises(ConfigError) as caught:
        prepare([source], tmp_path / "out" / "corpus", ByteTokenizer(), workers=2)
    assert caught.value.errors == [
        f"{source}:51: not valid JSON (got '{{not json'; allowed one JSON object per line)",
        f"{source}:102: missing key 'text' (got ['other']; allowed an object with the document text under 'text')",
    ]
    assert list((tmp_path / "out").iterdir()) == []


def test_prepare_refuses_workers_below_one(tmp_path):
    source = tmp_path / "corpus.txt"
    source.write_text("one\n")
    with pytest.raises(ConfigError) as caught:
        prepare([source], tmp_path / "corpus", ByteTokenizer(), workers=0)
    assert caught.value.errors == ["workers: not a whole number of at least 1 (got 0; allowed 1, 2, ...)"]


def test_prepare_reports_progress_in_input_bytes_up_to_the_total(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "PROGRESS_INTERVAL_S", 0.0)
    inputs = _mixed_corpus(tmp_path)
    total = sum(p.stat().st_size for p in inputs)
    calls = []
    prepare(inputs, tmp_path / "c", ByteTokenizer(), progress=lambda done, of: calls.append((done, of)))
    assert len(calls) > 100 and calls[-1] == (total, total)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls) and {of for _, of in calls} == {total}


class _DyingTokenizer(ByteTokenizer):
    """Ends its process at the first document, as the kernel's OOM killer would."""

    def encode(self, text: str) -> list[int]:
        os._exit(137)


def test_prepare_reports_a_tokenizing_process_that_died_and_writes_nothing(tmp_path):
    source = tmp_path / "corpus.txt"
    source.write_text("one\n\ntwo\n")
    with pytest.raises(ConfigError) as caught:
        prepare([source], tmp_path / "out" / "corpus", _DyingTokenizer(), workers=2)
    assert caught.value.errors == [
        "workers: a tokenizing process died (killed for memory?) (got 2; allowed fewer workers, or more memory)"
    ]
    assert list((tmp_path / "out").iterdir()) == []


def _as_a_terminals_foreground_job() -> None:
    # There Ctrl-C has its default action. A shell without job control (a CI script) ignores SIGINT in the
    # background jobs it starts, and pytest's processes would pass that on to this one.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_says_one_line_exits_130_and_leaves_no_file(tmp_path, workers):
    source = tmp_path / "corpus.txt"
    source.write_text(
        "moe expert router token " * 20 + "\n\n" * 1 + ("alpha beta gamma delta " * 20 + "\n\n") * 400_000
    )
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "moe_cdk.cli.data", "prepare", "--input", str(source), "--output-prefix",
         str(out / "corpus"), "--workers", str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_as_a_terminals_foreground_job,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (out.is_dir() and any(out.iterdir())) and time.monotonic() < deadline:  # writing has begun
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert f"interrupted: {out / 'corpus'}.bin and .idx were not written" in stderr
    assert list(out.iterdir()) == []
