"""``make hyperpod-chart``: stage AWS's HyperPod dependencies chart for an EKS configuration.

    python -m moe_cdk.cli.chart --config config/eks-p5en.yaml

Exit codes: 0 staged (or nothing to stage), 1 the fetch or ``helm dependency build`` failed,
2 the configuration is invalid.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import datetime, timezone

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError
from moe_cdk.schema.config import Orchestrator, load_config
from moe_cdk.tools.hyperpod_chart import is_staged, stage


def log(message: str) -> None:
    print(f"{datetime.now(timezone.utc):%H:%M:%S} {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperpod-chart", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", required=True, help="configuration; nothing is staged unless its orchestrator is eks"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as error:
        return report(args.config, error)
    if config.cluster.orchestrator is not Orchestrator.EKS:
        log(f"{args.config}: no HyperPod dependencies chart to stage")
        return 0
    destination = config.eks.hyperpod_chart_path
    if is_staged(destination):
        log(f"{destination} already holds the pinned chart")
        return 0
    try:
        stage(destination, log=log)
    except (subprocess.CalledProcessError, OSError, RuntimeError) as error:
        print(f"{args.config}: staging the HyperPod chart failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
