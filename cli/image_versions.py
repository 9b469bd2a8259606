"""The training image's versions (training/image.env), for the image build and for the suite that
tests the trainer on them.

- ``python image_versions.py IMAGE_ENV``: training/Dockerfile runs this before the trainer is
  installed. It exits 1 with a message naming both sides when the base image's Python or torch
  differs from the file, and otherwise prints the megatron-core requirement to install.
- ``python image_versions.py --requirements PYPROJECT IMAGE_ENV``: the suite's requirements
  (pyproject's dependencies, ``train`` and ``test`` extras) with the image's torch and megatron-core
  in place of pyproject's pins; ``make test`` installs them into ``.venv-image``.
- ``python image_versions.py --python IMAGE_ENV``: the path of an interpreter of the image's Python,
  or of this one where none is installed (with a line on stderr saying so).

Standard library only, so that it runs in the base image before anything is installed (torch is
imported by the first form alone).
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

KEYS = ("IMAGE_PYTHON", "IMAGE_TORCH", "IMAGE_MEGATRON_CORE")
# pyproject's requirements that the image's versions replace, by distribution name.
IMAGE_PINNED = {"torch": "IMAGE_TORCH", "megatron-core": "IMAGE_MEGATRON_CORE"}


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


def requirement_name(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503): ``Megatron_Core>=1`` is megatron-core."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement)[0]).lower()


def suite_requirements(want: dict[str, str], pyproject: Path) -> list[str]:
    """pyproject's dependencies and its train and test extras, torch and megatron-core at the image's versions."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = []
    for requirement in [*project["dependencies"], *extras["train"], *extras["test"]]:
        name = requirement_name(requirement)
        pinned = f"{name}=={want[IMAGE_PINNED[name]]}" if name in IMAGE_PINNED else requirement
        if pinned not in requirements:
            requirements.append(pinned)
    return requirements


def _runs_as(python: str, version: str) -> bool:
    """Whether ``python`` starts and is ``version`` (a pyenv shim on PATH may name a version it will not run)."""
    try:
        done = subprocess.run(
            [python, "-c", "import platform; print(*platform.python_version_tuple()[:2], sep='.')"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return False
    return done.returncode == 0 and done.stdout.strip() == version


def find_python(version: str, path: str | None = None) -> str | None:
    """An interpreter of ``version`` that runs: ``python3.12`` on ``path`` (default PATH), else pyenv's
    newest 3.12.x (``pyenv prefix``); None where there is neither."""
    candidates = [shutil.which(f"python{version}", path=path)]
    if pyenv := shutil.which("pyenv", path=path):
        done = subprocess.run([pyenv, "prefix", version], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            candidates += [str(Path(prefix) / "bin" / f"python{version}") for prefix in done.stdout.strip().split(":")]
    return next((c for c in candidates if c and _runs_as(c, version)), None)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="image_versions.py", description=__doc__.split("\n\n")[0])
    form = parser.add_mutually_exclusive_group()
    form.add_argument(
        "--requirements", metavar="PYPROJECT", type=Path, help="print the image-version suite's requirements"
    )
    form.add_argument("--python", action="store_true", help="print an interpreter of the image's Python")
    parser.add_argument("image_env", metavar="IMAGE_ENV", type=Path)
    args = parser.parse_args(argv)
    want = read_image_env(args.image_env)
    this_python = ".".join(platform.python_version_tuple()[:2])
    if args.requirements:
        print("\n".join(suite_requirements(want, args.requirements)))
        return 0
    if args.python:
        found = find_python(want["IMAGE_PYTHON"])
        if found is None:
            print(
                f"image_versions.py: no Python {want['IMAGE_PYTHON']} here (python{want['IMAGE_PYTHON']} on PATH, "
                f"pyenv); the image's torch and megatron-core run on this Python {this_python} instead",
                file=sys.stderr,
            )
        print(found or sys.executable)
        return 0

    import torch

    problems = mismatches(want, this_python, torch.__version__)
    if problems:
        print("; ".join(problems), file=sys.stderr)
        return 1
    print(f"megatron-core=={want['IMAGE_MEGATRON_CORE']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
