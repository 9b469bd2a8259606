"""``moe-cdk plan``: size the training profile on the cluster before anything is deployed."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.nxdt import nxdt_problems
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.schema.config import load_config
from moe_cdk.tools.plan import DEFAULT_MFU, plan, render_table, to_json
from moe_cdk.training.config import load_train_config


def _check_nxdt(config, args: argparse.Namespace) -> None:
    """Raise ``ConfigError`` with every key of the profile NxD Training cannot run on the Trainium groups."""
    train_config = Path(args.train_config) if args.train_config else config.training.path
    label = "--train-config" if args.train_config else "training.profile"
    try:
        train = load_train_config(train_config, tuple(args.set or ()))
    except ConfigError:
        return  # plan() reports the profile's own problems
    if found := nxdt_problems(train, world_size=config.world_size):
        raise ConfigError([dataclasses.replace(p, key=f"{label}: {p.key}") for p in found])


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 when it fits, 2 (problems on stderr) when the configuration is invalid or, after
    printing the plan, when it does not fit."""
    try:
        config = load_config(args.config)
        if config.training_stack is TrainingStack.NXDT:
            _check_nxdt(config, args)
        result = plan(
            config,
            train_config_path=args.train_config,
            mfu=args.mfu,
            train_overrides=tuple(args.set or ()),
        )
    except ConfigError as error:
        return report(args.config, error)
    # The whole plan, also when it does not fit: its breakdown shows which term is too large.
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        sys.stdout.write(render_table(result))
    if result.problems:
        return report(args.config, ConfigError(result.problems))
    return 0


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register ``plan`` on an argparse subparsers object."""
    parser = subcommands.add_parser(
        "plan",
        help="size the training profile on the cluster: memory, cost, throughput, orchestrator; "
        "exit 2 if it does not fit",
    )
    parser.add_argument("--config", required=True, help="infrastructure YAML, e.g. config/default.yaml")
    parser.add_argument("--train-config", help="trainer YAML (default: the configuration's training.profile)")
    parser.add_argument(
        "--mfu",
        type=float,
        default=DEFAULT_MFU,
        help=f"model FLOPs utilisation assumed for throughput (default: {DEFAULT_MFU})",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a trainer key, e.g. parallel.tensor=4 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)
    return parser
