"""``moe-cdk sagemaker submit``: a CreateTrainingJob request for the trainer, and a chain of jobs
past the 28-day limit.

The request is built with boto3's client (no SageMaker SDK) from the infrastructure
configuration, the trainer profile (``--train-config``, default the configuration's
``training.profile``), and the training-job stack's outputs (from ``cdk deploy --outputs-file``
or CloudFormation). The profile reaches the job as an input channel: ``upload_profile`` puts it
in the data bucket under ``profiles/<run>/``, and SageMaker copies it into the container before
the trainer starts, so a new profile needs no new image. A chained run starts a successor job on the
same checkpoint prefix whenever a job stops on its runtime limit, and stops on a permanent
failure: the trainer's exit codes 1-127 (2 is a configuration error). It waits for each job
with boto3's ``training_job_completed_or_stopped`` waiter.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError, WaiterError

from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.jobs.profile import PROFILE_FILE, JobProfile, load_job_profile
from moe_cdk.schema.config import Config

# SageMaker API reference, StoppingCondition.MaxRuntimeInSeconds: at most 28 days.
MAX_RUNTIME_S = 28 * 24 * 3600
# SageMaker API reference, StoppingCondition: a training job runs at most 30 days in all, including
# publishing metrics and uploading the model after it stopped. The chain waits that long for a job.
MAX_JOB_LIFETIME_S = 30 * 24 * 3600
JOB_WAITER = "training_job_completed_or_stopped"
# SageMaker API reference, RetryStrategy.MaximumRetryAttempts: 1 to 30.
RETRY_RANGE = (1, 30)
FSX_DATASETS = "/fsx/datasets/"
CHANNEL_DIR = "/opt/ml/input/data/train/"
# SageMaker Developer Guide, "How Amazon SageMaker Provides Training Information": File-mode channel
# <name> is copied to /opt/ml/input/data/<name> before the container starts.
PROFILE_CHANNEL = "profile"
PROFILE_PREFIX = "profiles"
CHECKPOINT_DIR = "/opt/ml/checkpoints"
TENSORBOARD_DIR = "/opt/ml/output/tensorboard"
OUTPUT_KEYS = (
    "RoleArn",
    "SubnetIds",
    "SecurityGroupIds",
    "DataBucketName",
    "FileSystemId",
    "FileSystemMountName",
    "TrainingImageUri",
)
OUTPUTS_FILE = "the JSON `cdk deploy --outputs-file FILE` writes"

# Regexes over the trainer's log lines, e.g.
# "step 12/100 loss 4.0725 tokens/s 11197 imbalance 2.00 dispatch 0.3ms lr 0.0003 grad_norm 1.204 step_time 0.41s
# eta 0:06:01" (metrics.MetricsSink.write).
METRIC_DEFINITIONS = [
    {"Name": "train:loss", "Regex": r"step \d+/\d+ loss ([0-9.]+)"},
    {"Name": "train:tokens_per_s", "Regex": r"tokens/s ([0-9.]+)"},
    {"Name": "train:expert_imbalance", "Regex": r"imbalance ([0-9.]+)"},
    {"Name": "train:dispatch_ms", "Regex": r"dispatch ([0-9.]+)ms"},
    {"Name": "train:lr", "Regex": r" lr ([0-9.]+(?:e[-+][0-9]+)?)"},
    {"Name": "train:grad_norm", "Regex": r"grad_norm ([0-9.]+)"},
    {"Name": "train:step_time_s", "Regex": r"step_time ([0-9.]+)s"},
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
    profile: JobProfile | None = None
    """The trainer profile every job of the run reads. Default: the configuration's ``training.profile``."""

    def problems(self) -> list[Problem]:
        found = []
        if not re.match(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,55}$", self.run_name):
            found.append(
                problem(
                    "not a usable job name",
                    got=self.run_name,
                    allowed="letters, digits and inner hyphens, at most 56 characters",
                ).at("--run-name")
            )
        if self.input_mode not in ("fsx", "s3"):
            found.append(problem("unknown input", got=self.input_mode, allowed="fsx, s3").at("--input"))
        if not 0 < self.max_runtime_hours * 3600 <= MAX_RUNTIME_S:
            found.append(
                problem("out of range", got=self.max_runtime_hours, allowed="more than 0, at most 672 (28 days)").at(
                    "--max-runtime-hours"
                )
            )
        if self.spot and (self.max_wait_hours or 0) < self.max_runtime_hours:
            found.append(
                problem(
                    "Spot needs a wait at least as long as the runtime",
                    got=self.max_wait_hours,
                    allowed=f">= {self.max_runtime_hours}",
                ).at("--max-wait-hours")
            )
        if not self.spot and self.max_wait_hours is not None:
            found.append(problem("only for Spot", got=self.max_wait_hours, allowed="--spot").at("--max-wait-hours"))
        low, high = RETRY_RANGE
        if not low <= self.retries <= high:
            found.append(problem("out of range", got=self.retries, allowed=f"{low} to {high}").at("--retries"))
        return found


