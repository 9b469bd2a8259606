"""The training container: its pins match pyproject's, and the stacks stage exactly its build context."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib

import torch
from conftest import ROOT, read_json, synth

from moe_cdk.cli import image_versions
from moe_cdk.cli.image_versions import read_image_env
from moe_cdk.rules import neuron
from moe_cdk.schema.config import load_config

DOCKERFILE = (ROOT / "training/Dockerfile").read_text()


def test_dockerfile_pins_match_the_train_extra():
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    in_dockerfile = {
        image_versions.requirement_name(r): r for r in re.findall(r'"([A-Za-z0-9_.-]+[=<>~!]=?[^"]+)"', DOCKERFILE)
    }
    for requirement in train:
        name = image_versions.requirement_name(requirement)
        if name in image_versions.IMAGE_PINNED:
            continue  # the image's versions are training/image.env's (the tests below)
        assert in_dockerfile.get(name) == requirement, (
            f"{name}: Dockerfile {in_dockerfile.get(name)!r} vs pyproject {requirement!r}"
        )


IMAGE_ENV = ROOT / "training/image.env"
IMAGE_VERSIONS = ROOT / "cli/image_versions.py"
# This interpreter's, as image_versions.py compares them.
THIS_PYTHON = ".".join(platform.python_version_tuple()[:2])
THIS_TORCH = torch.__version__.split("+")[0]


def _image_env() -> dict[str, str]:
    return read_image_env(IMAGE_ENV)


def test_image_env_names_the_base_images_python_and_torch():
    (base,) = re.findall(r"^ARG BASE_IMAGE=\S+:(\S+)$", DOCKERFILE, re.MULTILINE)
    env = _image_env()
    assert base.startswith(f"{env['IMAGE_TORCH']}-gpu-py{env['IMAGE_PYTHON'].replace('.', '')}-"), base


def test_image_megatron_core_is_the_one_the_suite_runs():
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    assert f"megatron-core=={_image_env()['IMAGE_MEGATRON_CORE']}" in train


def _check_versions(env_file) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(IMAGE_VERSIONS), str(env_file)], capture_output=True, text=True, timeout=120
    )


def test_the_image_build_stops_on_a_base_image_of_other_versions(tmp_path):
    env = tmp_path / "image.env"
    env.write_text("IMAGE_PYTHON=3.99\nIMAGE_TORCH=0.0.1\nIMAGE_MEGATRON_CORE=0.16.1\n")  # not this interpreter's
    done = _check_versions(env)
    assert done.returncode == 1 and done.stdout == ""
    assert f"IMAGE_TORCH=0.0.1 in training/image.env, but the base image has {THIS_TORCH}" in done.stderr
    assert f"IMAGE_PYTHON=3.99 in training/image.env, but the base image has {THIS_PYTHON}" in done.stderr


def test_the_image_build_installs_image_envs_megatron_core_on_a_matching_base(tmp_path):
    env = tmp_path / "image.env"
    env.write_text(
        f"# as it stands\nIMAGE_PYTHON={THIS_PYTHON}\nIMAGE_TORCH={THIS_TORCH}\nIMAGE_MEGATRON_CORE=0.16.1\n"
    )
    done = _check_versions(env)
    assert (done.returncode, done.stdout) == (0, "megatron-core==0.16.1\n")


def test_an_image_env_without_a_key_names_it(tmp_path):
    env = tmp_path / "image.env"
    env.write_text("IMAGE_PYTHON=3.12\n")
    done = _check_versions(env)
    assert done.returncode == 1 and "IMAGE_TORCH, IMAGE_MEGATRON_CORE missing" in done.stderr


def test_the_image_checks_its_versions_before_installing_megatron_core():
    assert "RUN python /etc/moe-cdk/image_versions.py /etc/moe-cdk/image.env > /etc/moe-cdk/megatron-core.txt" in (
        DOCKERFILE
    )
    assert '"megatron-core==' not in DOCKERFILE


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


def _find_python(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(IMAGE_VERSIONS), "--python", str(IMAGE_ENV)],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_images_python_is_found_on_path(tmp_path):
    (tmp_path / f"python{THIS_PYTHON}").symlink_to(sys.executable)
    assert image_versions.find_python(THIS_PYTHON, path=str(tmp_path)) == str(tmp_path / f"python{THIS_PYTHON}")


def test_a_python_on_path_that_does_not_run_is_passed_over(tmp_path):
    """pyenv's shim for a version that is installed but not selected exits 127."""
    shim = tmp_path / f"python{THIS_PYTHON}"
    shim.write_text("#!/bin/sh\necho 'pyenv: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    assert image_versions.find_python(THIS_PYTHON, path=str(tmp_path)) is None


def test_without_the_images_python_set_up_stops_with_one_line_naming_what_to_install(tmp_path):
    done = _find_python(str(tmp_path))  # neither python3.12 nor pyenv
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "no Python 3.12 here (python3.12 on PATH, or pyenv's): install Python 3.12, the training image's "
        "(training/image.env), e.g. `pyenv install 3.12` or Debian's python3.12\n"
    )


def test_make_stops_where_the_images_python_is_missing(tmp_path):
    # A machine with make, bash and a python3 but no Python 3.12: set-up names what to install, and creates nothing.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "bash", "sed", "cat", "cksum", "cut", "date", "rm", "test"):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(sys.executable)
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, clone / name)
    shutil.copytree(ROOT / "training", clone / "training", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copytree(ROOT / "cli", clone / "cli", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "synth-setup"], cwd=clone, env={**env, "PATH": str(bin_dir)}, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "no Python 3.12 here" in done.stderr and "install Python 3.12" in done.stderr
    assert not (clone / ".venv").exists()


NEURON_DOCKERFILE = (ROOT / "training/Dockerfile.neuron").read_text()


def test_neuron_dockerfile_builds_from_the_image_and_commit_the_rules_name():
    assert f"ARG BASE_IMAGE={neuron.NEURON_BASE_IMAGE}\n" in NEURON_DOCKERFILE
    assert f"ARG NXDT_COMMIT={neuron.NXDT_COMMIT}\n" in NEURON_DOCKERFILE
    assert neuron.NXDT_REPOSITORY in NEURON_DOCKERFILE and f"{neuron.NXDT_DIR}/examples" in NEURON_DOCKERFILE


def test_neuron_dockerfile_copies_what_moe_preflight_needs_and_no_more():
    copied = set(re.findall(r"^COPY ([a-z_]+) ", NEURON_DOCKERFILE, re.MULTILINE))
    assert copied == set(re.findall(r"^COPY ([a-z_]+) ", DOCKERFILE, re.MULTILINE))


def test_a_trainium_configuration_builds_the_neuron_image(tmp_path):
    synth(load_config(ROOT / "config/trn2.yaml"), tmp_path)
    (image,) = read_json(tmp_path / "moe-trn2-storage.assets.json")["dockerImages"].values()
    assert image["source"]["dockerFile"] == "training/Dockerfile.neuron"
