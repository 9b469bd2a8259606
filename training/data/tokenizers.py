"""Tokenizers for ``moe-data prepare`` and the trainer: ``ByteTokenizer`` (UTF-8 bytes, no
download) and ``JsonTokenizer`` (a Hugging Face ``tokenizer.json``), both with
``encode``/``decode``/``vocab_size``/``eod``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from moe_cdk.core.problems import ConfigError, problem

logger = logging.getLogger(__name__)


EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255 and end-of-document as 256; needs no files."""

    EOD = 256

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eod(self) -> int:
        return self.EOD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes back to text; end-of-document tokens are dropped, invalid UTF-8 is replaced."""
        bad = [i for i in ids if not 0 <= int(i) <= self.EOD]
        if bad:
            raise ConfigError([problem("token id out of range", got=int(bad[0]), allowed="0-256").at("ids")])
        return bytes(int(i) for i in ids if int(i) != self.EOD).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class JsonTokenizer:
    """A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library.

    The end-of-document token is the first of ``EOD_CANDIDATES`` found in the vocabulary.
    """

    def __init__(self, path: str | os.PathLike[str]):
        import tokenizers

        self.path = str(path)
        allowed = "'byte' or a Hugging Face tokenizer.json file"
        if not Path(self.path).is_file():
            raise ConfigError([problem("no such file", got=self.path, allowed=allowed).at("tokenizer")])
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(self.path)
        except Exception as error:  # the Rust side raises a bare Exception for any parse failure
            logger.debug("tokenizers could not load %s: %s", self.path, error)
            raise ConfigError(
                [problem("not a Hugging Face tokenizer.json", got=self.path, allowed=allowed).at("tokenizer")]
            ) from None
        for token in EOD_CANDIDATES:
            token_id = self._tokenizer.token_to_id(token)
            if token_id is not None:
                self._eod = int(token_id)
                break
        else:
            allowed = "a vocabulary with one of " + ", ".join(repr(t) for t in EOD_CANDIDATES)
            raise ConfigError([problem("no end-of-document token", got=self.path, allowed=allowed).at("tokenizer")])

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def eod(self) -> int:
        return self._eod

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"JsonTokenizer({self.path!r})"


Tokenizer = ByteTokenizer | JsonTokenizer


def load_tokenizer(path: str | None) -> Tokenizer:
    """``None`` or ``"byte"``: the byte tokenizer; anything else: a ``tokenizer.json`` path."""
    if path is None or path == "byte":
        return ByteTokenizer()
    return JsonTokenizer(path)
