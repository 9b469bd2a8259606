"""``moe-cdk sagemaker submit``: a CreateTrainingJob request for the trainer, and a chain of jobs
past the 28-day limit.

The request is built with boto3's client (no SageMaker SDK) from the infrastructure
configuration, the trainer profile it names, and the training-job stack's outputs (from
``cdk deploy --outputs-file`` or CloudFormation). A chained run starts a successor job on the
same checkpoint prefix whenever a job stops on its runtime limit, and stops on a permanent
failure: the trainer's exit codes 1-127 (2 is a configuration error).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moe_cdk.stacks.config import Config, Orchestrator, load_config
from moe_cdk.training.config import load_train_config
from moe_cdk.training.schema import ConfigError, problem, report_problems

# SageMaker API reference, StoppingCondition.MaxRuntimeInSeconds: at most 28 days.
MAX_RUNTIME_S = 28 * 24 * 3600
# SageMaker API reference, RetryStrategy.MaximumRetryAttempts: 1 to 30.
RETRY_RANGE = (1, 30)
FSX_DATASETS = "/fsx/datasets/"
CHANNEL_DIR = "/opt/ml/input/data/train/"
CHECKPOINT_DIR = "/opt/ml/checkpoints"
TENSORBOARD_DIR = "/opt/ml/output/tensorboard"
OUTPUT_KEYS = ("RoleArn", "SubnetIds", "SecurityGroupIds", "DataBucketName", "FileSystemId",
               "FileSystemMountName", "TrainingImageUri")

# Regexes over the trainer's log lines, e.g.
# "step 12/100 loss 4.0725 tokens/s 11197 imbalance 2.00 dispatch 0.3ms" (metrics.MetricsSink.write).
METRIC_DEFINITIONS = [
    {"Name": "train:loss", "Regex": r"step \d+/\d+ loss ([0-9.]+)"},
    {"Name": "train:tokens_per_s", "Regex": r"tokens/s ([0-9.]+)"},
    {"Name": "train:expert_imbalance", "Regex": r"imbalance ([0-9.]+)"},
    {"Name": "train:dispatch_ms", "Regex": r"dispatch ([0-9.]+)ms"},
]


@dataclass(frozen=True, kw_only=True)
class SubmitOptions:
    """What a submission adds to the configuration."""

    run_name: str
    """Job name prefix and checkpoint folder; successors are <run_name>-02, -03, ..."""
    input_mode: str = "fsx"
    """``fsx`` (FileSystemDataSource from the Lustre file system) or ``s3`` (the datasets prefix)."""
    max_runtime_hours: float = 24.0
    """Runtime limit of each job, at most 28 days (672 h)."""
    spot: bool = False
    """Managed Spot training."""
    max_wait_hours: float | None = None
    """Spot only: how long to wait for capacity plus run, at least max_runtime_hours."""
    retries: int = 2
    """SageMaker's own retries of a job after an internal error (1 to 30)."""

    def problems(self) -> list[str]:
        found = []
        if not re.match(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,55}$", self.run_name):
            found.append("--run-name: " + problem("not a usable job name", got=self.run_name,
                                                  allowed="letters, digits and inner hyphens, at most 56 characters"))
        if self.input_mode not in ("fsx", "s3"):
            found.append("--input: " + problem("unknown input", got=self.input_mode, allowed="fsx, s3"))
        if not 0 < self.max_runtime_hours * 3600 <= MAX_RUNTIME_S:
            found.append("--max-runtime-hours: " + problem("out of range", got=self.max_runtime_hours,
                                                           allowed="more than 0, at most 672 (28 days)"))
        if self.spot and (self.max_wait_hours or 0) < self.max_runtime_hours:
            found.append("--max-wait-hours: " + problem("Spot needs a wait at least as long as the runtime",
                                                        got=self.max_wait_hours, allowed=f">= {self.max_runtime_hours}"))
        if not self.spot and self.max_wait_hours is not None:
            found.append("--max-wait-hours: " + problem("only for Spot", got=self.max_wait_hours, allowed="--spot"))
        low, high = RETRY_RANGE
        if not low <= self.retries <= high:
            found.append("--retries: " + problem("out of range", got=self.retries, allowed=f"{low} to {high}"))
        return found


def outputs_from_file(path: str, stack_name: str) -> dict[str, str]:
    """The stack's outputs from ``cdk deploy --outputs-file``."""
    data = json.loads(Path(path).read_text())
    if stack_name not in data:
        raise ConfigError(["--outputs-file: " + problem("has no outputs for the stack", got=sorted(data),
                                                         allowed=stack_name)])
    return _required_outputs(data[stack_name], f"--outputs-file {path}")


def outputs_from_cloudformation(client, stack_name: str) -> dict[str, str]:
    """The stack's outputs from CloudFormation (needs credentials)."""
    stack = client.describe_stacks(StackName=stack_name)["Stacks"][0]
    return _required_outputs({o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}, stack_name)


