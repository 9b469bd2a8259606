"""``moe-cdk parallelcluster-check``: a synthesized ParallelCluster cluster through AWS ParallelCluster's own schema and
validators, offline (``make synth`` runs it after synthesizing a ParallelCluster configuration).

The ``ClusterConfiguration`` in the cluster stack's template is resolved as deployed, and the facts the validators ask
AWS for are taken from the synthesized stacks (tools/parallelcluster_deployment.py); cli/parallelcluster_validate.py
then runs ParallelCluster's code with its own interpreter (``make parallelcluster``). Its findings are printed in its
own words.

Exit codes: 0 no ERROR from ParallelCluster (warnings are printed), 1 ParallelCluster refused the configuration (or
its code is not set up), 2 invalid input (a configuration of another orchestrator, or no synthesized templates).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from moe_cdk.cli.report import report
from moe_cdk.core.names import project_root
from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.rules.parallelcluster import VERSION
from moe_cdk.schema.config import Orchestrator, load_config, require_orchestrator
from moe_cdk.tools.parallelcluster_deployment import ParallelClusterDeployment
from moe_cdk.tools.synth_diff import PARALLELCLUSTER_PYTHON, read_templates

EXIT_REFUSED = 1


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        require_orchestrator(
            config, "parallelcluster-check needs a ParallelCluster configuration", Orchestrator.PARALLELCLUSTER
        )
        templates = read_templates(Path(args.cdk_out))
        if f"{config.name}-cluster" not in templates:
            raise ConfigError(
                [
                    problem(
                        f"holds no template of stack {config.name}-cluster",
                        got=args.cdk_out,
                        allowed=f"the folder `make synth CONFIG={args.config}` wrote",
                    ).at("--cdk-out")
                ]
            )
    except ConfigError as error:
        return report(args.config, error)
    python = project_root() / PARALLELCLUSTER_PYTHON
    if not python.exists():
        print(
            f"{args.config}: ParallelCluster {VERSION}'s own code is not set up ({python}): run make parallelcluster",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    deployment = ParallelClusterDeployment(templates, config)
    with tempfile.TemporaryDirectory(prefix="moe-cdk-pcluster-") as folder:
        cluster_file, facts_file = Path(folder) / "cluster.yaml", Path(folder) / "facts.json"
        cluster_file.write_text(yaml.safe_dump(deployment.cluster_configuration(), sort_keys=False))
        facts_file.write_text(json.dumps(deployment.facts()))
        command = [str(python), str(project_root() / "cli/parallelcluster_validate.py"), str(cluster_file),
                   "--facts", str(facts_file), "--cluster-name", deployment.cluster_name]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if done.returncode == 0:
        return 0
    print(f"{args.config}: ParallelCluster {VERSION} refuses the synthesized cluster (above)", file=sys.stderr)
    return EXIT_REFUSED


def add_parser(subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser(
        "parallelcluster-check",
        help="check a synthesized ParallelCluster cluster with ParallelCluster's own schema and validators, offline; "
        "exit 1 when it refuses the cluster",
    )
    parser.add_argument("--config", required=True, help="infrastructure YAML of a ParallelCluster cluster")
    parser.add_argument("--cdk-out", default="cdk.out", help="the synthesized templates (default: cdk.out)")
    parser.set_defaults(run=run)
    return parser
