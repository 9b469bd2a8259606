"""Names and places more than one layer uses: where a deployment's files are, and where the
training image holds them."""

from __future__ import annotations

from pathlib import Path

# Where the training image holds the project's files (training/Dockerfile's WORKDIR): a trainer
# profile `training/configs/x.yaml` is `/opt/moe-cdk/training/configs/x.yaml` in a job.
IMAGE_CHECKOUT_DIR = "/opt/moe-cdk"


def project_root(start: Path | None = None) -> Path:
    """The moe-cdk project a command runs in, against which a configuration's relative paths
    resolve: the nearest folder from ``start`` (default: the working directory) up that holds
    cdk.json, as the CDK CLI finds its app; ``start`` itself when none does. An installed
    package therefore validates a configuration of the project it is run in."""
    here = (start or Path.cwd()).resolve()
    return next((d for d in (here, *here.parents) if (d / "cdk.json").is_file()), here)
