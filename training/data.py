"""Training data: tokenize raw text into megatron-core's .bin/.idx format and serve it back.

Three pieces, used by ``moe-data prepare`` (offline) and the trainer (online):

* tokenizers: ``ByteTokenizer`` (UTF-8 bytes, no download) and ``JsonTokenizer`` (a Hugging
  Face ``tokenizer.json``), both with ``encode``/``decode``/``vocab_size``/``eod``;
* ``prepare``: documents from JSON lines or plain text, each followed by the end-of-document
  token, written with megatron-core's ``IndexedDatasetBuilder``. Output appears atomically;
* ``build_gpt_dataset`` + ``ResumableSampler`` + ``make_dataloader``: megatron-core's
  ``GPTDataset`` (blended, shuffled, cached index files) fed in a deterministic order that a
  restarted job continues from ``consumed_samples``.

megatron-core is imported lazily, so the tokenizers and the sampler work without it.
Every problem with the input reads ``<key>: <what is wrong> (got <value>; allowed <what>)``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import torch
import torch.utils.data

from moe_cdk.training.schema import problem

logger = logging.getLogger(__name__)

JSON_LINES_SUFFIXES = (".jsonl", ".json")
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")
UINT16_VOCAB_LIMIT = 65500
MAX_REPORTED_PROBLEMS = 20
_SNIPPET = 60


class DataError(ValueError):
    """Input that cannot be prepared or served. ``problems`` holds one ``key: ...`` line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


# --------------------------------------------------------------------------- tokenizers


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
            raise DataError([f"ids: {problem('token id out of range', got=int(bad[0]), allowed='0-256')}"])
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
            raise DataError([f"tokenizer: {problem('no such file', got=self.path, allowed=allowed)}"])
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(self.path)
        except Exception as error:  # the Rust side raises a bare Exception for any parse failure
            logger.debug("tokenizers could not load %s: %s", self.path, error)
            raise DataError(
                [f"tokenizer: {problem('not a Hugging Face tokenizer.json', got=self.path, allowed=allowed)}"]
            ) from None
        for token in EOD_CANDIDATES:
            token_id = self._tokenizer.token_to_id(token)
            if token_id is not None:
                self._eod = int(token_id)
                break
        else:
            allowed = "a vocabulary with one of " + ", ".join(repr(t) for t in EOD_CANDIDATES)
            raise DataError(
                [f"tokenizer: {problem('no end-of-document token', got=self.path, allowed=allowed)}"]
            )

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


# --------------------------------------------------------------------------- megatron-core


def _megatron_import(module: str) -> Any:
    """Import a megatron-core module without the warnings its package import emits (missing
    Transformer Engine/Apex kernels, deprecations in model code), which the data path never uses."""
    import importlib

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(module)


# --------------------------------------------------------------------------- prepare


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of ``path``; raises DataError on invalid UTF-8."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError:
                got = _snippet(raw.decode("utf-8", errors="replace").rstrip("\n"))
                raise DataError([f"{path}:{number}: {problem('not UTF-8 text', got=got, allowed='UTF-8 text')}"])


