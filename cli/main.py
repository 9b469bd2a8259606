"""The ``moe-cdk`` command line.

Reading and checking a configuration, planning and rendering jobs load no CDK: only
``synth`` (cli/synth.py, app.py's entry point) starts the jsii runtime.

Exit codes: 0 success, 1 a check failed (a stale reference, a synthesized app that fails
cdk-nag), 2 the configuration or the command line is invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moe_cdk.cli.report import emit, report, require_image
from moe_cdk.core.problems import ConfigError, raise_if_any
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.jobs.slurm_job import job_spec_from_config, render_sbatch
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.rules.teams import job_team
from moe_cdk.schema.config import (
    SLURM_CLUSTERS,
    load_config,
    reference_docs,
    require_orchestrator,
    synth_prerequisite_problems,
)

EXIT_CHECK_FAILED = 1


def _validate(args: argparse.Namespace) -> int:
    """Exit 2 for a file with problems. A valid file exits 0 even where synth still needs something
    that is not in the file (an EKS cluster's staged HyperPod chart): that is listed after it, with
    the command that provides it."""
    try:
        config = load_config(args.config)
    except ConfigError as error:
        return report(args.config, error)
    print(f"{args.config}: valid")
    for needed in synth_prerequisite_problems(config):
        print(f"synth still needs: {needed}")
    return 0


def _neuron_sbatch(args: argparse.Namespace, config) -> tuple[str, str]:
    """The NxD Training batch script for a Trainium configuration (jobs/neuron_job.py)."""
    from moe_cdk.jobs.neuron_job import neuron_run, render_neuron_sbatch, slurm_spec

    require_image(args, "NxD Training runs in the Neuron image (the storage stack's TrainingImageUri)")
    run = neuron_run(
        config,
        load_job_profile(config, args.train_config, args.train_arg),
        group=args.group,
        nodes=args.nodes,
        name=args.job_name,
    )
    account, qos = job_team(config.teams, args.team, args.qos)
    spec = slurm_spec(
        config,
        run,
        image=args.image,
        time_limit=args.time,
        signal_lead_seconds=args.signal_lead,
        qos=qos,
        account=account,
        nice=args.nice,
        max_requeues=args.max_requeues,
        after=args.after,
    )
    raise_if_any(spec.problems())
    return render_neuron_sbatch(spec, run), f"NxD Training: {spec.nodes} node(s) x {run.spec.ranks_per_node} ranks"


def _slurm_render(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        require_orchestrator(config, "slurm render needs a Slurm configuration", *SLURM_CLUSTERS)
        if config.training_stack is TrainingStack.NXDT:
            text, summary = _neuron_sbatch(args, config)
            return emit(text, args.output, summary)
        spec = job_spec_from_config(
            config,
            profile=load_job_profile(config, args.train_config, args.train_arg),
            image=args.image,
            local=args.local,
            python=args.python,
            group=args.group,
            nodes=args.nodes,
            time_limit=args.time,
            signal_lead_seconds=args.signal_lead,
            qos=args.qos,
            team=args.team,
            nice=args.nice,
            max_requeues=args.max_requeues,
            job_name=args.job_name,
            train_args=tuple(args.train_arg),
            after=args.after,
            nsys_rank=args.nsys_rank,
        )
    except ConfigError as error:
        return report(args.config, error)
    problems = spec.problems()
    if problems:
        return report(args.config, ConfigError(problems))
    return emit(render_sbatch(spec), args.output, f"{spec.nodes} node(s) x {spec.tasks_per_node} task(s)")


def _print_or_check(text: str, check: str | None) -> int:
    """Print a generated file, or with ``--check FILE`` exit 1 when FILE differs from it."""
    if check is None:
        sys.stdout.write(text)
        return 0
    if (Path(check).read_text() if Path(check).exists() else "") != text:
        print(f"{check} is out of date; run: make docs", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return 0


def _config_docs(args: argparse.Namespace) -> int:
    return _print_or_check(reference_docs(), args.check)


def _config_schema(args: argparse.Namespace) -> int:
    from moe_cdk.schema.config import config_schema
    from moe_cdk.training.config import train_config_schema

    schema = train_config_schema() if args.trainer else config_schema()
    return _print_or_check(json.dumps(schema, indent=2) + "\n", args.check)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-cdk", description="moe-cdk: MoE training infrastructure on AWS.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate", help="check a configuration file and what synth needs besides it; exit 0 if valid, 2 if not"
    )
    validate.add_argument("--config", required=True, help="YAML configuration, e.g. config/default.yaml")
    validate.set_defaults(run=_validate)

    docs = commands.add_parser("config-docs", help="print the configuration reference (docs/configuration.md)")
    docs.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated reference")
    docs.set_defaults(run=_config_docs)

    schema = commands.add_parser("config-schema", help="print the JSON Schema of a configuration file (for editors)")
    schema.add_argument("--trainer", action="store_true", help="the schema of a moe-train profile instead")
    schema.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated schema")
    schema.set_defaults(run=_config_schema)

    slurm = commands.add_parser("slurm", help="HyperPod Slurm helpers")
    slurm_commands = slurm.add_subparsers(dest="slurm_command", required=True, metavar="COMMAND")
    render = slurm_commands.add_parser("render", help="write an sbatch script that runs moe-train on the compute group")
    render.add_argument("--config", required=True, help="infrastructure YAML, e.g. config/default.yaml")
    render.add_argument(
        "--train-config",
        metavar="PROFILE.yaml",
        help="the moe-train profile the job runs, a file here; the script carries it to the nodes "
        "(default: the configuration's training.profile)",
    )
    render.add_argument("--image", help="training image URI (the storage stack's TrainingImageUri); not with --local")
    render.add_argument(
        "--local", action="store_true", help="CPU-only cluster: no container, no GPUs, one task per node"
    )
    render.add_argument("--python", default="python3", help="interpreter for --local (default: python3)")
    render.add_argument("--group", help="compute group to run on (default: the first)")
    render.add_argument("--nodes", type=int, help="nodes to use (default: the group's instance_count)")
    render.add_argument("--time", default="48:00:00", help="Slurm time limit (default: 48:00:00)")
    render.add_argument(
        "--signal-lead", type=int, default=300, help="seconds before the limit to signal a checkpoint (default: 300)"
    )
    render.add_argument("--team", help="the team the job runs as: its Slurm account (teams in the configuration)")
    render.add_argument("--qos", help="Slurm QoS: one of the team's tiers (default: the team's default tier)")
    render.add_argument("--nice", type=int, help="Slurm priority adjustment (--nice)")
    render.add_argument(
        "--nsys-rank", type=int, help="run this rank under Nsight Systems where the image has nsys (default: none)"
    )
    render.add_argument(
        "--max-requeues", type=int, default=10, help="self-requeues after retryable exits (default: 10)"
    )
    render.add_argument("--job-name", help="job name (default: the profile's file name)")
    render.add_argument("--train-arg", action="append", default=[], help="argument passed to moe-train (repeatable)")
    render.add_argument(
        "--after",
        metavar="JOB_ID",
        help="start only after this job (the preflight, moe-cdk verify render) completed with exit 0; "
        "cancelled if it failed",
    )
    render.add_argument("--output", help="write the script here instead of stdout")
    render.set_defaults(run=_slurm_render)

    from moe_cdk.cli import diff, eks, parallelcluster, plan, serve, status, submit, verify

    for command in (eks, serve, plan, submit, diff, verify, status, parallelcluster):
        command.add_parser(commands)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
