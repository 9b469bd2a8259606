"""The dataset served to the trainer: megatron-core's GPTDataset, the resumable sampler, the data loader."""

from __future__ import annotations

from itertools import islice

from data_files import PLAIN_DOCUMENTS, split_on_eod, text_prefix  # noqa: F401 (text_prefix: a fixture)

from moe_cdk.training.data.dataset import ResumableSampler, build_gpt_dataset, make_dataloader
from moe_cdk.training.data.prepare import prepare
from moe_cdk.training.data.tokenizers import ByteTokenizer


def test_build_gpt_dataset_gives_shifted_samples_of_seq_length(text_prefix, tmp_path):
    dataset = build_gpt_dataset(
        data_prefixes=[str(text_prefix)],
        weights=None,
        seq_length=16,
        num_samples=12,
        seed=1234,
        tokenizer=ByteTokenizer(),
        cache_dir=str(tmp_path / "cache"),
    )
    assert len(dataset) >= 12
    documents = [d.encode("utf-8") for d in PLAIN_DOCUMENTS]
    for i in range(3):
        sample = dataset[i]
        assert set(sample) == {"tokens", "labels", "loss_mask", "position_ids"}
        assert all(sample[key].shape == (16,) for key in sample)
        assert sample["tokens"][1:].tolist() == sample["labels"][:-1].tolist()
        # a window of the shuffled document stream: each piece between eods lies in one document
        pieces = split_on_eod(sample["tokens"].tolist())
        assert all(any(piece in doc for doc in documents) for piece in pieces)


def test_build_gpt_dataset_blends_prefixes_in_a_single_process(text_prefix, tmp_path):
    import torch.distributed as dist

    other = tmp_path / "other.txt"
    other.write_text("another corpus\n\nwith two documents\n")
    prepare([other], tmp_path / "other", ByteTokenizer())
    dataset = build_gpt_dataset(
        data_prefixes=[str(text_prefix), str(tmp_path / "other")],
        weights=[3.0, 1.0],
        seq_length=8,
        num_samples=20,
        seed=7,
        tokenizer=ByteTokenizer(),
        cache_dir=str(tmp_path / "cache"),
    )
    assert len(dataset) >= 20
    assert {int(dataset[i]["dataset_id"]) for i in range(len(dataset))} == {0, 1}
    assert not dist.is_initialized()


def test_build_gpt_dataset_under_an_initialised_process_group(text_prefix, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        dataset = build_gpt_dataset(
            data_prefixes=[str(text_prefix)],
            weights=None,
            seq_length=8,
            num_samples=5,
            seed=3,
            tokenizer=ByteTokenizer(),
            cache_dir=str(tmp_path / "cache"),
        )
    finally:
        dist.destroy_process_group()
    assert len(dataset) >= 5
    assert dataset[0]["tokens"].shape == (8,)


def test_sampler_data_parallel_ranks_partition_each_global_batch():
    ranks = [ResumableSampler(10, micro_batch_size=2, data_parallel_rank=r, data_parallel_size=2) for r in range(2)]
    batches = [list(islice(iter(sampler), 3)) for sampler in ranks]
    assert batches[0] == [[0, 1], [4, 5], [8, 9]]
    assert batches[1] == [[2, 3], [6, 7], [0, 1]]
    assert ranks[0].state_dict() == ranks[1].state_dict() == {"consumed_samples": 12}


def test_sampler_resumes_exactly_from_consumed_samples():
    def sampler(consumed: int = 0) -> ResumableSampler:
        return ResumableSampler(
            7, micro_batch_size=3, data_parallel_rank=1, data_parallel_size=2, consumed_samples=consumed
        )

    original = iter(first := sampler())
    before = list(islice(original, 2))
    assert first.consumed_samples == 12
    resumed = sampler()
    resumed.load_state_dict(first.state_dict())
    assert list(islice(iter(resumed), 4)) == list(islice(original, 4))
    assert before + list(islice(iter(sampler(12)), 1)) == list(islice(iter(sampler()), 3))


def test_make_dataloader_batches_the_dataset(text_prefix, tmp_path):
    dataset = build_gpt_dataset(
        data_prefixes=[str(text_prefix)],
        weights=None,
        seq_length=8,
        num_samples=4,
        seed=0,
        tokenizer=ByteTokenizer(),
        cache_dir=str(tmp_path / "cache"),
    )
    sampler = ResumableSampler(len(dataset), micro_batch_size=2, data_parallel_rank=0, data_parallel_size=1)
    batch = next(iter(make_dataloader(dataset, sampler, num_workers=0, prefetch_factor=2, pin_memory=False)))
    assert batch["tokens"].shape == (2, 8)
    assert sampler.consumed_samples == 2
