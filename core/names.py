"""Names and places more than one layer uses: where a deployment's files are, and the modes of the files
written for other users."""

from __future__ import annotations

import os
from pathlib import Path


def project_root(start: Path | None = None) -> Path:
    """The moe-cdk project a command runs in, against which a configuration's relative paths
    resolve: the nearest folder from ``start`` (default: the working directory) up that holds
    cdk.json, as the CDK CLI finds its app; ``start`` itself when none does. An installed
    package therefore validates a configuration of the project it is run in."""
    here = (start or Path.cwd()).resolve()
    return next((d for d in (here, *here.parents) if (d / "cdk.json").is_file()), here)


def umask() -> int:
    """The process's umask, read by setting it and putting it straight back: a file written for other users
    (a rendered job, an exported model) gets the modes a plain write would, whatever wrote it first."""
    current = os.umask(0o077)
    os.umask(current)
    return current
