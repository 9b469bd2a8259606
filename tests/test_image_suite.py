"""`make test` tests the trainer twice: on the suite's versions (pyproject.toml), then the tests marked
image_versions on the training image's (training/image.env), in .venv-image."""

from __future__ import annotations

import os
import subprocess

from conftest import PYTHON, ROOT

# What issue 30 asks to run on the image's versions, by test module.
CONCERNS = {
    "the step": "tests/training/test_trainer.py",
    "the layouts": "tests/training/test_layout_equivalence.py",
    "checkpoint save, load and resume, the sequential reader and the CRC setting": (
        "tests/training/test_checkpoint_format.py"
    ),
    "the guards of torch and megatron-core internals": "tests/training/test_checkpoint_fallback.py",
    "the CPU shims": "tests/training/test_model_adapter.py",
    "Hugging Face import and export": "tests/training/test_hf_checkpoint.py",
    "the preflight's torch collectives": "tests/jobs/test_preflight_job.py",
}


def test_make_test_runs_the_image_versions_tests_after_the_suite():
    # Not the calling make's flags, nor a TEST_WORKERS of the environment: the Makefile's own commands.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TEST_WORKERS")}
    done = subprocess.run(["make", "-n", "test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    commands = done.stdout.splitlines()
    suite = commands.index(".venv/bin/python -m pytest -n 4 --dist loadfile")
    image = commands.index(
        ".venv-image/bin/python -m pytest -n 4 --dist loadfile -m image_versions tests/training tests/jobs"
    )
    assert suite < image


def test_the_image_versions_run_covers_each_concern():
    done = subprocess.run(
        [PYTHON, "-m", "pytest", "--collect-only", "-q", "-m", "image_versions", "tests/training", "tests/jobs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    modules = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert {concern: path for concern, path in CONCERNS.items() if path not in modules} == {}
