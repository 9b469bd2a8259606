"""What more than one stack derives from the configuration: resource names and the HyperPod
stacks' synthesizer. The stack modules import this, never each other (an import contract
in pyproject.toml holds them to it)."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IStackSynthesizer

from moe_cdk.constructs.hyperpod_nodes import lifecycle_bundle_id, lifecycle_synthesizer
from moe_cdk.core.names import project_root
from moe_cdk.schema.config import Config


def lifecycle_bucket_name(config: Config) -> str:
    """``sagemaker-<account>-<region>-<name>``, with CDK's account placeholder. The prefix is
    what the managed HyperPod instance policy can read (SageMaker API reference,
    ClusterLifeCycleConfig.SourceS3Uri)."""
    return f"sagemaker-${{AWS::AccountId}}-{config.region}-{config.name.lower()}"


def data_bucket_name(config: Config) -> str:
    """The data bucket: ``storage.data_repository.bucket_name``, or ``moe-data-<account>-<region>-<name>``
    (with CDK's account placeholder), so that other stacks can scope permissions to it by name."""
    return (
        config.storage.data_repository.bucket_name
        or f"moe-data-${{AWS::AccountId}}-{config.region}-{config.name.lower()}"
    )


def fsx_parameter_names(config: Config) -> tuple[str, str]:
    """SSM parameters with the file system's DNS and mount names, which nodes read at boot."""
    return f"/moe-cdk/{config.name}/fsx/dns-name", f"/moe-cdk/{config.name}/fsx/mount-name"


def hyperpod_synthesizer(config: Config, parameters: dict) -> IStackSynthesizer:
    """The synthesizer of a stack holding a HyperPod cluster: its file assets go to the
    lifecycle bucket, in a folder named after the scripts and ``parameters``."""
    return lifecycle_synthesizer(
        lifecycle_bucket_name(config), lifecycle_bundle_id(str(lifecycle_scripts()), parameters)
    )


def lifecycle_scripts() -> Path:
    """The project's lifecycle_scripts folder, which the HyperPod stacks publish."""
    return project_root() / "lifecycle_scripts"
