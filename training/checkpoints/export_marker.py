"""The completion marker of an ``export-hf`` folder, and its reading (no torch: ``moe-cdk serve render`` reads it).

``export-hf`` writes ``moe-export.json`` as the last file of the folder it builds: every other file with its size
in bytes, and what the weights are (family, architecture, dtype, the checkpoint step). On the file system the folder
appears whole, by a rename; but the data repository association exports each file to S3 on its own,
"asynchronously once your application finishes modifying the file" (CloudFormation reference,
AWS::FSx::DataRepositoryAssociation AutoExportPolicy), with no order stated, so a reader of the bucket, or of a
folder copied by hand, can tell a finished export from a partial one only by comparing what is there with the
marker's list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from moe_cdk.core.problems import ConfigError, problem

EXPORT_MARKER = "moe-export.json"
MARKER_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class Export:
    """A finished export: its folder, the marker's fields, and the model's config.json."""

    folder: Path
    family: str
    architecture: str
    dtype: str
    step: int | None
    """The checkpoint's step, when its folder was a step-N."""
    files: dict[str, int]
    """Every file but the marker, with its size in bytes."""
    config: dict

    @property
    def weight_bytes(self) -> int:
        """The safetensors files' bytes: the weights as a server loads them, in the exported dtype."""
        return sum(size for name, size in self.files.items() if name.endswith(".safetensors"))


def write_marker(folder: Path, *, family: str, architecture: str, dtype: str, step: int | None) -> None:
    """Write the marker of ``folder``, listing every file already in it; call it last."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != EXPORT_MARKER}
    marker = {
        "format": MARKER_FORMAT,
        "family": family,
        "architecture": architecture,
        "dtype": dtype,
        "step": step,
        "files": files,
    }
    (folder / EXPORT_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def read_export(folder: Path, *, key: str) -> Export:
    """The export in ``folder``; raises ``ConfigError`` on ``key`` when it has no marker, or a file the marker lists
    is missing or of another size (an export still being written or copied)."""

    def refused(what: str, got: object, allowed: str) -> ConfigError:
        return ConfigError([problem(what, got=got, allowed=allowed).at(key)])

    path = folder / EXPORT_MARKER
    if not path.is_file():
        raise refused(
            f"no {EXPORT_MARKER}: not a finished moe-checkpoint export-hf folder",
            str(folder),
            "a folder export-hf wrote (it writes the marker last)",
        )
    try:
        marker = json.loads(path.read_text())
        files = {str(name): int(size) for name, size in marker["files"].items()}
        fields = {name: marker[name] for name in ("family", "architecture", "dtype", "step")}
        fmt = marker["format"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise refused(
            f"{EXPORT_MARKER} cannot be read", f"{type(error).__name__}: {error}", "export-hf's marker"
        ) from None
    if fmt != MARKER_FORMAT:
        raise refused(f"{EXPORT_MARKER} has another format", fmt, str(MARKER_FORMAT))
    wrong = []
    for name, size in files.items():
        found = folder / name
        if not found.is_file():
            wrong.append(f"{name} missing")
        elif found.stat().st_size != size:
            wrong.append(f"{name} has {found.stat().st_size} bytes, not {size}")
    if wrong:
        raise refused(f"the files differ from what {EXPORT_MARKER} lists", "; ".join(wrong), "the whole export")
    if "config.json" not in files:
        raise refused(f"{EXPORT_MARKER} lists no config.json", sorted(files), "an export with its config.json")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise refused("config.json cannot be read", str(error), "the export's config.json") from None
    return Export(folder=folder, files=files, config=config, **fields)