def _json_documents(path: Path, json_key: str, problems: list[str]) -> Iterator[str]:
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
                f"{where}: {problem('not valid JSON', got=_snippet(line.rstrip()), allowed='one JSON object per line')}"
            )
        else:
            if not isinstance(record, dict):
                problems.append(
                    f"{where}: {problem('not a JSON object', got=_snippet(line.rstrip()), allowed='one JSON object per line')}"
                )
            elif json_key not in record:
                problems.append(
                    f"{where}: "
                    + problem(
                        f"missing key {json_key!r}",
                        got=sorted(record),
                        allowed=f"an object with the document text under {json_key!r}",
                    )
                )
            elif not isinstance(record[json_key], str):
                problems.append(
                    f"{where}: {problem(f'{json_key!r} is not a string', got=record[json_key], allowed='a string')}"
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
    succeeded. Raises DataError (nothing written) for a missing input or a bad line.

    Returns {"documents": n, "tokens": n_tokens, "bin": path, "idx": path}.
    """
    inputs = [Path(p) for p in inputs]
    output_prefix = Path(output_prefix)
    if not inputs:
        raise DataError([f"input: {problem('no input files', got=[], allowed='one or more files')}"])
    missing = [
        f"input: {problem('no such file', got=str(p), allowed='an existing file')}" for p in inputs if not p.is_file()
    ]
    if missing:
        raise DataError(missing)
    if not json_key:
        raise DataError([f"json_key: {problem('empty key', got=json_key, allowed='a non-empty JSON key')}"])

    indexed_dataset = _megatron_import("megatron.core.datasets.indexed_dataset")
    dtype = token_dtype(tokenizer.vocab_size)
    out_dir = output_prefix.parent
    writable = {"got": str(output_prefix), "allowed": "a writable location"}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(
            [f"output_prefix: {problem(f'cannot create directory: {error.strerror}', **writable)}"]
        ) from None
    final_bin = Path(f"{output_prefix}.bin")
    final_idx = Path(f"{output_prefix}.idx")
    temp_prefix = out_dir / f".{output_prefix.name}.{os.getpid()}.tmp"
    temp_bin, temp_idx = Path(f"{temp_prefix}.bin"), Path(f"{temp_prefix}.idx")

    documents = tokens = 0
    problems: list[str] = []
    builder = None
    try:
        try:
            builder = indexed_dataset.IndexedDatasetBuilder(str(temp_bin), dtype=dtype)
        except OSError as error:
            raise DataError(
                [f"output_prefix: {problem(f'cannot write: {error.strerror}', **writable)}"]
            ) from None
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
                        raise DataError([f"output_prefix: {problem(f'cannot write: {error.strerror}', **writable)}"])
                    documents += 1
                    tokens += len(ids)
            except DataError as error:  # invalid UTF-8 or a write failure: keep what was found before it
                raise DataError(problems + error.problems) from None
            except OSError as error:
                raise DataError(
                    [f"input: {problem(f'cannot read: {error.strerror}', got=str(path), allowed='a readable file')}"]
                ) from None
            if len(problems) >= MAX_REPORTED_PROBLEMS:
                break
        if problems:
            raise DataError(problems)
        if documents == 0:
            raise DataError(
                [
                    "input: "
                    + problem(
                        "no documents", got=[str(p) for p in inputs], allowed="files with a non-empty document"
                    )
                ]
            )
        try:
            builder.finalize(str(temp_idx))
            os.replace(temp_bin, final_bin)
            os.replace(temp_idx, final_idx)
        except OSError as error:
            raise DataError([f"output_prefix: {problem(f'cannot write: {error.strerror}', **writable)}"]) from None
    except BaseException:
        if builder is not None:
            builder.data_file.close()
        for leftover in (temp_bin, temp_idx):
            leftover.unlink(missing_ok=True)
        raise

    logger.info("wrote %d documents, %d tokens to %s and %s", documents, tokens, final_bin, final_idx)
    return {"documents": documents, "tokens": tokens, "bin": str(final_bin), "idx": str(final_idx)}


# --------------------------------------------------------------------------- GPTDataset


class _MegatronTokenizer:
    """What ``GPTDatasetConfig`` and ``GPTDataset`` read from a MegatronTokenizer: ``eod`` (loss
    and position bookkeeping), ``vocab_size`` (token dtype code), ``pad`` (padding id; -1 is
    megatron's own "no pad token" sentinel, which never occurs in the data) and
    ``unique_identifiers`` (part of the cache hash, so it must be JSON-serialisable)."""

    pad = -1

    def __init__(self, tokenizer: Tokenizer):
        self.eod = tokenizer.eod
        self.vocab_size = tokenizer.vocab_size
        self.unique_identifiers = {"class": type(tokenizer).__name__, "vocab_size": self.vocab_size, "eod": self.eod}


@contextlib.contextmanager
def _process_group_for_blending(needed: bool) -> Iterator[None]:
    """megatron-core 0.16.1's BlendedDataset calls ``torch.distributed.get_rank()`` on a cache miss
    whether or not torch.distributed is initialised. In a single process, give it a one-rank
    gloo group for the duration of the build."""
    import torch.distributed as dist

    if not needed or not dist.is_available() or dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def build_gpt_dataset(
    *,
    data_prefixes: list[str],
    weights: list[float] | None,
    seq_length: int,
    num_samples: int,
    seed: int,
    tokenizer: Tokenizer,
    cache_dir: str,
) -> torch.utils.data.Dataset:
    """The TRAIN split of megatron-core's GPTDataset over ``data_prefixes``, at least ``num_samples`` long.

    Several prefixes are blended by ``weights``; without weights, by their token counts. Each
    item is a dict of ``tokens``, ``labels`` (tokens shifted by one), ``loss_mask`` and
    ``position_ids``, each ``seq_length`` long (a blend adds ``dataset_id``). The shuffled
    index files are cached in ``cache_dir``. Works without torch.distributed; when it is
    initialised every rank must call this: rank 0 builds the cache first, the others then read
    it, so ``cache_dir`` must be on a file system every rank sees.
    """
    problems = _check_dataset_args(data_prefixes, weights, seq_length, num_samples)
    if problems:
        raise DataError(problems)
    gpt_dataset = _megatron_import("megatron.core.datasets.gpt_dataset")
    builder_module = _megatron_import("megatron.core.datasets.blended_megatron_dataset_builder")

    prefixes = [str(p) for p in data_prefixes]
    if len(prefixes) == 1:
        weights = None  # a single prefix needs no BlendedDataset on top
    elif weights is None:
        # megatron-core would cap an unweighted blend at one epoch of every prefix; weighting by
        # token count keeps its proportions and always yields num_samples.
        weights = [float(_token_count(p)) for p in prefixes]

    config = gpt_dataset.GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=(prefixes, None if weights is None else [float(w) for w in weights]),
        split="100,0,0",
        path_to_cache=str(cache_dir),
        tokenizer=_MegatronTokenizer(tokenizer),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )
    builder = builder_module.BlendedMegatronDatasetBuilder(
        gpt_dataset.GPTDataset,
        [num_samples, 0, 0],  # train, valid, test; valid and test are empty splits and not built
        lambda: True,  # is_built_on_rank: every rank holds its own copy
        config,
    )
    with _process_group_for_blending(weights is not None):
        train, _, _ = builder.build()
    logger.info("GPT dataset over %d prefix(es): %d samples of %d tokens", len(prefixes), len(train), seq_length)
    return train


def _token_count(prefix: str) -> int:
    indexed_dataset = _megatron_import("megatron.core.datasets.indexed_dataset")
    # Keep the IndexedDataset referenced while its arrays are read: they are views of an mmap
    # that its __del__ closes, and reading them afterwards is a segmentation fault.
    dataset = indexed_dataset.IndexedDataset(prefix)
    return int(dataset.sequence_lengths.sum())


def _check_dataset_args(
    data_prefixes: list[str], weights: list[float] | None, seq_length: int, num_samples: int
) -> list[str]:
    problems = []
    if not data_prefixes:
        problems.append(f"data_prefixes: {problem('empty', got=data_prefixes, allowed='one or more prefixes')}")
    for i, prefix in enumerate(data_prefixes):
        if not (Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()):
            problems.append(
                f"data_prefixes[{i}]: "
                + problem("no .bin/.idx pair", got=str(prefix), allowed="a prefix written by moe-data prepare")
            )
    if weights is not None:
        if len(weights) != len(data_prefixes):
            problems.append(
                f"weights: {problem('not one weight per prefix', got=weights, allowed=f'{len(data_prefixes)} weights')}"
            )
        if any(not w > 0 for w in weights):
            problems.append(f"weights: {problem('not all positive', got=weights, allowed='numbers > 0')}")
    if not (isinstance(seq_length, int) and seq_length > 0):
        problems.append(f"seq_length: {problem('not a positive integer', got=seq_length, allowed='an integer > 0')}")
    if not (isinstance(num_samples, int) and num_samples > 0):
        problems.append(f"num_samples: {problem('not a positive integer', got=num_samples, allowed='an integer > 0')}")
    return problems


# --------------------------------------------------------------------------- sampling


class ResumableSampler:
    """Micro-batches of dataset indices for one data-parallel rank, resumable from a sample count.

    Global batch ``g`` (``micro_batch_size * data_parallel_size`` samples) is the consecutive
    indices starting at ``consumed_samples``, modulo ``dataset_length``; rank ``r`` takes slice
    ``[r * micro_batch_size, (r + 1) * micro_batch_size)`` of it. The order is sequential because
    GPTDataset is already shuffled. Iteration never ends; ``consumed_samples`` (global, all ranks)
    advances by one global batch per micro-batch handed out.

    A DataLoader with workers draws indices ahead of the training loop (``num_workers *
    prefetch_factor`` micro-batches), so ``consumed_samples`` then runs ahead of what the model
    has seen; checkpoint the count of samples actually trained on in that case.
    """

    def __init__(
        self,
        dataset_length: int,
        *,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        consumed_samples: int = 0,
    ):
        problems = []
        for key, value, low in (
            ("dataset_length", dataset_length, 1),
            ("micro_batch_size", micro_batch_size, 1),
            ("data_parallel_size", data_parallel_size, 1),
            ("consumed_samples", consumed_samples, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                problems.append(f"{key}: {problem('out of range', got=value, allowed=f'an integer >= {low}')}")
        if not isinstance(data_parallel_rank, int) or not (
            isinstance(data_parallel_size, int) and 0 <= data_parallel_rank < data_parallel_size
        ):
            problems.append(
                f"data_parallel_rank: {problem('out of range', got=data_parallel_rank, allowed='0 <= rank < data_parallel_size')}"
            )
        if problems:
            raise DataError(problems)
        self.dataset_length = dataset_length
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.consumed_samples = consumed_samples

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.data_parallel_size

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            start = self.consumed_samples + self.data_parallel_rank * self.micro_batch_size
            batch = [(start + i) % self.dataset_length for i in range(self.micro_batch_size)]
            self.consumed_samples += self.global_batch_size
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        consumed = state.get("consumed_samples") if isinstance(state, dict) else None
        if not isinstance(consumed, int) or isinstance(consumed, bool) or consumed < 0:
            raise DataError(
                [f"consumed_samples: {problem('not a sample count', got=consumed, allowed='an integer >= 0')}"]
            )
        self.consumed_samples = consumed


def make_dataloader(
    dataset: torch.utils.data.Dataset,
    sampler: ResumableSampler,
    *,
    num_workers: int,
    prefetch_factor: int | None,
    pin_memory: bool,
    seed: int = 0,
) -> torch.utils.data.DataLoader:
    """A DataLoader that takes its micro-batches from ``sampler``.

    It draws its workers' base seed from a generator of its own (seeded with ``seed``), not
    from torch's default generator, which holds the restored RNG state of a resumed run:
    drawing from it would shift every dropout mask after a resume."""
    kwargs: dict[str, Any] = {}
    if num_workers > 0 and prefetch_factor is not None:
        kwargs["prefetch_factor"] = prefetch_factor
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=num_workers, pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed), **kwargs
    )
