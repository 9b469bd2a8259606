"""The training container image, built from training/Dockerfile as a CDK asset at deploy time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import IgnoreMode, aws_ecr_assets as ecr_assets, aws_iam as iam
from constructs import Construct

from moe_cdk.constructs.validation import problem, raise_if_any

# Only what the container runs reaches the Docker build context (and cdk.out): the trainer, the
# core it imports and its commands, with what `pip install .` reads (training/Dockerfile).
BUILD_CONTEXT_FILES = ("pyproject.toml", "README.md", "core", "training", "cli")


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
        raise_if_any(
            "TrainingImage",
            [
                problem("must be relative paths inside the checkout", got=path, allowed="e.g. config").at(
                    "extra_context"
                )
                for path in props.extra_context
                if path.startswith("/") or ".." in path.split("/")
            ],
        )
        keep = [*BUILD_CONTEXT_FILES, *props.extra_context]
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Resource",
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
