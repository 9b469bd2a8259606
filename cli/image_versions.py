"""The training image's versions (training/image.env): the image build checks its base image against them, and
``make`` finds their Python for the one environment of synthesis and the test suite.

- ``python image_versions.py IMAGE_ENV``: training/Dockerfile runs this before the trainer is
  installed. It exits 1 with a message naming both sides when the base image's Python or torch
  differs from the file, and otherwise prints the megatron-core requirement to install.
- ``python image_versions.py --python IMAGE_ENV``: the path of an interpreter of the image's Python; where
  none is installed, one line on stderr naming what to install, and exit 1.

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
    parser.add_argument("--python", action="store_true", help="print an interpreter of the image's Python")
    parser.add_argument("image_env", metavar="IMAGE_ENV", type=Path)
    args = parser.parse_args(argv)
    want = read_image_env(args.image_env)
    this_python = ".".join(platform.python_version_tuple()[:2])
    if args.python:
        version = want["IMAGE_PYTHON"]
        found = find_python(version)
        if found is None:
            print(
                f"no Python {version} here (python{version} on PATH, or pyenv's): install Python {version}, the "
                f"training image's (training/image.env), e.g. `pyenv install {version}` or Debian's python{version}",
                file=sys.stderr,
            )
            return 1
        print(found)
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
