"""What more than one stack derives from the configuration: resource names, the HyperPod stacks'
synthesizer and the observability both HyperPod orchestrators get. The stack modules import this,
never each other (an import contract in pyproject.toml holds them to it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, IStackSynthesizer, Stack, aws_ssm as ssm

from moe_cdk.constructs.hyperpod_nodes import lifecycle_bundle_id, lifecycle_synthesizer
from moe_cdk.constructs.hyperpod_slurm_cluster import FsxMount, NodeObservability
from moe_cdk.constructs.training_observability import TrainingObservability, TrainingObservabilityProps
from moe_cdk.core.names import project_root
from moe_cdk.schema.config import Config
from moe_cdk.training.config import load_train_config

if TYPE_CHECKING:  # the storage stack is passed in
    from moe_cdk.stacks.storage_stack import StorageStack


def lifecycle_bucket_name(config: Config) -> str:
    """``sagemaker-<account>-<region>-<name>``, with CDK's account placeholder. The prefix is
    what the managed HyperPod instance policy can read (SageMaker API reference,
    ClusterLifeCycleConfig.SourceS3Uri)."""
    return f"sagemaker-${{AWS::AccountId}}-{config.region}-{config.name.lower()}"


def data_bucket_name(config: Config, *, deployment: str | None = None) -> str:
    """The data bucket: ``storage.data_repository.bucket_name``, or ``moe-data-<account>-<region>-<name>``
    (with CDK's account placeholder), so that other stacks can scope permissions to it by name. With
    ``deployment``, the default name of that other deployment's bucket in the same Region."""
    if deployment is None and config.storage.data_repository.bucket_name:
        return config.storage.data_repository.bucket_name
    return f"moe-data-${{AWS::AccountId}}-{config.region}-{(deployment or config.name).lower()}"


def fsx_parameter_names(config: Config) -> tuple[str, str]:
    """SSM parameters with the file system's DNS and mount names, which nodes read at boot."""
    return f"/moe-cdk/{config.name}/fsx/dns-name", f"/moe-cdk/{config.name}/fsx/mount-name"


def fsx_mount(config: Config, storage: StorageStack) -> FsxMount:
    """The storage stack's file system as the Slurm nodes mount it."""
    dns_parameter, mount_parameter = fsx_parameter_names(config)
    return FsxMount(
        file_system_id=storage.lustre.file_system_id,
        availability_zone=config.lustre_availability_zone,
        efa_enabled=config.storage.lustre.efa_enabled,
        dns_name_parameter=dns_parameter,
        mount_name_parameter=mount_parameter,
    )


def remote_write_parameter_name(config: Config) -> str:
    """SSM parameter with the Prometheus workspace's remote-write URL, which the Slurm controller reads at boot."""
    return f"/moe-cdk/{config.name}/observability/remote-write-url"


def node_observability(config: Config) -> NodeObservability | None:
    """What the Slurm nodes' lifecycle scripts need for ``config.observability``; None when it is off."""
    if not config.observability.enabled:
        return None
    return NodeObservability(
        remote_write_url_parameter=remote_write_parameter_name(config),
        scrape_interval_s=config.observability.scrape_interval_s,
        trainer_metrics_port=load_train_config(config.training.path).metrics.prometheus_port,
    )


def add_slurm_observability(stack: Stack, config: Config) -> tuple[TrainingObservability, ssm.StringParameter]:
    """``add_observability`` for a Slurm cluster, whose controller's agent remote-writes to the workspace, and the
    SSM parameter with the workspace's remote-write URL, which the controller reads while it boots (make the
    cluster depend on it, and grant the nodes ``aps:RemoteWrite``)."""
    observability = add_observability(stack, config)
    parameter = ssm.StringParameter(
        stack,
        "RemoteWriteUrl",
        parameter_name=remote_write_parameter_name(config),
        string_value=observability.remote_write_url,
        description="Where the Slurm controller's agent sends the cluster's metrics (Managed Prometheus)",
    )
    return observability, parameter


def hyperpod_synthesizer(config: Config, parameters: dict) -> IStackSynthesizer:
    """The synthesizer of a stack holding a HyperPod cluster: its file assets go to the
    lifecycle bucket, in a folder named after the scripts and ``parameters``."""
    return lifecycle_synthesizer(
        lifecycle_bucket_name(config), lifecycle_bundle_id(str(lifecycle_scripts()), parameters)
    )


def add_observability(stack: Stack, config: Config, **scraper) -> TrainingObservability:
    """``config.observability`` in ``stack``: the workspaces, the alert rules file and the dashboards (the MoE
    dashboard of the Helm chart, the cluster dashboards of observability/dashboards), with the stack outputs
    that point at them. ``scraper``: the EKS scraper's ``cluster_arn``, ``subnets`` and ``security_group``."""
    root = project_root()
    dashboards = [root / "charts/moe-training/dashboards/moe-training.json"]
    dashboards += sorted((root / "observability/dashboards").glob("*.json"))
    observability = TrainingObservability(
        stack,
        "Observability",
        TrainingObservabilityProps(
            name=config.name,
            scrape_interval_s=config.observability.scrape_interval_s,
            alert_rules=(root / "observability/alerts/moe-training.rules.yaml").read_text(),
            dashboards={path.name: path.read_text() for path in dashboards},
            **scraper,
        ),
    )
    CfnOutput(stack, "PrometheusWorkspaceId", value=observability.workspace.attr_workspace_id)
    CfnOutput(stack, "PrometheusQueryUrl", value=observability.workspace.attr_prometheus_endpoint)
    CfnOutput(stack, "GrafanaUrl", value=observability.grafana.attr_endpoint)
    return observability


def lifecycle_scripts() -> Path:
    """The project's lifecycle_scripts folder, which the HyperPod stacks publish."""
    return project_root() / "lifecycle_scripts"
