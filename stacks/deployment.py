"""Builds the CDK app for one configuration: the stacks, cdk-nag, and a one-line summary per stack."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from moe_cdk.core.names import project_root
from moe_cdk.schema.config import Config, Orchestrator
from moe_cdk.stacks.cluster_stack import SlurmClusterStack
from moe_cdk.stacks.eks_stack import EksStack
from moe_cdk.stacks.hyperpod_eks_stack import HyperPodEksStack
from moe_cdk.stacks.network_stack import NetworkStack
from moe_cdk.stacks.parallelcluster_stack import ParallelClusterStack
from moe_cdk.stacks.storage_stack import StorageStack
from moe_cdk.stacks.training_job_stack import TrainingJobStack

DEFAULT_CONFIG = "config/default.yaml"


def cdk_json_context(cdk_json: Path | None = None) -> dict:
    """The context the CDK CLI would pass for cdk.json, which ``python app.py`` would otherwise ignore:
    its ``context`` block, path and asset metadata on (the CLI's defaults), and version reporting as
    cdk.json sets it. With it, ``python app.py`` and ``cdk synth`` write the same templates.
    """
    settings = json.loads((cdk_json or project_root() / "cdk.json").read_text())
    return {
        "aws:cdk:enable-path-metadata": True,
        "aws:cdk:enable-asset-metadata": True,
        "aws:cdk:version-reporting": settings.get("versionReporting", True),
        **settings.get("context", {}),
    }


def add_stacks(app: cdk.App, config: Config) -> dict[str, cdk.Stack]:
    """Every stack of a deployment, keyed by role; stack names start with ``config.name``."""
    env = cdk.Environment(region=config.region)
    network = NetworkStack(
        app,
        f"{config.name}-network",
        config=config,
        env=env,
        description="moe-cdk: VPC, endpoints and the EFA security group",
    )
    storage = StorageStack(
        app,
        f"{config.name}-storage",
        config=config,
        env=env,
        network=network.network,
        node_security_group=network.node_security_group,
        description="moe-cdk: FSx for Lustre and its S3 data repository",
    )
    stacks = {"network": network, "storage": storage}
    # The orchestrators whose cluster is one stack over the network and storage stacks.
    single = {
        Orchestrator.SLURM: (SlurmClusterStack, "SageMaker HyperPod cluster orchestrated by Slurm"),
        Orchestrator.PARALLELCLUSTER: (ParallelClusterStack, "AWS ParallelCluster cluster orchestrated by Slurm"),
    }
    if config.cluster.orchestrator in single:
        stack_class, what = single[config.cluster.orchestrator]
        stacks["cluster"] = stack_class(
            app,
            f"{config.name}-cluster",
            config=config,
            env=env,
            network=network,
            storage=storage,
            description=f"moe-cdk: {what}",
        )
    elif config.cluster.orchestrator is Orchestrator.EKS:
        stacks["eks"] = EksStack(
            app,
            f"{config.name}-eks",
            config=config,
            env=env,
            network=network,
            storage=storage,
            description="moe-cdk: EKS control plane, cluster software, FSx volume and observability",
        )
        stacks["cluster"] = HyperPodEksStack(
            app,
            f"{config.name}-cluster",
            config=config,
            env=env,
            network=network,
            storage=storage,
            eks_stack=stacks["eks"],
            description="moe-cdk: SageMaker HyperPod cluster orchestrated by EKS",
        )
    elif config.cluster.orchestrator is Orchestrator.TRAINING_JOB:
        stacks["training-job"] = TrainingJobStack(
            app,
            f"{config.name}-training-job",
            config=config,
            env=env,
            network=network,
            storage=storage,
            description="moe-cdk: execution role and wiring for SageMaker Training Jobs",
        )
    for stack in stacks.values():
        cdk.Tags.of(stack).add("moe-cdk:deployment", config.name)
    return stacks


def add_nag_checks(app: cdk.App) -> None:
    """Have cdk-nag's AwsSolutions pack check every stack at synth; an unacknowledged finding fails the synth."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def build_app(config: Config, *, outdir: str | None = None, cloudformation_validation: bool = True) -> cdk.App:
    """A ready App for ``config`` with cdk.json's context, as ``make synth`` builds it."""
    app = cdk.App(
        outdir=outdir, context=cdk_json_context(), builtin_cloud_formation_validation=cloudformation_validation
    )
    add_stacks(app, config)
    add_nag_checks(app)
    return app


def summary_lines(assembly: cdk.cx_api.CloudAssembly) -> list[str]:
    """One line per synthesized stack: name, resource count, template path."""
    lines = []
    for stack in assembly.stacks:
        resources = stack.template.get("Resources", {})
        lines.append(
            f"{stack.stack_name}: {len(resources)} resources -> {Path(assembly.directory).name}/{stack.template_file}"
        )
    return lines
