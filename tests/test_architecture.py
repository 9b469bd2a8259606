"""The layers of docs/architecture.md hold: import-linter's contracts (pyproject.toml), the
commands that must not start the CDK, and the linter."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGES = ("cli", "constructs", "core", "jobs", "rules", "schema", "stacks", "tools", "training")
BIN = Path(sys.executable).parent


def staged(tmp_path: Path) -> Path:
    """The source folders laid out as the installed ``moe_cdk`` package, with an ``__init__.py``
    in each. The checkout maps them through setuptools' package-dir, as namespace packages
    grimp (import-linter's graph) cannot walk."""
    root = tmp_path / "site"
    for name in PACKAGES:
        target = root / "moe_cdk" / name
        shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (target / "__init__.py").touch()
    (root / "moe_cdk" / "__init__.py").touch()
    return root


def lint_imports(site: Path) -> subprocess.CompletedProcess:
    # Run outside the checkout so that the staged copy, not the editable install, is imported.
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=site,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_contracts_hold(tmp_path):
    result = lint_imports(staged(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def test_a_construct_importing_the_trainer_breaks_the_layers(tmp_path):
    site = staged(tmp_path)
    module = site / "moe_cdk/constructs/lustre_storage.py"
    module.write_text(module.read_text() + "\nfrom moe_cdk.training import config  # noqa: E402,F401\n")
    result = lint_imports(site)
    assert result.returncode == 1
    assert "moe_cdk.constructs.lustre_storage -> moe_cdk.training.config" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "--config", "config/default.yaml"],
        ["plan", "--config", "config/default.yaml"],
    ],
    ids=["validate", "plan"],
)
def test_a_command_that_reads_a_configuration_loads_no_cdk(argv):
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "moe_cdk.cli.main", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    ]
    assert "moe_cdk.schema.config" in imported
    assert not [m for m in imported if m.split(".")[0] in ("aws_cdk", "jsii", "cdk_nag", "constructs")]


def test_ruff_is_clean():
    result = subprocess.run(
        [str(BIN / "ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout


def _prints_or_exits(path: Path) -> list[str]:
    """``file:line: call`` for each print, exit or SystemExit in a module."""
    label = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            # os._exit is left out: training/stop.py ends an orphaned helper process with it, which
            # reports nothing to anyone.
            if name in ("print", "sys.exit", "exit", "quit"):
                found.append(f"{label}:{node.lineno}: {name}")
        elif isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc):
            found.append(f"{label}:{node.lineno}: raise SystemExit")
    return found


def test_only_the_command_line_prints_or_exits():
    libraries = [p for name in PACKAGES if name != "cli" for p in sorted((ROOT / name).glob("*.py"))]
    assert [line for path in libraries for line in _prints_or_exits(path)] == []


def test_the_scan_finds_a_print(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("import sys\n\ndef f():\n    print('x')\n    sys.exit(2)\n")
    assert [line.split(": ")[1] for line in _prints_or_exits(module)] == ["print", "sys.exit"]


# Files of the machine the project was built on, which a clone does not have.
OUTSIDE = ("../shared", "REFERENCE.md", "STYLE.md", "/work/")


def test_no_tracked_file_cites_a_file_outside_the_repository():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in filter(None, listed.decode().split("\0")):
        path = ROOT / name
        if name == "tests/test_architecture.py" or not path.is_file():
            continue
        text = path.read_bytes().decode(errors="ignore")
        found += [f"{name}: {marker}" for marker in (*OUTSIDE, str(ROOT)) if marker in text]
    assert not found, found
