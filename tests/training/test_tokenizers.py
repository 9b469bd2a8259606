"""The tokenizers: bytes with an end-of-document token, and a Hugging Face tokenizer.json."""

from __future__ import annotations

import pytest

from moe_cdk.training.data.tokenizers import ByteTokenizer, JsonTokenizer, load_tokenizer


def test_byte_tokenizer_round_trip_and_eod():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("héllo")
    assert ids == list("héllo".encode("utf-8"))
    assert tokenizer.decode(ids + [tokenizer.eod]) == "héllo"
    assert (tokenizer.eod, tokenizer.vocab_size) == (256, 257)
    assert isinstance(load_tokenizer(None), ByteTokenizer) and isinstance(load_tokenizer("byte"), ByteTokenizer)


def test_json_tokenizer_wraps_a_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "hello": 2, "world": 3}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))

    tokenizer = load_tokenizer(str(path))
    assert isinstance(tokenizer, JsonTokenizer)
    assert (tokenizer.eod, tokenizer.vocab_size) == (1, 4)
    assert tokenizer.encode("hello world") == [2, 3]
    assert tokenizer.decode([2, 3]) == "hello world"


def test_json_tokenizer_without_an_eod_token_is_an_error(tmp_path):
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(path))
    with pytest.raises(
        ValueError, match=rf"^tokenizer: no end-of-document token \(got '{path}'; allowed .*'<\|endoftext\|>'"
    ):
        JsonTokenizer(path)
