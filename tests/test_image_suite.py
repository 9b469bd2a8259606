"""`make test` runs one suite, on the training image's Python, torch and megatron-core (training/image.env): what
the cluster runs is what the tests run."""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import tomllib
from importlib.metadata import version

from conftest import ROOT

from moe_cdk.cli.image_versions import read_image_env

IMAGE = read_image_env(ROOT / "training/image.env")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_make_test_runs_one_suite_in_one_environment():
    # Not the calling make's flags, nor a TEST_WORKERS of the environment: the Makefile's own commands.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TEST_WORKERS")}
    done = subprocess.run(["make", "-n", "test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    runs = [line for line in done.stdout.splitlines() if "pytest" in line]
    assert runs == ["env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest -n 3 --dist loadfile --durations=30"]


def test_python_packages_are_kept_once_per_machine_not_per_checkout():
    # uv installs the suite's packages and keeps every wheel in its own cache (~/.cache/uv), whatever cache headers
    # the index sends; the Makefile points no cache into the checkout, so a fresh clone does not download the 3.8 GB
    # torch build again. Not the calling make's flags, nor a cache setting of the environment: the Makefile's own.
    drop = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "UV_CACHE_DIR", "PIP_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    show = 'caches: ; @echo "[$${UV_CACHE_DIR-}] [$${PIP_CACHE_DIR-}]"'
    done = subprocess.run(["make", "-s", "--eval", show, "caches"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[] []", done.stdout + done.stderr
    done = subprocess.run(["make", "-n", "-B", "setup"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    installs = [line for line in done.stdout.splitlines() if "'.[train,test]'" in line]
    assert installs and all(line.startswith(".venv/bin/uv pip install ") for line in installs), installs
    assert not [line for line in installs if "--no-cache" in line or "--cache-dir" in line], installs


def test_pyproject_pins_the_images_torch_and_megatron_core():
    train = PROJECT["optional-dependencies"]["train"]
    assert f"torch=={IMAGE['IMAGE_TORCH']}" in train
    assert f"megatron-core=={IMAGE['IMAGE_MEGATRON_CORE']}" in train


def test_pyproject_requires_the_images_python():
    assert PROJECT["requires-python"] == f">={IMAGE['IMAGE_PYTHON']}"


def test_this_run_is_on_the_images_versions():
    found = {
        "IMAGE_PYTHON": ".".join(platform.python_version_tuple()[:2]),
        "IMAGE_TORCH": version("torch").split("+")[0],
        "IMAGE_MEGATRON_CORE": version("megatron-core"),
    }
    assert found == {key: IMAGE[key] for key in found}


def test_each_worker_freezes_what_collection_built(request):
    # Frozen objects are in no generation, so gc.get_objects() leaves them out (tests/conftest.py).
    items = request.session.items
    assert not any(tracked is items for tracked in gc.get_objects())