def outputs_from_file(path: str, stack_name: str) -> dict[str, str]:
    """The stack's outputs from ``cdk deploy --outputs-file``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(
            [problem(f"cannot be read ({reason})", got=path, allowed=OUTPUTS_FILE).at("--outputs-file")]
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [
                problem("is not a JSON object of stacks", got=type(data).__name__, allowed=OUTPUTS_FILE).at(
                    "--outputs-file"
                )
            ]
        )
    if stack_name not in data:
        raise ConfigError(
            [problem("has no outputs for the stack", got=sorted(data), allowed=stack_name).at("--outputs-file")]
        )
    return _required_outputs(data[stack_name], f"--outputs-file {path}")


def outputs_from_cloudformation(client, stack_name: str) -> dict[str, str]:
    """The stack's outputs from CloudFormation (needs credentials)."""
    try:
        stack = client.describe_stacks(StackName=stack_name)["Stacks"][0]
    except (BotoCoreError, ClientError) as error:  # no credentials, no such stack, no permission
        raise ConfigError(
            [
                problem(
                    f"cannot be read from CloudFormation ({error})",
                    got=stack_name,
                    allowed=f"a deployed stack and credentials for its account, or --outputs-file with {OUTPUTS_FILE}",
                ).at("stack outputs")
            ]
        ) from None
    return _required_outputs({o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}, stack_name)


def _required_outputs(found: dict[str, str], source: str) -> dict[str, str]:
    missing = [key for key in OUTPUT_KEYS if key not in found]
    if missing:
        raise ConfigError([problem("outputs missing", got=missing, allowed=", ".join(OUTPUT_KEYS)).at(source)])
    return {key: found[key] for key in OUTPUT_KEYS}


def placeholder_outputs(stack_name: str) -> dict[str, str]:
    """Stand-ins for a dry run without credentials or an outputs file."""
    return {key: f"<{stack_name}.{key}>" for key in OUTPUT_KEYS}


def _in_channel(path: str, key: str) -> str:
    if not path.startswith(FSX_DATASETS):
        raise ConfigError(
            [
                problem(
                    "must be under the file system's datasets folder to reach a training job",
                    got=path,
                    allowed=f"{FSX_DATASETS}...",
                ).at(key)
            ]
        )
    return CHANNEL_DIR + path[len(FSX_DATASETS) :]


def profile_prefix(run_name: str) -> str:
    """The data bucket's folder of run ``run_name``'s profile: its jobs' profile channel."""
    return f"{PROFILE_PREFIX}/{run_name}/"


def profile_key(run_name: str) -> str:
    """The object key of run ``run_name``'s profile in the data bucket; every job of the run reads it."""
    return profile_prefix(run_name) + PROFILE_FILE


def upload_profile(s3_client, outputs: dict[str, str], run_name: str, profile: JobProfile) -> str:
    """Put run ``run_name``'s profile where its jobs' profile channel reads it; returns its ``s3://`` URI."""
    key = profile_key(run_name)
    s3_client.put_object(
        Bucket=outputs["DataBucketName"], Key=key, Body=profile.text.encode(), ContentType="application/yaml"
    )
    return f"s3://{outputs['DataBucketName']}/{key}"


