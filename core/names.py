"""Names and places more than one layer uses: where a deployment's files are."""

from __future__ import annotations

from pathlib import Path


def project_root(start: Path | None = None) -> Path:
    """The moe-cdk project a command runs in, against which a configuration's relative paths
    resolve: the nearest folder from ``start`` (default: the working directory) up that holds
    cdk.json, as the CDK CLI finds its app; ``start`` itself when none does. An installed
    package therefore validates a configuration of the project it is run in."""
    here = (start or Path.cwd()).resolve()
    return next((d for d in (here, *here.parents) if (d / "cdk.json").is_file()), here)
