"""Stand-ins for the software node_packages.txt pins, for the lifecycle tests (a library, not a test file).

The tests reach no network: a sandbox's node_packages.txt points at files and a git repository
made here. enroot's release packages become real .deb files built with dpkg-deb (an ``enroot``
command that prints its version), and pyxis's source a real git repository, tagged as pyxis is,
whose Makefile has pyxis's install contract (tests/fixtures/pyxis-standin/Makefile) and builds
the stand-in SPANK plugin (tests/fixtures/spank_standin.c) against Slurm's own headers.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENROOT_VERSION = "3.4.1"
PYXIS_VERSION = "0.19.0"


def spank_standin(out_dir: Path) -> Path:
    """The stand-in SPANK plugin built into ``out_dir``: the pyxis a test registers in a plugstack."""
    plugin = out_dir / "spank_standin.so"
    compiler = shutil.which("gcc") or "cc"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(plugin), str(FIXTURES / "spank_standin.c")],
        check=True,
        capture_output=True,
    )
    return plugin


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def build_deb(out_dir: Path, package: str, files: dict[str, str]) -> Path:
    """A real .deb of ``package`` holding ``files`` (path in the package -> text; under usr/bin, executable)."""
    tree = out_dir / f"{package}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: {package}\nVersion: {ENROOT_VERSION}-1\nArchitecture: amd64\n"
        "Maintainer: moe-cdk tests <tests@example.com>\nDescription: stand-in for the lifecycle tests\n"
    )
    for relative, text in files.items():
        path = tree / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if relative.startswith("usr/bin/") else 0o644)
    deb = out_dir / f"{package}_{ENROOT_VERSION}-1_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)], check=True, capture_output=True)
    shutil.rmtree(tree)
    return deb


def enroot_debs(out_dir: Path) -> tuple[Path, Path]:
    """enroot and enroot+caps, named as NVIDIA's release assets are."""
    out_dir.mkdir(parents=True, exist_ok=True)
    main = build_deb(
        out_dir,
        "enroot",
        {"usr/bin/enroot": f'#!/bin/sh\n[ "$1" = version ] && echo {ENROOT_VERSION}\nexit 0\n'},
    )
    caps = build_deb(out_dir, "enroot+caps", {"usr/share/doc/enroot+caps/README": "capabilities\n"})
    return main, caps


def pyxis_repo(out_dir: Path, version: str = PYXIS_VERSION) -> tuple[Path, str]:
    """A git repository of the stand-in source with tag v<version>; (its path, the tagged commit)."""
    repo = out_dir / "pyxis.git"
    repo.mkdir(parents=True)
    shutil.copy(FIXTURES / "pyxis-standin/Makefile", repo / "Makefile")
    shutil.copy(FIXTURES / "spank_standin.c", repo / "spank_standin.c")

    def git(*args: str) -> str:
        env = {
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
            "PATH": "/usr/bin:/bin",
            "HOME": str(out_dir),
        }
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", f"stand-in pyxis {version}")
    git("tag", f"v{version}")
    return repo, git("rev-parse", "HEAD").strip()


def manifest(
    *, enroot: tuple[Path, Path] | None, pyxis: tuple[Path, str] | None, base: Path, enroot_check: str | None = None
) -> str:
    """node_packages.txt for a sandbox: the given stand-ins, or sources under ``base`` that do not exist
    (so a download that was not meant to happen fails at once, without a network)."""
    main, caps = enroot or (base / "absent/enroot_3.4.1-1_{arch}.deb", base / "absent/enroot+caps_3.4.1-1_{arch}.deb")
    repo, commit = pyxis or (base / "absent/pyxis.git", "0" * 40)

    def check(deb: Path) -> str:
        if enroot_check is not None:
            return enroot_check
        return sha256(deb) if deb.exists() else "-"

    return (
        "# node_packages.txt of a test sandbox (tests/lifecycle_scripts/node_packages.py)\n"
        f"enroot {ENROOT_VERSION} file://{main} {check(main)}\n"
        f"enroot+caps {ENROOT_VERSION} file://{caps} {check(caps)}\n"
        f"pyxis {PYXIS_VERSION} {repo} commit:{commit}\n"
    )
