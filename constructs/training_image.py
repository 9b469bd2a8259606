"""The training container image, built from training/Dockerfile as a CDK asset at deploy time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import IgnoreMode, aws_ecr_assets as ecr_assets, aws_iam as iam
from constructs import Construct

from moe_cdk.constructs.validation import problem, raise_if_any

# Only what `pip install .` needs reaches the Docker build context (and cdk.out).
BUILD_CONTEXT_FILES = ("pyproject.toml", "README.md", "constructs", "rules", "stacks", "training")
# Where the image holds the checkout's files (training/Dockerfile's WORKDIR): a trainer
# profile `training/configs/x.yaml` is `/opt/moe-cdk/training/configs/x.yaml` in a job.
IMAGE_CHECKOUT_DIR = "/opt/moe-cdk"


@dataclass(frozen=True, kw_only=True)
class TrainingImageProps:
    context_directory: str
    """The moe-cdk checkout: the Docker build context. Required."""
    dockerfile: str = "training/Dockerfile"
    """The Dockerfile, relative to ``context_directory``. Default: training/Dockerfile."""
    build_args: dict[str, str] | None = None
    """Docker build arguments, e.g. ``{"BASE_IMAGE": "..."}`` for another region's base image. Default: none."""
    extra_context: Sequence[str] = ()
    """Further paths of the checkout to send to the build. Default: none."""


class TrainingImage(Construct):
    """The trainer's container image. Synth stages the build context only; Docker runs at ``cdk deploy``.

    ``image_uri`` is what Slurm (pyxis), EKS and SageMaker Training Jobs run;
    ``grant_pull`` lets a node or job role pull it.
    """

    def __init__(self, scope: Construct, id: str, props: TrainingImageProps) -> None:
        super().__init__(scope, id)
        raise_if_any("TrainingImage", [
            "extra_context: " + problem("must be relative paths inside the checkout", got=path, allowed="e.g. config")
            for path in props.extra_context if path.startswith("/") or ".." in path.split("/")
        ])
        keep = [*BUILD_CONTEXT_FILES, *props.extra_context]
        self.asset = ecr_assets.DockerImageAsset(
            self, "Resource",
            directory=props.context_directory,
            file=props.dockerfile,
            build_args=props.build_args,
            platform=ecr_assets.Platform.LINUX_AMD64,
            ignore_mode=IgnoreMode.DOCKER,
            exclude=["**", *(f"!{path}" for path in keep), "**/__pycache__", "training/**/*.pyc"],
        )
        self.image_uri: str = self.asset.image_uri

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.asset.repository.grant_pull(grantee)
