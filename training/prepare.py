"""``moe-data prepare``: documents from JSON lines or plain text, each followed by the
end-of-document token, written with megatron-core's ``IndexedDatasetBuilder`` as the .bin/.idx
files the trainer reads. The output appears atomically: all of it, or nothing.

Every problem with the input reads ``<key>: <what is wrong> (got <value>; allowed <what>)``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy
import torch

from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.training._megatron import quiet_import
from moe_cdk.training.tokenizers import Tokenizer

logger = logging.getLogger(__name__)

# Vocabularies below this fit the .bin files' uint16 token ids (megatron-core's own threshold).
UINT16_VOCAB_LIMIT = 65500


JSON_LINES_SUFFIXES = (".jsonl", ".json")


MAX_REPORTED_PROBLEMS = 20


_SNIPPET = 60


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of ``path``; raises ConfigError on invalid UTF-8."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError:
                got = _snippet(raw.decode("utf-8", errors="replace").rstrip("\n"))
                raise ConfigError(
                    [problem("not UTF-8 text", got=got, allowed="UTF-8 text").at(f"{path}:{number}")]
                ) from None


def _json_documents(path: Path, json_key: str, problems: list[Problem]) -> Iterator[str]:
    """Documents of a JSON-lines file; problems are appended to ``problems`` (reading stops at
    ``MAX_REPORTED_PROBLEMS``). Blank lines are skipped."""
    for number, line in _lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            problems.append(
                problem("not valid JSON", got=_snippet(line.rstrip()), allowed="one JSON object per line").at(
                    f"{where}"
                )
            )
        else:
            if not isinstance(record, dict):
                problems.append(
                    problem("not a JSON object", got=_snippet(line.rstrip()), allowed="one JSON object per line").at(
                        f"{where}"
                    )
                )
            elif json_key not in record:
                problems.append(
                    problem(
                        f"missing key {json_key!r}",
                        got=sorted(record),
                        allowed=f"an object with the document text under {json_key!r}",
                    ).at(where)
                )
            elif not isinstance(record[json_key], str):
                problems.append(
                    problem(f"{json_key!r} is not a string", got=record[json_key], allowed="a string").at(where)
                )
            else:
                yield record[json_key]
        if len(problems) >= MAX_REPORTED_PROBLEMS:
            return


def _text_documents(path: Path) -> Iterator[str]:
    """Documents of a plain-text file: runs of lines separated by one or more blank lines."""
    lines: list[str] = []
    for _, line in _lines(path):
        if line.strip():
            lines.append(line)
        elif lines:
            yield "".join(lines).rstrip("\r\n")
            lines = []
    if lines:
        yield "".join(lines).rstrip("\r\n")


def token_dtype(vocab_size: int) -> type[numpy.number]:
    """The .bin token type: uint16 for vocabularies below ``UINT16_VOCAB_LIMIT``, else int32."""
    return numpy.uint16 if vocab_size < UINT16_VOCAB_LIMIT else numpy.int32


def prepare(inputs: list[Path], output_prefix: Path, tokenizer: Tokenizer, json_key: str = "text") -> dict:
    """Tokenize ``inputs`` into ``<output_prefix>.bin`` and ``<output_prefix>.idx``.

    ``.jsonl``/``.json`` inputs are JSON lines with the text under ``json_key``; anything else is
    plain text with documents separated by blank lines. Empty documents are skipped; every other
    document is written as one sequence ending in ``tokenizer.eod``. Both files are written under
    a temporary name in the output directory and renamed into place only when everything
    succeeded. Raises ConfigError (nothing written) for a missing input or a bad line.

    Returns {"documents": n, "tokens": n_tokens, "bin": path, "idx": path}.
    """
    inputs = [Path(p) for p in inputs]
    output_prefix = Path(output_prefix)
    if not inputs:
        raise ConfigError([problem("no input files", got=[], allowed="one or more files").at("input")])
    missing = [
        problem("no such file", got=str(p), allowed="an existing file").at("input") for p in inputs if not p.is_file()
    ]
    if missing:
        raise ConfigError(missing)
    if not json_key:
        raise ConfigError([problem("empty key", got=json_key, allowed="a non-empty JSON key").at("json_key")])

    indexed_dataset = quiet_import("megatron.core.datasets.indexed_dataset")
    dtype = token_dtype(tokenizer.vocab_size)
    out_dir = output_prefix.parent
    writable = {"got": str(output_prefix), "allowed": "a writable location"}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            [problem(f"cannot create directory: {error.strerror}", **writable).at("output_prefix")]
        ) from None
    final_bin = Path(f"{output_prefix}.bin")
    final_idx = Path(f"{output_prefix}.idx")
    temp_prefix = out_dir / f".{output_prefix.name}.{os.getpid()}.tmp"
    temp_bin, temp_idx = Path(f"{temp_prefix}.bin"), Path(f"{temp_prefix}.idx")

    documents = tokens = 0
    problems: list[Problem] = []
    builder = None
    try:
        try:
            builder = indexed_dataset.IndexedDatasetBuilder(str(temp_bin), dtype=dtype)
        except OSError as error:
            raise ConfigError([problem(f"cannot write: {error.strerror}", **writable).at("output_prefix")]) from None
        for path in inputs:
            logger.info("tokenizing %s", path)
            if path.suffix.lower() in JSON_LINES_SUFFIXES:
                texts = _json_documents(path, json_key, problems)
            else:
                texts = _text_documents(path)
            try:
                for text in texts:
                    if problems or not text:
                        continue  # keep reading to report every bad line, but write nothing more
                    ids = tokenizer.encode(text)
                    ids.append(tokenizer.eod)
                    try:
                        builder.add_item(torch.tensor(ids, dtype=torch.int64))
                        builder.end_document()
                    except OSError as error:
                        raise ConfigError(
                            [problem(f"cannot write: {error.strerror}", **writable).at("output_prefix")]
                        ) from None
                    documents += 1
                    tokens += len(ids)
            except ConfigError as error:  # invalid UTF-8 or a write failure: keep what was found before it
                raise ConfigError(problems + error.problems) from None
            except OSError as error:
                raise ConfigError(
                    [problem(f"cannot read: {error.strerror}", got=str(path), allowed="a readable file").at("input")]
                ) from None
            if len(problems) >= MAX_REPORTED_PROBLEMS:
                break
        if problems:
            raise ConfigError(problems)
        if documents == 0:
            raise ConfigError(
                [
                    problem("no documents", got=[str(p) for p in inputs], allowed="files with a non-empty document").at(
                        "input"
                    )
                ]
            )
        try:
            builder.finalize(str(temp_idx))
            os.replace(temp_bin, final_bin)
            os.replace(temp_idx, final_idx)
        except OSError as error:
            raise ConfigError([problem(f"cannot write: {error.strerror}", **writable).at("output_prefix")]) from None
    except BaseException:
        if builder is not None:
            builder.data_file.close()
        for leftover in (temp_bin, temp_idx):
            leftover.unlink(missing_ok=True)
        raise

    logger.info("wrote %d documents, %d tokens to %s and %s", documents, tokens, final_bin, final_idx)
    return {"documents": documents, "tokens": tokens, "bin": str(final_bin), "idx": str(final_idx)}
