"""``moe-cdk status``: the deployed cluster of a configuration (HyperPod or ParallelCluster), node by node."""

from __future__ import annotations

import argparse
import json
import sys

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError
from moe_cdk.schema.config import HYPERPOD, Orchestrator, load_config, require_orchestrator
from moe_cdk.tools.cluster_status import cluster_status, parallelcluster_status, printable, render_status, to_json

EXIT_UNHEALTHY = 1


def run(args: argparse.Namespace) -> int:
    """0 when the cluster is InService with every node Running, 1 when not (or AWS could not be asked),
    2 when the configuration is invalid."""
    try:
        config = load_config(args.config)
        require_orchestrator(
            config,
            "status reads a cluster; a training-job configuration has none",
            *HYPERPOD,
            Orchestrator.PARALLELCLUSTER,
        )
    except ConfigError as error:
        return report(args.config, error)
    import boto3

    def client(service: str):
        return boto3.client(service, region_name=config.region)

    try:
        if config.cluster.orchestrator is Orchestrator.PARALLELCLUSTER:
            status = parallelcluster_status(config, client("cloudformation"), client("ec2"), client("logs"))
        else:
            status = cluster_status(config, client("sagemaker"), client("logs"))
    except NoCredentialsError:
        print(
            f"{args.config}: no AWS credentials were found: set AWS_PROFILE or run `aws configure` "
            f"for the account that holds cluster {config.name} in {config.region}",
            file=sys.stderr,
        )
        return EXIT_UNHEALTHY
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("ResourceNotFound", "ResourceNotFoundException", "ValidationException"):
            print(
                f"{args.config}: cluster {config.name} was not found in {config.region} ({code}): "
                "is the cluster stack deployed there?",
                file=sys.stderr,
            )
        else:
            print(f"{args.config}: AWS refused the request: {printable(str(error))}", file=sys.stderr)
        return EXIT_UNHEALTHY
    except BotoCoreError as error:
        print(f"{args.config}: AWS could not be reached: {printable(str(error))}", file=sys.stderr)
        return EXIT_UNHEALTHY
    if args.json:
        print(json.dumps(to_json(status), indent=2))
    else:
        sys.stdout.write(render_status(status))
    return 0 if status.healthy else EXIT_UNHEALTHY


def add_parser(subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser(
        "status",
        help="the deployed cluster and each node; for a failed HyperPod node, its first failed lifecycle step "
        "and what to do; exit 1 unless in service with every node Running",
    )
    parser.add_argument(
        "--config", required=True, help="infrastructure YAML of a cluster (slurm, eks or parallelcluster)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    parser.set_defaults(run=run)
    return parser
