"""``prepare``: documents into megatron-core's .bin/.idx, atomically, with every bad line reported."""

from __future__ import annotations

import json

import pytest
from data_files import PLAIN_DOCUMENTS, PLAIN_TEXT, documents_of, indexed_dataset

from moe_cdk.core.problems import ConfigError
from moe_cdk.training.prepare import prepare
from moe_cdk.training.tokenizers import ByteTokenizer


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