def build_request(config: Config, outputs: dict[str, str], options: SubmitOptions, *, job_index: int = 1) -> dict:
    """The CreateTrainingJob request for job ``job_index`` of the run ``options.run_name``."""
    problems = options.problems()
    if problems:
        raise ConfigError(problems)
    train = (options.profile or load_job_profile(config, None)).config
    (group,) = config.cluster.instance_groups
    bucket = outputs["DataBucketName"]
    run = options.run_name
    prefixes = [_in_channel(p, f"training.profile data.prefixes[{i}]") for i, p in enumerate(train.data.prefixes)]
    arguments = [
        "--config",
        f"/opt/ml/input/data/{PROFILE_CHANNEL}/{PROFILE_FILE}",
        "--checkpoint-dir",
        CHECKPOINT_DIR,
        "--set",
        f"data.prefixes=[{', '.join(prefixes)}]",
        "--set",
        f"data.cache_dir={CHECKPOINT_DIR}/index-cache",
        "--set",
        f"metrics.tensorboard_dir={TENSORBOARD_DIR}",
    ]
    if train.data.tokenizer != "byte":
        arguments += ["--set", f"data.tokenizer={_in_channel(train.data.tokenizer, 'training.profile data.tokenizer')}"]
    if options.input_mode == "fsx":
        source = {
            "FileSystemDataSource": {
                "FileSystemId": outputs["FileSystemId"],
                "FileSystemAccessMode": "ro",
                "FileSystemType": "FSxLustre",
                "DirectoryPath": f"/{outputs['FileSystemMountName']}/datasets",
            }
        }
    else:
        source = {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": f"s3://{bucket}/datasets/",
                "S3DataDistributionType": "FullyReplicated",
            }
        }
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
        "InputDataConfig": [
            {"ChannelName": "train", "DataSource": source, "InputMode": "File"},
            {
                "ChannelName": PROFILE_CHANNEL,
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": f"s3://{bucket}/{profile_prefix(run)}",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
                "InputMode": "File",
            },
        ],
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/training-jobs/{run}/output"},
        "ResourceConfig": {
            "InstanceType": group.to_props().spec.sagemaker_name,
            "InstanceCount": group.instance_count,
            "VolumeSizeInGB": group.ebs_volume_size_gib,
        },
        "VpcConfig": {
            "SecurityGroupIds": outputs["SecurityGroupIds"].split(","),
            "Subnets": outputs["SubnetIds"].split(","),
        },
        "StoppingCondition": stopping,
        "EnableManagedSpotTraining": options.spot,
        # SageMaker copies /opt/ml/checkpoints to and from this prefix; every job of the run shares it.
        "CheckpointConfig": {"S3Uri": f"s3://{bucket}/checkpoints/{run}/", "LocalPath": CHECKPOINT_DIR},
        "TensorBoardOutputConfig": {
            "S3OutputPath": f"s3://{bucket}/training-jobs/{run}/tensorboard",
            "LocalPath": TENSORBOARD_DIR,
        },
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
        return Outcome(
            name, status, secondary, True, f"stopped on its limit ({secondary}): continuing from the checkpoint"
        )
    if status == "Completed":
        return Outcome(name, status, secondary, False, "completed")
    if status == "Failed":
        found = re.search(r"exit code:? ?(\d+)", description.get("FailureReason", ""))
        code = int(found.group(1)) if found else None
        if code is not None and 1 <= code <= 127:
            return Outcome(name, status, secondary, False, f"permanent failure (exit code {code}): not continuing")
        return Outcome(
            name, status, secondary, True, f"retryable failure ({description.get('FailureReason', 'no reason')})"
        )
    return Outcome(name, status, secondary, False, f"stopped ({secondary or status}): not continuing")


def wait_for_job(client, job_name: str, *, poll_seconds: float) -> dict:
    """The job's DescribeTrainingJob response once it has ended: Completed, Stopped or Failed.

    boto3's ``training_job_completed_or_stopped`` waiter describes the job every ``poll_seconds``
    for as long as any training job can last (``MAX_JOB_LIFETIME_S``), so it gives up only on a job
    SageMaker should itself have ended. Its success states (Completed, Stopped) return nothing, so
    the ended job is described once more for its secondary status; its failure state (Failed)
    raises with the description, which is returned. Anything else, an API error or the attempts
    running out, is raised as the waiter's ``WaiterError``.
    """
    attempts = math.ceil(MAX_JOB_LIFETIME_S / max(poll_seconds, 1.0)) + 1
    try:
        client.get_waiter(JOB_WAITER).wait(
            TrainingJobName=job_name, WaiterConfig={"Delay": poll_seconds, "MaxAttempts": attempts}
        )
    except WaiterError as error:
        if (error.last_response or {}).get("TrainingJobStatus") == "Failed":
            return error.last_response
        raise
    return client.describe_training_job(TrainingJobName=job_name)


def run_chain(
    client,
    config: Config,
    outputs: dict[str, str],
    options: SubmitOptions,
    *,
    max_jobs: int,
    poll_seconds: float,
    log: Callable[[str], None] = lambda _: None,
) -> list[Outcome]:
    """Submit job 1, and a successor on the same checkpoint prefix after each job that stops on
    its limit or fails retryably, until one completes, fails permanently or ``max_jobs`` ran."""
    outcomes: list[Outcome] = []
    for index in range(1, max_jobs + 1):
        request = build_request(config, outputs, options, job_index=index)
        client.create_training_job(**request)
        log(f"started {request['TrainingJobName']}")
        outcome = classify(wait_for_job(client, request["TrainingJobName"], poll_seconds=poll_seconds))
        outcomes.append(outcome)
        log(f"{outcome.job_name}: {outcome.reason}")
        if not outcome.continue_chain:
            break
    else:
        log(f"stopping after {max_jobs} jobs (--max-jobs)")
    return outcomes
