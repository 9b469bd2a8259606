"""Text corpora and readers for the data tests (test_prepare, test_dataset)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_cdk.training.data.prepare import prepare
from moe_cdk.training.data.tokenizers import ByteTokenizer

PLAIN_TEXT = "first document\nstill the first\n\n\nsecond document\n\nthird é\n"


PLAIN_DOCUMENTS = ["first document\nstill the first", "second document", "third é"]


def indexed_dataset(prefix: Path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(str(prefix))


def documents_of(prefix: Path) -> list[str]:
    """Decode every document of a prepared prefix, checking each ends with the byte tokenizer's eod."""
    dataset = indexed_dataset(prefix)
    texts = []
    for i in range(len(dataset)):
        ids = dataset[i].tolist()
        assert ids[-1] == ByteTokenizer.EOD
        texts.append(ByteTokenizer().decode(ids[:-1]))
    return texts


def split_on_eod(ids: list[int]) -> list[bytes]:
    pieces, current = [], []
    for token in ids:
        if token == ByteTokenizer.EOD:
            pieces.append(bytes(current))
            current = []
        else:
            current.append(token)
    return pieces + [bytes(current)]


@pytest.fixture
def text_prefix(tmp_path: Path) -> Path:
    source = tmp_path / "corpus.txt"
    source.write_text(PLAIN_TEXT * 4)
    prefix = tmp_path / "out" / "corpus"
    prepare([source], prefix, ByteTokenizer())
    return prefix
