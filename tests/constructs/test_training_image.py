"""The training container: its pins match pyproject's, and the stacks stage exactly its build context."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT, read_json

DOCKERFILE = (ROOT / "training/Dockerfile").read_text()


def _requirement_name(requirement: str) -> str:
    return re.split(r"[=<>!~ ]", requirement, maxsplit=1)[0].lower()


def test_dockerfile_pins_match_the_train_extra():
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    in_dockerfile = {_requirement_name(r): r for r in re.findall(r'"([A-Za-z0-9_.-]+[=<>~!]=?[^"]+)"', DOCKERFILE)}
    for requirement in train:
        name = _requirement_name(requirement)
        if name == "torch":
            continue  # the base image's CUDA build of torch is used, not the CPU wheel the tests use
        assert in_dockerfile.get(name) == requirement, (
            f"{name}: Dockerfile {in_dockerfile.get(name)!r} vs pyproject {requirement!r}"
        )


def test_base_image_is_a_pinned_deep_learning_container():
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert re.fullmatch(
        r"763104351884\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com/pytorch-training:\d+\.\d+\.\d+-gpu-\S+", base
    )


def test_entry_point_is_moe_train():
    assert 'ENTRYPOINT ["moe-train"]' in DOCKERFILE


def test_stacks_stage_only_the_build_context(default_synth):
    outdir, _ = default_synth
    assets = read_json(outdir / "moe-storage.assets.json")["dockerImages"]
    (image,) = assets.values()
    staged = outdir / image["source"]["directory"]
    assert image["source"]["dockerFile"] == "training/Dockerfile"
    assert sorted(p.name for p in staged.iterdir()) == ["README.md", "cli", "core", "pyproject.toml", "training"]
    assert not list(staged.rglob("__pycache__"))


def test_storage_stack_outputs_the_image_uri(default_synth):
    _, templates = default_synth
    assert "TrainingImageUri" in templates["moe-storage"]["Outputs"]


def test_dockerfile_creates_every_package_folder_the_context_leaves_out():
    """`pip install .` needs each folder pyproject maps; those not in the context are made empty."""
    mapped = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    (made,) = re.findall(r"^RUN mkdir -p ([a-z_ ]+)", DOCKERFILE, re.MULTILINE)
    copied = set(re.findall(r"^COPY ([a-z_]+) ", DOCKERFILE, re.MULTILINE))
    assert copied | set(made.split()) == mapped
    assert not copied & set(made.split())
