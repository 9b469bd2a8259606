"""Training data: tokenizers, ``prepare`` into megatron .bin/.idx, GPTDataset, the resumable sampler, ``moe-data``."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from moe_cdk.cli.data import main as data_main
from moe_cdk.core.problems import ConfigError
from moe_cdk.training.dataset import ResumableSampler, build_gpt_dataset, make_dataloader
from moe_cdk.training.prepare import prepare
from moe_cdk.training.tokenizers import ByteTokenizer, JsonTokenizer, load_tokenizer

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


def test_byte_tokenizer_round_trip_and_eod():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("héllo")
    assert ids == list("héllo".encode("utf-8"))
    assert tokenizer.decode(ids + [tokenizer.eod]) == "héllo"
    assert (tokenizer.eod, tokenizer.vocab_size) == (256, 257)
    assert isinstance(load_tokenizer(None), ByteTokenizer) and isinstance(load_tokenizer("byte"), ByteTokenizer)


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


def test_cli_missing_input_exits_2_with_a_formatted_message(tmp_path, capsys):
    missing = tmp_path / "absent.txt"
    code = data_main(["prepare", "--input", str(missing), "--output-prefix", str(tmp_path / "out")])
    assert code == 2
    assert (
        capsys.readouterr().err
        == f"moe-data prepare: 1 problem(s)\n  input: no such file (got '{missing}'; allowed an existing file)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_prepare_prints_a_summary(tmp_path, capsys):
    source = tmp_path / "corpus.txt"
    source.write_text("one\n\ntwo\n")
    assert data_main(["prepare", "--input", str(source), "--output-prefix", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out == f"prepared 2 documents, 8 tokens: {tmp_path}/c.bin {tmp_path}/c.idx\n"
