"""Training data served to the trainer: megatron-core's ``GPTDataset`` (blended, shuffled,
cached index files) from ``moe-data prepare``'s files, through ``ResumableSampler`` and
``make_dataloader`` in a deterministic order that a restarted job continues from
``consumed_samples``.

megatron-core is imported lazily, so the sampler works without it. Every problem with the
input reads ``<key>: <what is wrong> (got <value>; allowed <what>)``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.utils.data

from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.training.data.tokenizers import Tokenizer
from moe_cdk.training.step._megatron import quiet_import

logger = logging.getLogger(__name__)


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
        raise ConfigError(problems)
    gpt_dataset = quiet_import("megatron.core.datasets.gpt_dataset")
    builder_module = quiet_import("megatron.core.datasets.blended_megatron_dataset_builder")

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
    indexed_dataset = quiet_import("megatron.core.datasets.indexed_dataset")
    # Keep the IndexedDataset referenced while its arrays are read: they are views of an mmap
    # that its __del__ closes, and reading them afterwards is a segmentation fault.
    dataset = indexed_dataset.IndexedDataset(prefix)
    return int(dataset.sequence_lengths.sum())


def _check_dataset_args(
    data_prefixes: list[str], weights: list[float] | None, seq_length: int, num_samples: int
) -> list[Problem]:
    problems = []
    if not data_prefixes:
        problems.append(problem("empty", got=data_prefixes, allowed="one or more prefixes").at("data_prefixes"))
    for i, prefix in enumerate(data_prefixes):
        if not (Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()):
            problems.append(
                problem("no .bin/.idx pair", got=str(prefix), allowed="a prefix written by moe-data prepare").at(
                    f"data_prefixes[{i}]"
                )
            )
    if weights is not None:
        if len(weights) != len(data_prefixes):
            problems.append(
                problem("not one weight per prefix", got=weights, allowed=f"{len(data_prefixes)} weights").at("weights")
            )
        if any(not w > 0 for w in weights):
            problems.append(problem("not all positive", got=weights, allowed="numbers > 0").at("weights"))
    if not (isinstance(seq_length, int) and seq_length > 0):
        problems.append(problem("not a positive integer", got=seq_length, allowed="an integer > 0").at("seq_length"))
    if not (isinstance(num_samples, int) and num_samples > 0):
        problems.append(problem("not a positive integer", got=num_samples, allowed="an integer > 0").at("num_samples"))
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
                problems.append(problem("out of range", got=value, allowed=f"an integer >= {low}").at(key))
        if not isinstance(data_parallel_rank, int) or not (
            isinstance(data_parallel_size, int) and 0 <= data_parallel_rank < data_parallel_size
        ):
            problems.append(
                problem("out of range", got=data_parallel_rank, allowed="0 <= rank < data_parallel_size").at(
                    "data_parallel_rank"
                )
            )
        if problems:
            raise ConfigError(problems)
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
            raise ConfigError(
                [problem("not a sample count", got=consumed, allowed="an integer >= 0").at("consumed_samples")]
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
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