def _required_outputs(found: dict[str, str], source: str) -> dict[str, str]:
    missing = [key for key in OUTPUT_KEYS if key not in found]
    if missing:
        raise ConfigError([f"{source}: " + problem("outputs missing", got=missing, allowed=", ".join(OUTPUT_KEYS))])
    return {key: found[key] for key in OUTPUT_KEYS}


def placeholder_outputs(stack_name: str) -> dict[str, str]:
    """Stand-ins for a dry run without credentials or an outputs file."""
    return {key: f"<{stack_name}.{key}>" for key in OUTPUT_KEYS}


def _in_channel(path: str, key: str) -> str:
    if not path.startswith(FSX_DATASETS):
        raise ConfigError([f"{key}: " + problem("must be under the file system's datasets folder to reach a training job",
                                                got=path, allowed=f"{FSX_DATASETS}...")])
    return CHANNEL_DIR + path[len(FSX_DATASETS):]


def build_request(config: Config, outputs: dict[str, str], options: SubmitOptions, *, job_index: int = 1) -> dict:
    """The CreateTrainingJob request for job ``job_index`` of the run ``options.run_name``."""
    problems = options.problems()
    if problems:
        raise ConfigError(problems)
    train = load_train_config(config.training.path)
    (group,) = config.cluster.instance_groups
    bucket = outputs["DataBucketName"]
    run = options.run_name
    prefixes = [_in_channel(p, f"training.profile data.prefixes[{i}]") for i, p in enumerate(train.data.prefixes)]
    arguments = ["--config", config.training.image_path,
                 "--checkpoint-dir", CHECKPOINT_DIR,
                 "--set", f"data.prefixes=[{', '.join(prefixes)}]",
                 "--set", f"data.cache_dir={CHECKPOINT_DIR}/index-cache",
                 "--set", f"metrics.tensorboard_dir={TENSORBOARD_DIR}"]
    if train.data.tokenizer != "byte":
        arguments += ["--set", f"data.tokenizer={_in_channel(train.data.tokenizer, 'training.profile data.tokenizer')}"]
    if options.input_mode == "fsx":
        source = {"FileSystemDataSource": {
            "FileSystemId": outputs["FileSystemId"], "FileSystemAccessMode": "ro", "FileSystemType": "FSxLustre",
            "DirectoryPath": f"/{outputs['FileSystemMountName']}/datasets"}}
    else:
        source = {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://{bucket}/datasets/",
                                   "S3DataDistributionType": "FullyReplicated"}}
    stopping = {"MaxRuntimeInSeconds": int(options.max_runtime_hours * 3600)}
    if options.spot:
        stopping["MaxWaitTimeInSeconds"] = int(options.max_wait_hours * 3600)
    request = {
        "TrainingJobName": f"{run}-{job_index:02d}",
        "AlgorithmSpecification": {
            "TrainingImage": outputs["TrainingImageUri"],
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["moe-train"],
            "ContainerArguments": arguments,
            "MetricDefinitions": METRIC_DEFINITIONS,
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "RoleArn": outputs["RoleArn"],
        "InputDataConfig": [{"ChannelName": "train", "DataSource": source, "InputMode": "File"}],
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/training-jobs/{run}/output"},
        "ResourceConfig": {"InstanceType": group.to_props().spec.sagemaker_name, "InstanceCount": group.instance_count,
                           "VolumeSizeInGB": group.ebs_volume_size_gib},
        "VpcConfig": {"SecurityGroupIds": outputs["SecurityGroupIds"].split(","), "Subnets": outputs["SubnetIds"].split(",")},
        "StoppingCondition": stopping,
        "EnableManagedSpotTraining": options.spot,
        # SageMaker copies /opt/ml/checkpoints to and from this prefix; every job of the run shares it.
        "CheckpointConfig": {"S3Uri": f"s3://{bucket}/checkpoints/{run}/", "LocalPath": CHECKPOINT_DIR},
        "TensorBoardOutputConfig": {"S3OutputPath": f"s3://{bucket}/training-jobs/{run}/tensorboard",
                                    "LocalPath": TENSORBOARD_DIR},
        "RetryStrategy": {"MaximumRetryAttempts": options.retries},
        # The trainer starts torchrun on each host from SageMaker's resource config (launch_env).
        "Environment": {"MOE_RUN_NAME": run, "FI_EFA_USE_HUGE_PAGE": "0"},
        "Tags": [{"Key": "moe-cdk:deployment", "Value": config.name}, {"Key": "moe-cdk:run", "Value": run}],
    }
    return request


@dataclass(frozen=True)
class Outcome:
    """How one job ended, as the chain sees it."""

    job_name: str
    status: str
    secondary_status: str
    continue_chain: bool
    reason: str


def classify(description: dict) -> Outcome | None:
    """None while the job runs; otherwise whether a successor should continue the run."""
    name, status = description["TrainingJobName"], description["TrainingJobStatus"]
    secondary = description.get("SecondaryStatus", "")
    if status in ("InProgress", "Stopping"):
        return None
    if secondary in ("MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
        return Outcome(name, status, secondary, True, f"stopped on its limit ({secondary}): continuing from the checkpoint")
    if status == "Completed":
        return Outcome(name, status, secondary, False, "completed")
    if status == "Failed":
        found = re.search(r"exit code:? ?(\d+)", description.get("FailureReason", ""))
        code = int(found.group(1)) if found else None
        if code is not None and 1 <= code <= 127:
            return Outcome(name, status, secondary, False, f"permanent failure (exit code {code}): not continuing")
        return Outcome(name, status, secondary, True, f"retryable failure ({description.get('FailureReason', 'no reason')})")
    return Outcome(name, status, secondary, False, f"stopped ({secondary or status}): not continuing")


def run_chain(client, config: Config, outputs: dict[str, str], options: SubmitOptions, *, max_jobs: int,
              poll_seconds: float, sleep: Callable[[float], None] = time.sleep,
              log: Callable[[str], None] = print) -> list[Outcome]:
    """Submit job 1, and a successor on the same checkpoint prefix after each job that stops on
    its limit or fails retryably, until one completes, fails permanently or ``max_jobs`` ran."""
    outcomes: list[Outcome] = []
    for index in range(1, max_jobs + 1):
        request = build_request(config, outputs, options, job_index=index)
        client.create_training_job(**request)
        log(f"started {request['TrainingJobName']}")
        while (outcome := classify(client.describe_training_job(TrainingJobName=request["TrainingJobName"]))) is None:
            sleep(poll_seconds)
        outcomes.append(outcome)
        log(f"{outcome.job_name}: {outcome.reason}")
        if not outcome.continue_chain:
            break
    else:
        log(f"stopping after {max_jobs} jobs (--max-jobs)")
    return outcomes


def add_parser(subcommands) -> None:
    sagemaker = subcommands.add_parser("sagemaker", help="SageMaker Training Jobs")
    commands = sagemaker.add_subparsers(dest="sagemaker_command", required=True, metavar="COMMAND")
    submit = commands.add_parser("submit", help="start a training job (or a chain of them) for a training-job configuration")
    submit.add_argument("--config", required=True, help="infrastructure YAML with cluster.orchestrator: training-job")
    submit.add_argument("--outputs-file", help="`cdk deploy --outputs-file` JSON; default: read the stack's outputs from CloudFormation")
    submit.add_argument("--run-name", help="job name prefix and checkpoint folder (default: <name>-<profile>-<UTC time>)")
    submit.add_argument("--input", dest="input_mode", default="fsx", help="fsx (default) or s3")
    submit.add_argument("--max-runtime-hours", type=float, default=24.0, help="each job's limit, at most 672 (default 24)")
    submit.add_argument("--spot", action="store_true", help="managed Spot training")
    submit.add_argument("--max-wait-hours", type=float, help="Spot: capacity wait plus runtime")
    submit.add_argument("--retries", type=int, default=2, help="SageMaker retries after internal errors (default 2)")
    submit.add_argument("--dry-run", action="store_true", help="print the request as JSON and submit nothing")
    submit.add_argument("--chain", action="store_true", help="keep the run going past each job's limit with successor jobs")
    submit.add_argument("--max-jobs", type=int, default=10, help="with --chain: at most this many jobs (default 10)")
    submit.add_argument("--poll-seconds", type=float, default=60.0, help="with --chain: status poll interval")
    submit.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        if config.cluster.orchestrator is not Orchestrator.TRAINING_JOB:
            raise ConfigError(["cluster.orchestrator: " + problem("submit needs a training-job configuration",
                                                                  got=config.cluster.orchestrator.value, allowed="training-job")])
        stack_name = f"{config.name}-training-job"
        options = SubmitOptions(
            run_name=args.run_name or f"{config.name}-{Path(config.training.profile).stem}-{time.strftime('%Y%m%d%H%M', time.gmtime())}",
            input_mode=args.input_mode, max_runtime_hours=args.max_runtime_hours, spot=args.spot,
            max_wait_hours=args.max_wait_hours, retries=args.retries,
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
        return report_problems(args.config, error.errors)
    if args.dry_run:
        print(json.dumps(request, indent=2))
        return 0
    import boto3

    client = boto3.client("sagemaker", region_name=config.region)
    if not args.chain:
        client.create_training_job(**request)
        print(f"started {request['TrainingJobName']}")
        return 0
    outcomes = run_chain(client, config, outputs, options, max_jobs=args.max_jobs, poll_seconds=args.poll_seconds)
    return 0 if outcomes and outcomes[-1].status == "Completed" and not outcomes[-1].continue_chain else 1
