"""``moe-checkpoint``'s two conversions, run as one process whatever layout the profile trains with.

Import builds the profile's model on one rank (tensor, pipeline and expert parallel 1), fills
every parameter from the safetensors through ``hf_checkpoint.links``, and saves it as the
run's ``step-0`` with the trainer's own checkpoint code. dist_checkpointing stores global
tensors, so ``moe-train`` loads that step-0 under any layout, as it loads its own
``checkpoint.save_initial``. Export does the reverse: it loads a checkpoint saved under any
layout into the one-rank model and writes its parameters back out.

The step-0 checkpoint is fp32, which holds bf16 and fp16 weights exactly; a bf16 run loads
it by casting. Memory: one copy of the model in fp32 on the host, plus its gradient buffer
on import (the trainer's build allocates one), so 8 bytes per parameter there and 4 on export.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
import yaml

from moe_cdk.core.names import umask
from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.training.checkpoints import hf_checkpoint as hf
from moe_cdk.training.checkpoints.export_marker import write_marker
from moe_cdk.training.checkpoints.manager import MARKER, CheckpointManager, shape_problems, step_dirs
from moe_cdk.training.config import ParallelConfig, Precision, Spec, TrainConfig, train_config_from

log = logging.getLogger(__name__)

HF_SUBDIR = "hf"
"""Where import keeps the model's config.json and tokenizer files, beside the step-N folders."""
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
MAX_SHARD_BYTES = 5 * 10**9
"""safetensors files are split at 5 GB, save_pretrained's default max_shard_size."""


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(
            [problem("cannot read the file", got=error.strerror, allowed="a readable JSON file").at(str(path))]
        ) from None
    except ValueError as error:
        raise ConfigError([problem("not valid JSON", got=str(error), allowed="a JSON object").at(str(path))]) from None
    if not isinstance(value, dict):
        raise ConfigError(
            [problem("must be a JSON object", got=type(value).__name__, allowed="an object").at(str(path))]
        )
    return value


class SafetensorsDir:
    """The tensors of a Hugging Face model folder: ``model.safetensors``, or the shards its index names."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = _read_json(index).get("weight_map", {})
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            raise ConfigError(
                [
                    problem(
                        "no safetensors weights", got="none", allowed="model.safetensors or an index with its shards"
                    ).at(str(folder))
                ]
            )
        self._where: dict[str, object] = {}
        for name in files:
            handle = safe_open(str(folder / name), framework="pt")
            for key in handle.keys():
                self._where[key] = handle
        self.folder = folder

    def names(self) -> set[str]:
        return set(self._where)

    def get(self, name: str) -> torch.Tensor:
        return self._where[name].get_tensor(name)


def _one_rank(config: TrainConfig) -> TrainConfig:
    """``config`` as one rank builds it: no parallelism, fp32, megatron's local spec."""
    return dataclasses.replace(
        config,
        parallel=ParallelConfig(),
        model=dataclasses.replace(config.model, spec=Spec.LOCAL),
        optim=dataclasses.replace(config.optim, precision=Precision.FP32, distributed_optimizer=False),
    )


def _start_one_rank(config: TrainConfig):
    from moe_cdk.training.launch_env import detect
    from moe_cdk.training.step import trainer

    env = detect()
    if env.world_size != 1:
        raise ConfigError(
            [problem("moe-checkpoint runs as one process", got=env.world_size, allowed="1").at("WORLD_SIZE")]
        )
    return trainer.setup(config, env)


def _vocab(config: TrainConfig) -> int:
    from moe_cdk.training.data.tokenizers import load_tokenizer
    from moe_cdk.training.step.sizes import model_vocab_size

    return model_vocab_size(config, load_tokenizer(config.data.tokenizer).vocab_size)


