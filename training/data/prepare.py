"""``moe-data prepare``: documents from JSON lines or plain text, each followed by the
end-of-document token, written with megatron-core's ``IndexedDatasetBuilder`` as the .bin/.idx
files the trainer reads. The output appears atomically: all of it, or nothing.

Reading, checking and writing happen in this process, in input order; tokenizing runs in
``workers`` processes (spawned, so no thread of this one is forked), batch by batch, and the
batches are written in the order they were read: the files are the same bytes whatever the
number of workers.

Every problem with the input reads ``<key>: <what is wrong> (got <value>; allowed <what>)``.
"""

from __future__ import annotations

import collections
import json
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy

from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.training.data.tokenizers import Tokenizer
from moe_cdk.training.step._megatron import quiet_import

logger = logging.getLogger(__name__)

# Vocabularies below this fit the .bin files' uint16 token ids (megatron-core's own threshold).
UINT16_VOCAB_LIMIT = 65500


JSON_LINES_SUFFIXES = (".jsonl", ".json")


MAX_REPORTED_PROBLEMS = 20

# Documents go to a worker in batches of about this many characters: large enough that sending a
# batch and its tokens costs little next to tokenizing it, small enough to keep every worker busy.
BATCH_CHARS = 1 << 20

# Batches sent ahead per worker: enough to keep the workers busy while this process imports
# megatron-core for writing (about 4 s here), at a few MiB of memory each.
BATCHES_IN_FLIGHT_PER_WORKER = 8

# How often, at most, ``prepare`` calls its ``progress`` callback.
PROGRESS_INTERVAL_S = 0.2


_SNIPPET = 60


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


class _ReadBytes:
    """The inputs' bytes read so far, passed to ``progress(done, total)`` at most every
    ``PROGRESS_INTERVAL_S`` and once more by ``finish``."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None):
        self.done, self.total, self.progress = 0, total, progress
        self._reported_at = time.monotonic()

    def add(self, count: int) -> None:
        self.done += count
        if self.progress is not None and time.monotonic() - self._reported_at >= PROGRESS_INTERVAL_S:
            self._reported_at = time.monotonic()
            self.progress(self.done, self.total)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)


def _lines(path: Path, read: _ReadBytes) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of ``path``; raises ConfigError on invalid UTF-8."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            read.add(len(raw))
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError:
                got = _snippet(raw.decode("utf-8", errors="replace").rstrip("\n"))
                raise ConfigError(
                    [problem("not UTF-8 text", got=got, allowed="UTF-8 text").at(f"{path}:{number}")]
                ) from None


def _json_documents(path: Path, json_key: str, problems: list[Problem], read: _ReadBytes) -> Iterator[str]:
    """Documents of a JSON-lines file; problems are appended to ``problems`` (reading stops at
    ``MAX_REPORTED_PROBLEMS``). Blank lines are skipped."""
    for number, line in _lines(path, read):
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


def _text_documents(path: Path, read: _ReadBytes) -> Iterator[str]:
    """Documents of a plain-text file: runs of lines separated by one or more blank lines."""
    lines: list[str] = []
    for _, line in _lines(path, read):
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


def _documents(inputs: list[Path], json_key: str, problems: list[Problem], read: _ReadBytes) -> Iterator[str]:
    """The non-empty documents of ``inputs`` in order. After the first problem the inputs are
    still read, to report every bad line (up to ``MAX_REPORTED_PROBLEMS``), but nothing more is
    yielded. Raises ConfigError for invalid UTF-8 or an unreadable file, with the problems before it."""
    for path in inputs:
        logger.info("tokenizing %s", path)
        if path.suffix.lower() in JSON_LINES_SUFFIXES:
            texts = _json_documents(path, json_key, problems, read)
        else:
            texts = _text_documents(path, read)
        try:
            for text in texts:
                if text and not problems:
                    yield text
        except ConfigError as error:
            raise ConfigError(problems + error.problems) from None
        except OSError as error:
            raise ConfigError(
                [problem(f"cannot read: {error.strerror}", got=str(path), allowed="a readable file").at("input")]
            ) from None
        if len(problems) >= MAX_REPORTED_PROBLEMS:
            return


def _batches(documents: Iterator[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for text in documents:
        batch.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _encode(tokenizer: Tokenizer, texts: list[str], dtype: type[numpy.number]) -> list[numpy.ndarray]:
    """Each text's tokens and then ``tokenizer.eod``, as one array of ``dtype`` per text."""
    encoded = []
    for text in texts:
        ids = tokenizer.encode(text)
        ids.append(tokenizer.eod)
        encoded.append(numpy.array(ids, dtype=dtype))
    return encoded


_worker_tokenizer: Tokenizer | None = None


def _start_worker(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    # A Ctrl-C reaches the whole foreground process group: the parent stops the pool and says so once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_tokenizer = tokenizer


def _encode_in_worker(texts: list[str], dtype: type[numpy.number]) -> list[numpy.ndarray]:
    assert _worker_tokenizer is not None, "the pool's initializer sets the tokenizer"
    return _encode(_worker_tokenizer, texts, dtype)


def _encoded(
    batches: Iterator[list[str]], tokenizer: Tokenizer, dtype: type[numpy.number], workers: int
) -> Iterator[list[numpy.ndarray]]:
    """The encoded ``batches``, in their order: here with one worker, else in a pool of ``workers``
    processes with at most ``BATCHES_IN_FLIGHT_PER_WORKER`` batches per worker sent ahead (the
    inputs are read only that far ahead). A worker that dies (the kernel's OOM killer) is a
    ConfigError at ``workers``."""
    if workers == 1:
        for batch in batches:
            yield _encode(tokenizer, batch, dtype)
        return
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(tokenizer,))
    pending: collections.deque = collections.deque()
    try:
        for batch in batches:
            pending.append(pool.submit(_encode_in_worker, batch, dtype))
            if len(pending) >= BATCHES_IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        raise ConfigError(
            [
                problem(
                    "a tokenizing process died (killed for memory?)",
                    got=workers,
                    allowed="fewer workers, or more memory",
                ).at("workers")
            ]
        ) from None
    finally:
        pool.shutdown(cancel_futures=True)


def prepare(
    inputs: list[Path],
    output_prefix: Path,
    tokenizer: Tokenizer,
    json_key: str = "text",
    *,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Tokenize ``inputs`` into ``<output_prefix>.bin`` and ``<output_prefix>.idx``.

    ``.jsonl``/``.json`` inputs are JSON lines with the text under ``json_key``; anything else is
    plain text with documents separated by blank lines. Empty documents are skipped; every other
    document is written as one sequence ending in ``tokenizer.eod``. ``workers`` processes
    tokenize (1: this one); the output does not depend on how many. ``progress(done, total)``
    is called with the input bytes read so far and in all, every ``PROGRESS_INTERVAL_S`` at
    most and once at the end. Both files are written under a temporary name in the output
    directory and renamed into place only when everything succeeded. Raises ConfigError
    (nothing written) for a missing input, a bad line or a bad argument.

    Returns {"documents": n, "tokens": n_tokens, "bin": path, "idx": path}.
    """
    inputs = [Path(p) for p in inputs]
    output_prefix = Path(output_prefix)
    if not inputs:
        raise ConfigError([problem("no input files", got=[], allowed="one or more files").at("input")])
    refused = [
        problem("no such file", got=str(p), allowed="an existing file").at("input") for p in inputs if not p.is_file()
    ]
    if not json_key:
        refused.append(problem("empty key", got=json_key, allowed="a non-empty JSON key").at("json_key"))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        refused.append(problem("not a whole number of at least 1", got=workers, allowed="1, 2, ...").at("workers"))
    if refused:
        raise ConfigError(refused)

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
    read = _ReadBytes(sum(p.stat().st_size for p in inputs), progress)
    builder = None
    try:
        batches = _batches(_documents(inputs, json_key, problems, read))
        for encoded in _encoded(batches, tokenizer, dtype, workers):
            if problems:
                continue  # what was read before the first problem: never renamed into place
            if builder is None:
                # Only now: megatron-core and torch take seconds to import, while the workers
                # (which need neither) tokenize the batches already sent to them.
                indexed_dataset = quiet_import("megatron.core.datasets.indexed_dataset")
                import torch

                try:
                    builder = indexed_dataset.IndexedDatasetBuilder(str(temp_bin), dtype=dtype)
                except OSError as error:
                    raise ConfigError(
                        [problem(f"cannot write: {error.strerror}", **writable).at("output_prefix")]
                    ) from None
            for ids in encoded:
                try:
                    builder.add_item(torch.from_numpy(ids))
                    builder.end_document()
                except OSError as error:
                    raise ConfigError(
                        [problem(f"cannot write: {error.strerror}", **writable).at("output_prefix")]
                    ) from None
                documents += 1
                tokens += ids.size
        read.finish()
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
