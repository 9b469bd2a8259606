"""Logits of a moe-train run's newest checkpoint, from ``moe-train``'s own build and resume: run as
one process or as several ranks (tests/local_ranks.py; rank 0 writes them). With ``--save DIR`` it also saves what
it loaded as DIR/step-0, under this run's layout.

    python tests/hf_logits_probe.py PROFILE.yaml TOKENS.pt OUT.pt [--save DIR] [--set section.key=value ...]
"""

from __future__ import annotations

import sys

import torch


def main(profile: str, tokens_path: str, out: str, save: str | None, overrides: list[str]) -> None:
    from moe_cdk.training.step import _megatron

    _megatron.import_core()  # as moe-train does
    from moe_cdk.training.checkpoints.manager import CheckpointManager
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.launch_env import detect
    from moe_cdk.training.step import cpu_compat, trainer
    from moe_cdk.training.step.sizes import model_vocab_size

    config = load_train_config(profile, overrides)
    runtime = trainer.setup(config, detect())
    try:
        trainable = trainer.build(config, runtime, model_vocab_size(config, 0))
        restored = CheckpointManager(
            config.checkpoint.dir, keep_last=2, layout=runtime.layout, seed=config.optim.seed
        ).load_latest(trainable)
        assert restored is not None, f"no checkpoint in {config.checkpoint.dir}"
        if save:
            CheckpointManager(save, keep_last=2, layout=runtime.layout, seed=config.optim.seed).save(
                trainable, step=0, consumed_samples=0
            )
        tokens = torch.load(tokens_path)
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        (chunk,) = trainable.chunks
        chunk.eval()
        with torch.no_grad(), cpu_compat.cuda_factories_on_cpu():
            logits = chunk(tokens, positions, trainer.causal_mask(tokens.shape[1], tokens.device))
        if runtime.rank == 0:
            torch.save(logits.float(), out)
    finally:
        trainer.teardown()


if __name__ == "__main__":
    args = sys.argv[1:]
    options = dict(zip(args[3::2], args[4::2]))
    main(*args[:3], options.get("--save"), [a for flag, a in zip(args[3::2], args[4::2]) if flag == "--set"])
