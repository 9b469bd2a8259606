"""``moe-cdk sagemaker submit``: start a SageMaker training job, or a chain of them, for a
training-job configuration, on the stack's role, subnets, file system and bucket."""

from __future__ import annotations

import argparse
import json
import sys
import time

from botocore.exceptions import BotoCoreError, ClientError

from moe_cdk.cli.report import report
from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.jobs.sagemaker_submit import (
    SubmitOptions,
    build_request,
    outputs_from_cloudformation,
    outputs_from_file,
    placeholder_outputs,
    profile_key,
    run_chain,
    upload_profile,
)
from moe_cdk.schema.config import Orchestrator, load_config, require_orchestrator


def add_parser(subcommands) -> None:
    sagemaker = subcommands.add_parser("sagemaker", help="SageMaker Training Jobs")
    commands = sagemaker.add_subparsers(dest="sagemaker_command", required=True, metavar="COMMAND")
    submit = commands.add_parser(
        "submit", help="start a training job (or a chain of them) for a training-job configuration"
    )
    submit.add_argument("--config", required=True, help="infrastructure YAML with cluster.orchestrator: training-job")
    submit.add_argument(
        "--train-config",
        metavar="PROFILE.yaml",
        help="the moe-train profile the jobs run, a file here; it is uploaded to the data bucket and reaches "
        "each job as its profile channel (default: the configuration's training.profile)",
    )
    submit.add_argument(
        "--outputs-file", help="`cdk deploy --outputs-file` JSON; default: read the stack's outputs from CloudFormation"
    )
    submit.add_argument(
        "--run-name", help="job name prefix and checkpoint folder (default: <name>-<profile>-<UTC time>)"
    )
    submit.add_argument("--input", dest="input_mode", default="fsx", help="fsx (default) or s3")
    submit.add_argument(
        "--max-runtime-hours", type=float, default=24.0, help="each job's limit, at most 672 (default 24)"
    )
    submit.add_argument("--spot", action="store_true", help="managed Spot training")
    submit.add_argument("--max-wait-hours", type=float, help="Spot: capacity wait plus runtime")
    submit.add_argument("--retries", type=int, default=2, help="SageMaker retries after internal errors (default 2)")
    submit.add_argument("--dry-run", action="store_true", help="print the request as JSON and submit nothing")
    submit.add_argument(
        "--chain", action="store_true", help="keep the run going past each job's limit with successor jobs"
    )
    submit.add_argument("--max-jobs", type=int, default=10, help="with --chain: at most this many jobs (default 10)")
    submit.add_argument("--poll-seconds", type=float, default=60.0, help="with --chain: status poll interval")
    submit.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        require_orchestrator(config, "submit needs a training-job configuration", Orchestrator.TRAINING_JOB)
        stack_name = f"{config.name}-training-job"
        profile = load_job_profile(config, args.train_config)
        options = SubmitOptions(
            run_name=args.run_name or f"{config.name}-{profile.name}-{time.strftime('%Y%m%d%H%M', time.gmtime())}",
            profile=profile,
            input_mode=args.input_mode,
            max_runtime_hours=args.max_runtime_hours,
            spot=args.spot,
            max_wait_hours=args.max_wait_hours,
            retries=args.retries,
        )
        if args.outputs_file:
            outputs = outputs_from_file(args.outputs_file, stack_name)
        elif args.dry_run:
            outputs = placeholder_outputs(stack_name)
            print(f"no --outputs-file: stack outputs shown as <{stack_name}.Key>", file=sys.stderr)
        else:
            import boto3

            outputs = outputs_from_cloudformation(boto3.client("cloudformation", region_name=config.region), stack_name)
        request = build_request(config, outputs, options)
    except ConfigError as error:
        return report(args.config, error)
    if args.dry_run:
        uri = f"s3://{outputs['DataBucketName']}/{profile_key(options.run_name)}"
        print(f"would upload {profile.source} to {uri}", file=sys.stderr)
        print(json.dumps(request, indent=2))
        return 0
    import boto3

    try:
        uri = upload_profile(boto3.client("s3", region_name=config.region), outputs, options.run_name, profile)
    except (BotoCoreError, ClientError) as error:
        print(f"{args.config}: S3: {error}", file=sys.stderr)
        return 1
    print(f"uploaded {profile.source} to {uri}")
    client = boto3.client("sagemaker", region_name=config.region)
    try:
        if not args.chain:
            client.create_training_job(**request)
            print(f"started {request['TrainingJobName']}")
            return 0
        outcomes = run_chain(
            client, config, outputs, options, max_jobs=args.max_jobs, poll_seconds=args.poll_seconds, log=print
        )
    except (BotoCoreError, ClientError) as error:  # credentials, throttling, a refused request, a failed wait
        print(f"{args.config}: SageMaker: {error}", file=sys.stderr)
        return 1
    return 0 if outcomes and outcomes[-1].status == "Completed" and not outcomes[-1].continue_chain else 1
