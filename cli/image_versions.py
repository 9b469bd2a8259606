"""Checks, while the training image builds, that its base image has the Python and torch that
training/image.env names, and prints the megatron-core requirement to install.

Run as ``python image_versions.py IMAGE_ENV`` (training/Dockerfile does, before the trainer is
installed, so this file uses nothing but the standard library and torch). It exits 1 with a message
naming both sides when the base image differs from the file.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

KEYS = ("IMAGE_PYTHON", "IMAGE_TORCH", "IMAGE_MEGATRON_CORE")


def read_image_env(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of ``path``; blank lines and # comments are skipped."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    missing = [key for key in KEYS if not values.get(key)]
    if missing:
        raise SystemExit(f"{path}: {', '.join(missing)} missing; it must set {', '.join(KEYS)}")
    return values


def mismatches(want: dict[str, str], python: str, torch_version: str) -> list[str]:
    """What differs between the file and this interpreter; torch's local tag (+cu129) is ignored."""
    found = {"IMAGE_PYTHON": python, "IMAGE_TORCH": torch_version.split("+")[0]}
    return [
        f"{key}={want[key]} in training/image.env, but the base image has {found[key]}"
        for key in found
        if found[key] != want[key]
    ]


def main(argv: list[str]) -> int:
    import torch

    want = read_image_env(Path(argv[0]))
    python = ".".join(platform.python_version_tuple()[:2])
    problems = mismatches(want, python, torch.__version__)
    if problems:
        print("; ".join(problems), file=sys.stderr)
        return 1
    print(f"megatron-core=={want['IMAGE_MEGATRON_CORE']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
