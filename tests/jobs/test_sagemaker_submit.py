"""`moe-cdk sagemaker submit`: the request against botocore's real SageMaker model, and the chain."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess

import boto3
import pytest
from botocore.exceptions import WaiterError
from botocore.stub import Stubber
from botocore.validate import validate_parameters
from conftest import ROOT, resources_of_type, synth

from moe_cdk.core.problems import ConfigError
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.jobs.sagemaker_submit import (
    MAX_JOB_LIFETIME_S,
    METRIC_DEFINITIONS,
    OUTPUT_KEYS,
    SubmitOptions,
    build_request,
    classify,
    outputs_from_cloudformation,
    outputs_from_file,
    profile_key,
    run_chain,
    upload_profile,
    wait_for_job,
)
from moe_cdk.schema.config import load_config
from moe_cdk.training.metrics import MetricsSink

CONFIG = load_config(ROOT / "config/training-job.yaml")
OUTPUTS = {
    "RoleArn": "arn:aws:iam::123456789012:role/moe-tj-training-job-ExecutionRole",
    "SubnetIds": "subnet-0123456789abcdef0",
    "SecurityGroupIds": "sg-0123456789abcdef0",
    "DataBucketName": "moe-data-123456789012-us-east-2-moe-tj",
    "FileSystemId": "fs-0123456789abcdef0",
    "FileSystemMountName": "abcdefgh",
    "TrainingImageUri": "123456789012.dkr.ecr.us-east-2.amazonaws.com/cdk-assets:abc",
}
OPTIONS = SubmitOptions(run_name="moe-run")


@pytest.fixture()
def sagemaker(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "t",
    }.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("sagemaker", region_name="us-east-2")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def _input_shape():
    return (
        boto3.client("sagemaker", region_name="us-east-2")
        .meta.service_model.operation_model("CreateTrainingJob")
        .input_shape
    )


@pytest.mark.parametrize("input_mode", ["fsx", "s3"])
def test_request_validates_against_the_service_model(input_mode):
    request = build_request(CONFIG, OUTPUTS, SubmitOptions(run_name="moe-run", input_mode=input_mode))
    validate_parameters(request, _input_shape())  # raises ParamValidationError on any bad shape


def test_checkpoints_go_to_one_prefix_per_run_at_the_trainers_path():
    request = build_request(CONFIG, OUTPUTS, OPTIONS)
    assert request["CheckpointConfig"] == {
        "S3Uri": "s3://moe-data-123456789012-us-east-2-moe-tj/checkpoints/moe-run/",
        "LocalPath": "/opt/ml/checkpoints",
    }
    args = request["AlgorithmSpecification"]["ContainerArguments"]
    assert args[args.index("--checkpoint-dir") + 1] == "/opt/ml/checkpoints"


def test_fsx_input_reads_the_datasets_folder_of_the_file_system():
    channel = build_request(CONFIG, OUTPUTS, OPTIONS)["InputDataConfig"][0]
    assert channel["DataSource"]["FileSystemDataSource"] == {
        "FileSystemId": "fs-0123456789abcdef0",
        "FileSystemAccessMode": "ro",
        "FileSystemType": "FSxLustre",
        "DirectoryPath": "/abcdefgh/datasets",
    }


def test_the_job_reads_its_profile_from_the_profile_channel():
    request = build_request(CONFIG, OUTPUTS, OPTIONS)
    args = request["AlgorithmSpecification"]["ContainerArguments"]
    assert args[:2] == ["--config", "/opt/ml/input/data/profile/train.yaml"]
    (channel,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == "profile"]
    assert channel["DataSource"]["S3DataSource"]["S3Uri"] == f"s3://{OUTPUTS['DataBucketName']}/profiles/moe-run/"
    assert profile_key("moe-run") == "profiles/moe-run/train.yaml"


def test_another_profile_changes_what_the_job_reads_not_the_image(tmp_path):
    profile = tmp_path / "other.yaml"
    profile.write_text(
        (ROOT / "training/configs/moe-8x1b.yaml").read_text().replace("/fsx/datasets/web/", "/fsx/datasets/other/")
    )
    options = SubmitOptions(run_name="moe-run", profile=load_job_profile(CONFIG, str(profile)))
    request = build_request(CONFIG, OUTPUTS, options)
    assert (
        "data.prefixes=[/opt/ml/input/data/train/other/train_text_document]"
        in request["AlgorithmSpecification"]["ContainerArguments"]
    )
    assert request["AlgorithmSpecification"]["TrainingImage"] == OUTPUTS["TrainingImageUri"]


def test_the_profile_is_uploaded_where_the_channel_reads_it(sagemaker):
    s3 = boto3.client("s3", region_name="us-east-2")
    profile = load_job_profile(CONFIG, None)
    with Stubber(s3) as stubber:  # the request is checked against botocore's S3 model
        stubber.add_response(
            "put_object",
            {"ETag": '"e"'},
            {
                "Bucket": OUTPUTS["DataBucketName"],
                "Key": "profiles/moe-run/train.yaml",
                "Body": CONFIG.training.path.read_bytes(),
                "ContentType": "application/yaml",
            },
        )
        uri = upload_profile(s3, OUTPUTS, "moe-run", profile)
        stubber.assert_no_pending_responses()
    assert uri == f"s3://{OUTPUTS['DataBucketName']}/profiles/moe-run/train.yaml"


def test_the_execution_role_may_read_the_profile_channel(tmp_path):
    templates = synth(CONFIG, tmp_path)
    (template,) = [t for name, t in templates.items() if name.endswith("training-job")]
    statements = [
        statement
        for policy in resources_of_type(template, "AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    readable = [json.dumps(s["Resource"]) for s in statements if "s3:GetObject" in json.dumps(s["Action"])]
    assert any("/profiles/*" in resource for resource in readable), readable


def test_profile_paths_under_fsx_datasets_are_mapped_into_the_channel():
    args = build_request(CONFIG, OUTPUTS, OPTIONS)["AlgorithmSpecification"]["ContainerArguments"]
    assert "data.prefixes=[/opt/ml/input/data/train/web/train_text_document]" in args
    assert "data.tokenizer=/opt/ml/input/data/train/web/tokenizer.json" in args


def test_job_shape_vpc_and_limits_come_from_configuration_and_outputs():
    request = build_request(CONFIG, OUTPUTS, SubmitOptions(run_name="moe-run", max_runtime_hours=672, retries=3))
    assert request["ResourceConfig"] == {"InstanceType": "ml.p5en.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 500}
    assert request["VpcConfig"] == {
        "SecurityGroupIds": ["sg-0123456789abcdef0"],
        "Subnets": ["subnet-0123456789abcdef0"],
    }
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 28 * 24 * 3600}
    assert request["RetryStrategy"] == {"MaximumRetryAttempts": 3}


def test_spot_sets_the_wait_limit():
    request = build_request(
        CONFIG, OUTPUTS, SubmitOptions(run_name="r", spot=True, max_runtime_hours=10, max_wait_hours=20)
    )
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000, "MaxWaitTimeInSeconds": 72000}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (SubmitOptions(run_name="r", max_runtime_hours=700), "--max-runtime-hours: out of range (got 700;"),
        (
            SubmitOptions(run_name="r", spot=True, max_runtime_hours=10, max_wait_hours=5),
            "--max-wait-hours: Spot needs a wait",
        ),
        (SubmitOptions(run_name="bad_name"), "--run-name: not a usable job name (got 'bad_name';"),
        (SubmitOptions(run_name="r", retries=0), "--retries: out of range (got 0; allowed 1 to 30)"),
    ],
)
def test_bad_options_are_rejected_by_flag(options, message):
    with pytest.raises(ConfigError) as caught:
        build_request(CONFIG, OUTPUTS, options)
    assert any(line.startswith(message) for line in caught.value.errors), caught.value.errors


def test_metric_regexes_match_the_trainers_log_line(caplog):
    record = {
        "step": 12,
        "loss": 4.0725,
        "tokens_per_s": 11197.4,
        "expert_imbalance": [2.0, 1.5],
        "dispatch_time_s": 0.0003,
        "lr": 3e-5,
        "grad_norm": 1.2041,
        "step_time_s": 0.4123,
    }
    with caplog.at_level(logging.INFO, logger="moe_cdk.training.metrics"):
        MetricsSink(rank=0, max_steps=100).write(record)
    line = caplog.records[-1].getMessage()
    found = {d["Name"]: re.search(d["Regex"], line).group(1) for d in METRIC_DEFINITIONS}
    assert found == {
        "train:loss": "4.0725",
        "train:tokens_per_s": "11197",
        "train:expert_imbalance": "2.00",
        "train:dispatch_ms": "0.3",
        "train:lr": "3e-05",
        "train:grad_norm": "1.204",
        "train:step_time_s": "0.41",
    }


def _described(name, status, secondary, reason=None):
    response = {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-2:123456789012:training-job/{name}",
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/m"},
        "ResourceConfig": {"InstanceType": "ml.p5en.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 500},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CreationTime": "2026-11-30T00:00:00Z",
    }
    if reason:
        response["FailureReason"] = reason
    return response


def _expect_job(stubber, index, states):
    request = build_request(CONFIG, OUTPUTS, OPTIONS, job_index=index)
    name = request["TrainingJobName"]
    stubber.add_response(
        "create_training_job",
        {"TrainingJobArn": f"arn:aws:sagemaker:us-east-2:123456789012:training-job/{name}"},
        request,
    )
    for status, secondary, *reason in states:
        stubber.add_response(
            "describe_training_job", _described(name, status, secondary, *reason), {"TrainingJobName": name}
        )
    if states[-1][0] in ("Completed", "Stopped"):
        # The waiter's success states return no response, so run_chain describes the ended job once more.
        stubber.add_response("describe_training_job", _described(name, *states[-1]), {"TrainingJobName": name})


def test_chain_continues_past_the_runtime_limit_on_the_same_checkpoints_and_stops_when_complete(sagemaker):
    client, stubber = sagemaker
    _expect_job(stubber, 1, [("InProgress", "Training"), ("Stopped", "MaxRuntimeExceeded")])
    _expect_job(
        stubber, 2, [("InProgress", "Training"), ("Failed", "Failed", "AlgorithmError: node lost, exit code: 138")]
    )
    _expect_job(stubber, 3, [("Completed", "Completed")])
    outcomes = run_chain(client, CONFIG, OUTPUTS, OPTIONS, max_jobs=10, poll_seconds=0, log=lambda m: None)
    assert [(o.job_name, o.continue_chain) for o in outcomes] == [
        ("moe-run-01", True),
        ("moe-run-02", True),
        ("moe-run-03", False),
    ]


def test_chain_stops_on_a_configuration_error(sagemaker):
    client, stubber = sagemaker
    _expect_job(stubber, 1, [("Failed", "Failed", "AlgorithmError: see logs, exit code: 2")])
    outcomes = run_chain(client, CONFIG, OUTPUTS, OPTIONS, max_jobs=10, poll_seconds=0, log=lambda m: None)
    assert [o.reason for o in outcomes] == ["permanent failure (exit code 2): not continuing"]


def test_chain_stops_after_max_jobs(sagemaker):
    client, stubber = sagemaker
    for index in (1, 2):
        _expect_job(stubber, index, [("Stopped", "MaxRuntimeExceeded")])
    outcomes = run_chain(client, CONFIG, OUTPUTS, OPTIONS, max_jobs=2, poll_seconds=0, log=lambda m: None)
    assert len(outcomes) == 2 and all(o.continue_chain for o in outcomes)


def test_waiting_describes_the_job_until_it_ends_and_returns_its_final_description(sagemaker):
    client, stubber = sagemaker
    for status, secondary in [
        ("InProgress", "Training"),
        ("Stopping", "Stopping"),
        ("Stopped", "MaxRuntimeExceeded"),
        ("Stopped", "MaxRuntimeExceeded"),
    ]:
        stubber.add_response("describe_training_job", _described("j", status, secondary), {"TrainingJobName": "j"})
    assert wait_for_job(client, "j", poll_seconds=0)["SecondaryStatus"] == "MaxRuntimeExceeded"


def test_the_waiter_polls_at_the_chosen_interval_for_as_long_as_a_job_can_last(sagemaker, monkeypatch):
    client, stubber = sagemaker
    configs = []
    real_get_waiter = client.get_waiter

    def spying_get_waiter(name):
        waiter = real_get_waiter(name)
        real_wait = waiter.wait
        waiter.wait = lambda **kwargs: configs.append((name, kwargs["WaiterConfig"])) or real_wait(**kwargs)
        return waiter

    monkeypatch.setattr(client, "get_waiter", spying_get_waiter)
    completed = _described("j", "Completed", "Completed")
    for _ in range(2):  # the waiter's one describe, then the final description
        stubber.add_response("describe_training_job", completed, {"TrainingJobName": "j"})
    wait_for_job(client, "j", poll_seconds=60)
    ((name, config),) = configs
    assert name == "training_job_completed_or_stopped" and config["Delay"] == 60
    assert config["MaxAttempts"] * 60 >= MAX_JOB_LIFETIME_S == 30 * 24 * 3600


def test_an_api_error_while_waiting_is_raised(sagemaker):
    client, stubber = sagemaker
    stubber.add_client_error(
        "describe_training_job",
        service_error_code="ValidationException",
        service_message="Requested resource not found.",
        expected_params={"TrainingJobName": "j"},
    )
    with pytest.raises(WaiterError, match="ValidationException"):
        wait_for_job(client, "j", poll_seconds=0)


def test_a_user_stop_ends_the_chain():
    assert classify(_described("j", "Stopped", "Stopped")).continue_chain is False


def test_outputs_file_from_cdk_deploy_is_read_by_stack(tmp_path):
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({"moe-tj-training-job": {**OUTPUTS, "Extra": "x"}}))
    assert outputs_from_file(str(path), "moe-tj-training-job") == OUTPUTS
    assert set(OUTPUTS) == set(OUTPUT_KEYS)


def test_dry_run_prints_a_valid_request_without_credentials(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({"moe-tj-training-job": OUTPUTS}))
    result = subprocess.run(
        [
            str(ROOT / ".venv/bin/moe-cdk"),
            "sagemaker",
            "submit",
            "--config",
            "config/training-job.yaml",
            "--outputs-file",
            str(path),
            "--run-name",
            "dry",
            "--dry-run",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    request = json.loads(result.stdout)
    validate_parameters(request, _input_shape())
    assert request["TrainingJobName"] == "dry-01"
    bucket = OUTPUTS["DataBucketName"]
    assert f"would upload {CONFIG.training.path} to s3://{bucket}/profiles/dry/train.yaml" in result.stderr


def test_submit_rejects_a_slurm_configuration():
    result = subprocess.run(
        [str(ROOT / ".venv/bin/moe-cdk"), "sagemaker", "submit", "--config", "config/default.yaml", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert (
        "  cluster.orchestrator: submit needs a training-job configuration (got 'slurm'; allowed training-job)"
        in result.stderr
    )


def test_a_missing_outputs_file_is_a_problem_with_the_option(tmp_path):
    with pytest.raises(ConfigError) as error:
        outputs_from_file(str(tmp_path / "outputs.json"), "moe-tj-training-job")
    assert error.value.errors == [
        f"--outputs-file: cannot be read (No such file or directory) (got '{tmp_path / 'outputs.json'}'; "
        "allowed the JSON `cdk deploy --outputs-file FILE` writes)"
    ]


def test_an_outputs_file_that_is_not_json_is_a_problem_with_the_option(tmp_path):
    path = tmp_path / "outputs.json"
    path.write_text("Outputs:\n  RoleArn: x\n")
    with pytest.raises(ConfigError) as error:
        outputs_from_file(str(path), "moe-tj-training-job")
    assert error.value.errors[0].startswith("--outputs-file: cannot be read (Expecting value")


def test_a_stack_cloudformation_does_not_know_is_a_problem_that_points_to_the_outputs_file(sagemaker):
    client = boto3.client("cloudformation", region_name="us-east-2")
    with Stubber(client) as stubber:
        stubber.add_client_error(
            "describe_stacks", "ValidationError", "Stack with id moe-tj-training-job does not exist", 400
        )
        with pytest.raises(ConfigError) as error:
            outputs_from_cloudformation(client, "moe-tj-training-job")
    (line,) = error.value.errors
    assert line.startswith("stack outputs: cannot be read from CloudFormation (An error occurred (ValidationError)")
    assert line.endswith("or --outputs-file with the JSON `cdk deploy --outputs-file FILE` writes)")


def test_submit_without_credentials_is_an_error_not_a_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
    }
    result = subprocess.run(
        [str(ROOT / ".venv/bin/moe-cdk"), "sagemaker", "submit", "--config", "config/training-job.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "  stack outputs: cannot be read from CloudFormation (Unable to locate credentials)" in result.stderr
    assert "or --outputs-file with" in result.stderr
