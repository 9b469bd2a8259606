"""moe-cdk status against botocore's own models: every request is checked by ``Stubber`` against the
SageMaker and CloudWatch Logs API shapes, and the responses are shaped as those APIs answer."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys

import boto3
import pytest
from botocore.stub import ANY, Stubber
from conftest import PYTHON, ROOT

from moe_cdk.cli import status as status_command
from moe_cdk.schema.config import load_config
from moe_cdk.tools.cluster_status import FAILED_RECORDS, cluster_status, parse_record, render_status, to_json

ARN = "arn:aws:sagemaker:us-east-2:111122223333:cluster/k2j3h4g5f6d7"
LOG_GROUP = "/aws/sagemaker/Clusters/moe/k2j3h4g5f6d7"
LAUNCHED = datetime.datetime(2026, 12, 1, 8, 0, tzinfo=datetime.timezone.utc)


def node(group: str, instance: str, state: str, message: str | None = None) -> dict:
    status = {"Status": state, **({"Message": message} if message else {})}
    return {
        "InstanceGroupName": group,
        "InstanceId": instance,
        "InstanceType": "ml.p5en.48xlarge" if group == "gpu" else "ml.m5.2xlarge",
        "LaunchTime": LAUNCHED,
        "InstanceStatus": status,
    }


def record(group: str, instance: str, step: str, outcome: str, **extra) -> str:
    fields = {"node": instance, "group": group, "step": step, "outcome": outcome, "seconds": 12, **extra}
    return f"2026-12-01T08:04:00Z [{step}] moe-cdk-step {json.dumps(fields, separators=(',', ':'))}"


def event(group: str, instance: str, at: int, message: str) -> dict:
    return {
        "logStreamName": f"LifecycleConfig/{group}/{instance}",
        "timestamp": at,
        "message": message,
        "ingestionTime": at + 1,
        "eventId": f"{at}",
    }


@pytest.fixture
def clients(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    sagemaker = boto3.client("sagemaker", region_name="us-east-2")
    logs = boto3.client("logs", region_name="us-east-2")
    with Stubber(sagemaker) as sm, Stubber(logs) as cw:
        yield sagemaker, sm, logs, cw
        sm.assert_no_pending_responses()
        cw.assert_no_pending_responses()


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "config/default.yaml")


def describe(sm, state="InService", **extra):
    sm.add_response(
        "describe_cluster",
        {"ClusterArn": ARN, "ClusterName": "moe", "ClusterStatus": state, "InstanceGroups": [], **extra},
        {"ClusterName": "moe"},
    )


def test_a_healthy_cluster_reads_no_logs(clients, config):
    sagemaker, sm, logs, _ = clients
    describe(sm)
    nodes = [node("controller", "i-0123", "Running"), node("gpu", "i-0456", "Running")]
    sm.add_response("list_cluster_nodes", {"ClusterNodeSummaries": nodes}, {"ClusterName": "moe"})
    status = cluster_status(config, sagemaker, logs)
    assert status.healthy and status.log_group == LOG_GROUP
    assert [(n.group, n.instance_id, n.status) for n in status.nodes] == [
        ("controller", "i-0123", "Running"),
        ("gpu", "i-0456", "Running"),
    ]


def test_nodes_are_read_across_pages(clients, config):
    sagemaker, sm, logs, _ = clients
    describe(sm, "Creating")
    sm.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [node("gpu", "i-0456", "Pending")], "NextToken": "page-2"},
        {"ClusterName": "moe"},
    )
    sm.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [node("controller", "i-0123", "Running")]},
        {"ClusterName": "moe", "NextToken": "page-2"},
    )
    status = cluster_status(config, sagemaker, logs)
    assert [n.instance_id for n in status.nodes] == ["i-0123", "i-0456"] and not status.healthy


def failed_cluster(sm) -> None:
    describe(sm, "Failed", FailureMessage="Lifecycle scripts did not run successfully on one or more instances")
    sm.add_response(
        "list_cluster_nodes",
        {
            "ClusterNodeSummaries": [
                node("controller", "i-0123", "Running"),
                node("gpu", "i-0456", "Failure", "Lifecycle script failed"),
                node("gpu", "i-0abc", "Running"),
            ]
        },
        {"ClusterName": "moe"},
    )


def test_a_failed_node_shows_its_first_failed_step_and_hint_from_every_page_of_logs(clients, config):
    sagemaker, sm, logs, cw = clients
    failed_cluster(sm)
    hint = "enroot 3.4.1 from https://github.com/... is sha256:ab, not the pinned sha256:cd: nothing was installed"
    request = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": "LifecycleConfig/", "filterPattern": FAILED_RECORDS}
    cw.add_response(
        "filter_log_events",
        {
            "events": [event("gpu", "i-0456", 2000, record("gpu", "i-0456", "slurm_features", "failed", hint="later"))],
            "nextToken": "t2",
        },
        request,
    )
    cw.add_response(
        "filter_log_events",
        {
            "events": [
                event("gpu", "i-0456", 1000, record("gpu", "i-0456", "setup_enroot", "failed", hint=hint)),
                event("gpu", "i-0456", 900, "2026-12-01T08:03:00Z [setup_enroot] a line with no record"),
            ]
        },
        {**request, "nextToken": "t2"},
    )
    status = cluster_status(config, sagemaker, logs)
    (failed,) = [n for n in status.nodes if n.status == "Failure"]
    assert (failed.failed_step.step, failed.failed_step.hint) == ("setup_enroot", hint)
    text = render_status(status)
    assert "cluster moe: Failed (Lifecycle scripts did not run successfully on one or more instances)" in text
    assert f"      step setup_enroot failed after 12s: {hint}" in text
    assert "      HyperPod: Lifecycle script failed" in text


def test_a_log_group_that_does_not_exist_yet_is_said_so(clients, config):
    sagemaker, sm, logs, cw = clients
    failed_cluster(sm)
    cw.add_client_error(
        "filter_log_events",
        service_error_code="ResourceNotFoundException",
        service_message="The specified log group does not exist.",
        http_status_code=400,
        expected_params={"logGroupName": LOG_GROUP, "logStreamNamePrefix": ANY, "filterPattern": ANY},
    )
    status = cluster_status(config, sagemaker, logs)
    assert status.log_note == f"log group {LOG_GROUP} does not exist yet: no node has run its lifecycle scripts so far"
    assert f"      log group {LOG_GROUP} does not exist yet" in render_status(status)
    assert to_json(status)["healthy"] is False


def test_another_logs_error_is_raised(clients, config):
    sagemaker, sm, logs, cw = clients
    failed_cluster(sm)
    cw.add_client_error("filter_log_events", service_error_code="AccessDeniedException", http_status_code=400)
    with pytest.raises(Exception, match="AccessDeniedException"):
        cluster_status(config, sagemaker, logs)


def test_records_are_parsed_as_lib_sh_writes_them():
    # The line lib.sh's step_record printed in the lifecycle tests, with a hint holding quotes.
    line = (
        '2026-12-02T08:04:05Z [mount_fsx] moe-cdk-step {"node":"i-0456","group":"gpu","step":"mount_fsx",'
        '"outcome":"failed","seconds":0,"hint":"\'mount -t lustre\' exited with 5; check \\"it\\""}'
    )
    parsed = parse_record(line)
    assert parsed.step == "mount_fsx" and parsed.hint == "'mount -t lustre' exited with 5; check \"it\""
    assert parse_record("2026-12-02T08:04:05Z [x] moe-cdk-step {broken") is None


def test_the_command_refuses_a_training_job_configuration_by_key():
    out = subprocess.run(
        [PYTHON, "-m", "moe_cdk.cli.main", "status", "--config", "config/training-job.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "cluster.orchestrator: status reads a cluster" in out.stderr


def test_the_command_says_when_there_are_no_credentials(monkeypatch, capsys):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probe from the tests
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # not the session earlier tests gave credentials
    args = status_command.argparse.Namespace(config=str(ROOT / "config/default.yaml"), json=False)
    assert status_command.run(args) == 1
    err = capsys.readouterr().err
    assert "no AWS credentials were found: set AWS_PROFILE or run `aws configure`" in err and "Traceback" not in err


def test_the_command_prints_json_and_exits_1_for_an_unhealthy_cluster(clients, monkeypatch, capsys):
    sagemaker, sm, logs, cw = clients
    describe(sm, "Creating")
    sm.add_response(
        "list_cluster_nodes", {"ClusterNodeSummaries": [node("gpu", "i-0456", "Pending")]}, {"ClusterName": "moe"}
    )
    monkeypatch.setattr(sys.modules["boto3"], "client", lambda name, **_: {"sagemaker": sagemaker, "logs": logs}[name])
    args = status_command.argparse.Namespace(config=str(ROOT / "config/default.yaml"), json=True)
    assert status_command.run(args) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "Creating" and shown["nodes"][0]["status"] == "Pending" and shown["healthy"] is False


def test_training_job_configuration_is_refused_before_aws_is_asked(capsys, monkeypatch):
    monkeypatch.setattr(sys.modules["boto3"], "client", lambda *_, **__: pytest.fail("AWS was asked"))
    args = status_command.argparse.Namespace(config=str(ROOT / "config/training-job.yaml"), json=False)
    assert status_command.run(args) == 2
    err = capsys.readouterr().err
    assert "cluster.orchestrator: status reads a cluster" in err and "got 'training-job'" in err


HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m"


def test_strings_from_aws_reach_the_terminal_without_control_characters(clients, config, monkeypatch, capsys):
    """A hint in CloudWatch Logs (written by whoever runs on a node) and every SageMaker string are printed
    without C0/C1 control characters: no escape sequence can clear or retitle the reader's terminal."""
    sagemaker, sm, logs, cw = clients
    describe(sm, f"Failed{HOSTILE}", FailureMessage=f"bad{HOSTILE}\nsecond line")
    sm.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [node("gpu", "i-0456", "Failure", f"Lifecycle{HOSTILE} script failed")]},
        {"ClusterName": "moe"},
    )
    hostile_record = record("gpu", "i-0456", f"setup{HOSTILE}", "failed", hint=f"do{HOSTILE} this\r\nthen that")
    cw.add_response(
        "filter_log_events",
        {"events": [event("gpu", "i-0456", 1000, hostile_record)]},
        {"logGroupName": LOG_GROUP, "logStreamNamePrefix": "LifecycleConfig/", "filterPattern": FAILED_RECORDS},
    )
    monkeypatch.setattr(sys.modules["boto3"], "client", lambda name, **_: {"sagemaker": sagemaker, "logs": logs}[name])
    args = status_command.argparse.Namespace(config=str(ROOT / "config/default.yaml"), json=False)
    assert status_command.run(args) == 1
    text = capsys.readouterr().out
    controls = [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)]
    assert controls == [], text
    # Each string stays on its own line: a newline inside one is not a line of the output.
    assert len(text.splitlines()) == 5, text
    assert "cluster moe: Failed[2J]0;owned31m (bad[2J]0;owned31m second line)" in text
    assert "      step setup[2J]0;owned31m failed after 12s: do[2J]0;owned31m this then that" in text
    assert "      HyperPod: Lifecycle[2J]0;owned31m script failed" in text


def test_an_aws_error_message_is_printed_without_control_characters(clients, monkeypatch, capsys):
    sagemaker, sm, logs, _ = clients
    sm.add_client_error(
        "describe_cluster",
        service_error_code="AccessDeniedException",
        service_message=f"no{HOSTILE}",
        http_status_code=400,
    )
    monkeypatch.setattr(sys.modules["boto3"], "client", lambda name, **_: {"sagemaker": sagemaker, "logs": logs}[name])
    args = status_command.argparse.Namespace(config=str(ROOT / "config/default.yaml"), json=False)
    assert status_command.run(args) == 1
    err = capsys.readouterr().err
    assert "AWS refused the request" in err and "no[2J]0;owned31m" in err
    assert not [c for c in err if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)], err
