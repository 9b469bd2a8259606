"""Bytes of the activations the trainer's model keeps for its backward pass (a script, not a test file).

Run as ``python tests/activation_probe.py CONFIG [KEY=VALUE ...]`` (under torchrun for more
than one rank). It builds the model as the trainer does, runs the forward pass and loss of
one micro-batch under ``torch.autograd.graph.saved_tensors_hooks``, and prints rank 0's
count as JSON: every storage autograd saved, once, parameters excluded.
"""

from __future__ import annotations

import json
import sys

import torch

from moe_cdk.training import cpu_compat, trainer
from moe_cdk.training.config import load_train_config
from moe_cdk.training.launch_env import detect
from moe_cdk.training.model import build_model

VOCAB = 257  # the byte tokenizer


def main(argv: list[str]) -> None:
    config = load_train_config(argv[0], argv[1:])
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
        if env.rank == 0:
            print(json.dumps({"saved_bytes": sum(saved.values())}))
    finally:
        trainer.teardown()


if __name__ == "__main__":
    main(sys.argv[1:])
