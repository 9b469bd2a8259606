"""The ``moe-cdk`` command line, and the synth entry point that app.py calls.

Exit codes: 0 success, 1 the synthesized app failed a check (cdk-nag, CloudFormation
validation), 2 the configuration or the command line is invalid.
"""

from __future__ import annotations

import os

# jsii prints a Node end-of-life banner on every start unless this is set; it must be set
# before aws_cdk is first imported.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import aws_cdk as cdk  # noqa: E402
from jsii.errors import JSIIError  # noqa: E402

from moe_cdk.constructs.validation import PropsError  # noqa: E402
from moe_cdk.stacks.config import Config, load_config, reference_docs  # noqa: E402
from moe_cdk.stacks.deployment import DEFAULT_CONFIG, add_nag_checks, add_stacks, cdk_json_context, summary_lines  # noqa: E402
from moe_cdk.training.schema import ConfigError, problem, report_problems  # noqa: E402

EXIT_CHECK_FAILED = 1


def check_config(config_path: str, app: cdk.App) -> tuple[Config | None, list[str]]:
    """Everything synth checks before it writes anything: the file, then the construct props
    as the stacks are added to ``app``. Returns the config and no errors, or None and every error line.
    """
    try:
        config = load_config(config_path)
    except ConfigError as error:
        return None, error.errors
    try:
        add_stacks(app, config)
    except PropsError as error:
        return None, error.problems
    return config, []


def synth_main() -> int:
    """``python app.py`` and ``cdk synth``: synthesize the selected configuration into cdk.out."""
    # cdk.json's context is the default; what the CDK CLI passes (CDK_CONTEXT_JSON) overrides it.
    # The CLI also names the output folder (CDK_OUTDIR); run directly, it is cdk.out.
    app = cdk.App(context=cdk_json_context(), outdir=None if "CDK_OUTDIR" in os.environ else "cdk.out")
    config_path = app.node.try_get_context("config") or DEFAULT_CONFIG
    config, errors = check_config(config_path, app)
    if config is None:
        return report_problems(config_path, errors)
    add_nag_checks(app)
    try:
        assembly = app.synth()
    except (JSIIError, RuntimeError) as error:  # jsii raises RuntimeError for a failed validation
        print(f"{config_path}: synth failed its checks\n{error}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    for line in summary_lines(assembly):
        print(line)
    return 0


def _validate(args: argparse.Namespace) -> int:
    config, errors = check_config(args.config, cdk.App())
    if config is None:
        return report_problems(args.config, errors)
    print(f"{args.config}: valid")
    return 0


def job_spec_from_config(config: Config, args: argparse.Namespace):
    """The sbatch job for a compute group of ``config``: node count, GPUs, partition and
    constraint come from the configuration and the instance catalog, never typed again."""
    from moe_cdk.constructs import instance_catalog
    from moe_cdk.stacks.slurm_job import SlurmJobSpec

    if args.local == bool(args.image):
        raise ConfigError(["--image: " + problem("give an image, or --local for a CPU-only cluster, not both",
                                                 got=args.image, allowed="--image URI, or --local")])
    group = config.cluster.compute_group(args.group)
    spec = instance_catalog.lookup(group.instance_type)
    gpus = spec.accelerator_count if spec.accelerator_kind is instance_catalog.AcceleratorKind.NVIDIA_GPU else None
    return SlurmJobSpec(
        job_name=args.job_name or Path(args.train_config).stem,
        nodes=args.nodes or group.instance_count,
        tasks_per_node=1 if args.local else (spec.accelerator_count or 1),
        gpus_per_node=None if args.local else gpus,
        partition=group.to_props().partition_name,
        constraint="efa" if spec.supports_efa and config.cluster.require_efa else None,
        exclusive=not args.local,
        time_limit=args.time,
        signal_lead_seconds=args.signal_lead,
        qos=args.qos,
        nice=args.nice,
        container_image=None if args.local else args.image,
        container_mounts=None if args.local else "/fsx:/fsx",
        train_config=args.train_config,
        train_args=tuple(args.train_arg),
        local=args.local,
        python=args.python,
        max_requeues=args.max_requeues,
    )


def _slurm_render(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        spec = job_spec_from_config(config, args)
    except ConfigError as error:
        return report_problems(args.config, error.errors)
    from moe_cdk.stacks.slurm_job import render_sbatch

    problems = spec.problems()
    if problems:
        return report_problems(args.config, problems)
    text = render_sbatch(spec)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}: {spec.nodes} node(s) x {spec.tasks_per_node} task(s)")
    else:
        sys.stdout.write(text)
    return 0


def _config_docs(args: argparse.Namespace) -> int:
    text = reference_docs()
    if args.check:
        current = Path(args.check).read_text() if Path(args.check).exists() else ""
        if current != text:
            print(f"{args.check} is out of date; run: moe-cdk config-docs > {args.check}", file=sys.stderr)
            return EXIT_CHECK_FAILED
        return 0
    sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moe-cdk", description="moe-cdk: MoE training infrastructure on AWS.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="check a configuration file; exit 0 if valid, 2 if not")
    validate.add_argument("--config", required=True, help="YAML configuration, e.g. config/default.yaml")
    validate.set_defaults(run=_validate)

    docs = commands.add_parser("config-docs", help="print the configuration reference (docs/configuration.md)")
    docs.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated reference")
    docs.set_defaults(run=_config_docs)

    slurm = commands.add_parser("slurm", help="HyperPod Slurm helpers")
    slurm_commands = slurm.add_subparsers(dest="slurm_command", required=True, metavar="COMMAND")
    render = slurm_commands.add_parser("render", help="write an sbatch script that runs moe-train on the compute group")
    render.add_argument("--config", required=True, help="infrastructure YAML, e.g. config/default.yaml")
    render.add_argument("--train-config", required=True, help="trainer YAML as the nodes see it, e.g. /fsx/configs/moe-8x1b.yaml")
    render.add_argument("--image", help="training image URI (the storage stack's TrainingImageUri); not with --local")
    render.add_argument("--local", action="store_true", help="CPU-only cluster: no container, no GPUs, one task per node")
    render.add_argument("--python", default="python3", help="interpreter for --local (default: python3)")
    render.add_argument("--group", help="compute group to run on (default: the first)")
    render.add_argument("--nodes", type=int, help="nodes to use (default: the group's instance_count)")
    render.add_argument("--time", default="48:00:00", help="Slurm time limit (default: 48:00:00)")
    render.add_argument("--signal-lead", type=int, default=300, help="seconds before the limit to signal a checkpoint (default: 300)")
    render.add_argument("--qos", help="Slurm QoS")
    render.add_argument("--nice", type=int, help="Slurm priority adjustment (--nice)")
    render.add_argument("--max-requeues", type=int, default=10, help="self-requeues after retryable exits (default: 10)")
    render.add_argument("--job-name", help="job name (default: the train config's file name)")
    render.add_argument("--train-arg", action="append", default=[], help="argument passed to moe-train (repeatable)")
    render.add_argument("--output", help="write the script here instead of stdout")
    render.set_defaults(run=_slurm_render)

    from moe_cdk.stacks import eks_job, plan, sagemaker_submit, synth_diff

    eks_job.add_parser(commands)
    plan.add_parser(commands)
    sagemaker_submit.add_parser(commands)
    synth_diff.add_parser(commands)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
