"""Bytes of the activations the trainer's model keeps for its backward pass (a script, not a test file).

Run as ``python tests/activation_probe.py CONFIG CASES_JSON``, where CASES_JSON maps a case's name to its
``KEY=VALUE`` overrides, or as several ranks (tests/local_ranks.py, or torchrun) with one case: in the same ranks, a
second process group fails (gloo's connect is refused; under torchrun, it finds the first one's keys in the
launcher's store). For each case, in one process (so torch and megatron are imported once), it builds the model as
the trainer does, runs the forward pass and loss of one micro-batch under ``torch.autograd.graph.saved_tensors_hooks``,
and prints rank 0's count as one JSON line ``{"case": ..., "saved_bytes": ...}``: every storage autograd saved, once,
parameters excluded. The process group and megatron's parallel state are set up and torn down for each case, as for
a run of its own.
"""

from __future__ import annotations

import json
import sys

import torch

from moe_cdk.training.step import _megatron

_megatron.import_core()  # as moe-train does, before the model code imports megatron-core

from moe_cdk.training.config import load_train_config  # noqa: E402
from moe_cdk.training.launch_env import detect  # noqa: E402
from moe_cdk.training.step import cpu_compat, trainer  # noqa: E402
from moe_cdk.training.step.model import build_model  # noqa: E402

VOCAB = 257  # the byte tokenizer


def main(argv: list[str]) -> None:
    for case, overrides in json.loads(argv[1]).items():
        saved = saved_bytes(load_train_config(argv[0], overrides))
        if saved is not None:
            print(json.dumps({"case": case, "saved_bytes": saved}), flush=True)


def saved_bytes(config) -> int | None:
    """Rank 0's saved activation bytes for one micro-batch of ``config`` (None on the other ranks)."""
    env = detect()
    trainer.setup(config, env)
    try:
        [chunk] = build_model(config, VOCAB, on_gpu=False)
        parameters = {p.untyped_storage().data_ptr() for p in chunk.parameters()}
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in parameters:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        b, s = config.optim.micro_batch_size, config.model.seq_length
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, VOCAB, (b, s), generator=generator)
        positions = torch.arange(s).expand(b, s)
        with cpu_compat.cuda_factories_on_cpu(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = chunk(tokens, positions, trainer.causal_mask(s, torch.device("cpu")), labels=tokens).float().mean()
        loss.backward()
        return sum(saved.values()) if env.rank == 0 else None
    finally:
        trainer.teardown()


if __name__ == "__main__":
    main(sys.argv[1:])