def _tensors_of(model) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint holds for ``model``: its parameters and persistent buffers (the router's expert
    bias)."""
    return {name: value for name, value in model.state_dict(keep_vars=True).items() if isinstance(value, torch.Tensor)}


def _newest_complete_step(root: Path) -> Path | None:
    return next((p for _, p in step_dirs(root) if CheckpointManager.problem_with(p) is None), None)


# -- import --------------------------------------------------------------------------------


def _import_profile(hf_dir: Path, hf_config: dict, output: Path, overrides: list[str]) -> tuple[TrainConfig, dict]:
    """The profile for ``hf_dir``'s model, as a checked TrainConfig and as the mapping written out
    (with ``overrides`` applied to both)."""
    sections = hf.profile_sections(hf_config)
    tokenizer = output / HF_SUBDIR / "tokenizer.json" if (hf_dir / "tokenizer.json").is_file() else "byte"
    profile = {
        "max_steps": 1000,
        **sections,
        "data": {"prefixes": [str(output / "data" / "train_text_document")], "tokenizer": str(tokenizer)},
        "checkpoint": {"dir": str(output)},
    }
    config = train_config_from(profile, overrides)
    return config, profile


def import_hf(hf_dir: Path, output: Path, profile_path: Path, overrides: list[str]) -> Path:
    """Write ``output/step-0`` and the profile from a Hugging Face model folder; returns the step folder.
    Everything is checked before anything is written."""
    from moe_cdk.training.step import trainer

    hf_dir, output = hf_dir.resolve(), output.resolve()
    hf_config = _read_json(hf_dir / "config.json")
    config, profile = _import_profile(hf_dir, hf_config, output, overrides)
    family = hf.family_of(hf_config)
    existing = _newest_complete_step(output)
    if existing is not None:
        raise ConfigError(
            [
                problem("already holds a complete checkpoint", got=str(existing), allowed="a new or empty folder").at(
                    "--output"
                )
            ]
        )
    if profile_path.exists():
        raise ConfigError(
            [problem("the file exists", got=str(profile_path), allowed="a new file").at("--write-config")]
        )
    source = SafetensorsDir(hf_dir)
    one = _one_rank(config)
    table = hf.links(one, family)
    problems = hf.hf_problems(table, source.names(), where=str(hf_dir))
    if problems:
        raise ConfigError(problems)
    if config.data.tokenizer == "byte":
        log.warning(
            "%s has no tokenizer.json, so the profile's data.tokenizer is the byte tokenizer (257 tokens), "
            "not the one the weights were trained on (%d rows); copy the model's tokenizer.json there or "
            "pass --set data.tokenizer=PATH",
            hf_dir,
            one.model.vocab_size,
        )
    tokenizer_vocab = None
    if (hf_dir / "tokenizer.json").is_file():
        from moe_cdk.training.data.tokenizers import load_tokenizer

        tokenizer_vocab = load_tokenizer(str(hf_dir / "tokenizer.json")).vocab_size
    from moe_cdk.training.step.sizes import model_vocab_size

    vocab_size = model_vocab_size(one, tokenizer_vocab or one.model.vocab_size)
    runtime = _start_one_rank(one)
    try:
        trainable = trainer.build(one, runtime, vocab_size)
        params = _tensors_of(trainable.chunks[0].module)
        problems = hf.megatron_problems(table, params)
        if problems:
            raise ConfigError(problems)
        shapes = hf.shapes_of(one, vocab_size)
        with torch.no_grad():
            for link in table:
                value = hf.join(link, [source.get(name) for name in link.hf], shapes)
                target = params[link.megatron]
                if value.shape != target.shape:
                    problems.append(
                        problem(
                            "shape does not match config.json", got=tuple(value.shape), allowed=tuple(target.shape)
                        ).at(f"{hf_dir}: {', '.join(link.hf)}")
                    )
                else:
                    target.copy_(value)
        if problems:
            raise ConfigError(problems)
        manager = CheckpointManager(output, keep_last=2, layout=runtime.layout, seed=one.optim.seed)
        manager.save(trainable, step=0, consumed_samples=0)
    finally:
        trainer.teardown()
    side = output / HF_SUBDIR
    side.mkdir(exist_ok=True)
    for name in SIDE_FILES:
        if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, side / name)
    header = (
        f"# Imported by moe-checkpoint import-hf from {hf_dir} ({family.architecture}).\n"
        f"# Train: moe-train --config {profile_path.name} --checkpoint-dir {output}\n"
    )
    _write_atomically(profile_path, header + yaml.safe_dump(profile, sort_keys=False))
    return output / "step-0"


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- export --------------------------------------------------------------------------------


def _step_folder(checkpoint: Path, step: int | None) -> Path:
    if (checkpoint / MARKER).is_file() and step is None:
        return checkpoint
    if step is not None:
        chosen = checkpoint / f"step-{step}"
        reason = CheckpointManager.problem_with(chosen) if chosen.is_dir() else "no such folder"
        if reason:
            raise ConfigError(
                [
                    problem(
                        "not a complete checkpoint",
                        got=f"{chosen}: {reason}",
                        allowed="a step-N folder with its completion marker",
                    ).at("--step")
                ]
            )
        return chosen
    newest = _newest_complete_step(checkpoint)
    if newest is None:
        raise ConfigError(
            [
                problem(
                    "holds no complete checkpoint",
                    got=str(checkpoint),
                    allowed="a run's checkpoint folder, or one of its step-N folders",
                ).at("CKPT_DIR")
            ]
        )
    return newest


def _stored_dtype(step_folder: Path) -> torch.dtype:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(step_folder)).read_metadata().state_dict_metadata
    return metadata["embedding.word_embeddings.weight"].properties.dtype


def export_hf(
    checkpoint: Path,
    config_path: Path,
    output: Path,
    *,
    family_name: str | None = None,
    step: int | None = None,
    dtype_name: str | None = None,
) -> Path:
    """Write ``output`` (safetensors and config.json, then the completion marker ``moe-export.json``) from a
    moe-train checkpoint; returns ``output``. The folder appears whole or not at all."""
    from megatron.core import dist_checkpointing

    from moe_cdk.training.checkpoints.format import load_strategy
    from moe_cdk.training.config import load_train_config
    from moe_cdk.training.step import cpu_compat, trainer
    from moe_cdk.training.step.model import build_model

    config = load_train_config(config_path)
    folder = _step_folder(checkpoint, step)
    base_path = folder.parent / HF_SUBDIR / "config.json"
    base = _read_json(base_path) if base_path.is_file() else None
    if family_name is None and base is None:
        raise ConfigError(
            [
                problem(f"needed: there is no {base_path} from an import", got=None, allowed=", ".join(hf.FAMILIES)).at(
                    "--family"
                )
            ]
        )
    family = hf.FAMILIES[family_name] if family_name else hf.family_of(base)
    if output.exists() and any(output.iterdir()):
        raise ConfigError(
            [problem("the folder exists and is not empty", got=str(output), allowed="a new folder").at("--output")]
        )
    vocab_size = _vocab(config)
    dtype = (
        hf.DTYPES[dtype_name]
        if dtype_name
        else (hf.DTYPES.get((base or {}).get("torch_dtype")) or _stored_dtype(folder))
    )
    hf_config = hf.hf_config(config, family, vocab_size, dtype, base)
    one = _one_rank(config)
    table = hf.links(one, family)
    runtime = _start_one_rank(one)
    try:
        (model,) = build_model(one, vocab_size, on_gpu=runtime.device.type == "cuda")
        # The trainer's structure (checkpoint._sharded_state): tensors are found by their global
        # names, so one chunk here loads what any chunking of the layers saved.
        template = {"model": {"chunk0": model.sharded_state_dict()}}
        if mismatched := shape_problems(template["model"], folder, key="--config"):
            raise ConfigError(mismatched)
        with cpu_compat.cuda_factories_on_cpu():
            state = dist_checkpointing.load(template, str(folder), sharded_strategy=load_strategy())
        model.load_state_dict(state["model"]["chunk0"])
        params = _tensors_of(model)
        problems = hf.megatron_problems(table, params)
        if problems:
            raise ConfigError(problems)
        shapes = hf.shapes_of(one, vocab_size)
        tensors = {}
        for link in table:
            for name, value in zip(link.hf, hf.split(link, params[link.megatron].detach().cpu(), shapes)):
                tensors[name] = value.to(dtype)
    finally:
        trainer.teardown()
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        # mkdtemp makes it 0700; the export is for other users and inference pods on a shared /fsx too.
        staging.chmod(0o777 & ~umask())
        _write_safetensors(staging, tensors)
        (staging / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        for name in SIDE_FILES[1:]:
            if (folder.parent / HF_SUBDIR / name).is_file():
                shutil.copyfile(folder.parent / HF_SUBDIR / name, staging / name)
        write_marker(
            staging,
            family=family.model_type,
            architecture=family.architecture,
            dtype=hf_config["torch_dtype"],
            step=int(folder.name.removeprefix("step-")) if folder.name.removeprefix("step-").isdigit() else None,
        )
        for written in staging.iterdir():  # safetensors writes its files 0600, whatever the umask
            written.chmod(0o666 & ~umask())
        if output.exists():
            output.rmdir()
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported %s (%s, %s) to %s", folder, family.architecture, hf_config["torch_dtype"], output)
    return output


def _write_safetensors(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """One ``model.safetensors``, or shards of at most MAX_SHARD_BYTES with save_pretrained's index."""
    from safetensors.torch import save_file

    shards, current, size = [], {}, 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > MAX_SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )
