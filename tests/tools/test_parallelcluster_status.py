"""moe-cdk status on a ParallelCluster cluster, against botocore's own models (``Stubber`` checks every request
against the CloudFormation, EC2 and CloudWatch Logs API shapes): its stack's status, its instances, by ParallelCluster's
tags, and the lifecycle steps that failed, from the log group its stack names."""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys

import boto3
import pytest
from botocore.stub import Stubber
from conftest import ROOT

from moe_cdk.cli import status as status_command
from moe_cdk.schema.config import load_config
from moe_cdk.tools.cluster_status import parallelcluster_status, render_status

CONFIG = ROOT / "config/parallelcluster.yaml"
STACK_ID = "arn:aws:cloudformation:us-east-2:111122223333:stack/moe-pc/0a1b2c3d-0000-0000-0000-000000000000"
LOG_GROUP = "/aws/parallelcluster/moe-pc-202612011200"
FAILED = '"moe-cdk-step" "\\"outcome\\":\\"failed\\""'
FILTERS = [
    {"Name": "tag:parallelcluster:cluster-name", "Values": ["moe-pc"]},
    {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
]


def instance(instance_id: str, node_type: str, state: str = "running", **tags: str) -> dict:
    keys = {"node-type": node_type, "cluster-name": "moe-pc", **{k.replace("_", "-"): v for k, v in tags.items()}}
    return {
        "InstanceId": instance_id,
        "InstanceType": "p5en.48xlarge" if node_type == "Compute" else "m5.8xlarge",
        "State": {"Code": 16, "Name": state},
        "Tags": [{"Key": f"parallelcluster:{k}", "Value": v} for k, v in keys.items()],
    }


@pytest.fixture
def clients(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    cloudformation = boto3.client("cloudformation", region_name="us-east-2")
    ec2 = boto3.client("ec2", region_name="us-east-2")
    logs = boto3.client("logs", region_name="us-east-2")
    with Stubber(cloudformation) as cfn, Stubber(ec2) as ec, Stubber(logs) as lg:
        yield Clients(cloudformation, cfn, ec2, ec, logs, lg)
        for stubber in (cfn, ec, lg):
            stubber.assert_no_pending_responses()


@dataclasses.dataclass
class Clients:
    cloudformation: object
    cfn: Stubber
    ec2: object
    ec: Stubber
    logs: object
    lg: Stubber

    def status(self):
        return parallelcluster_status(load_config(CONFIG), self.cloudformation, self.ec2, self.logs)

    def by_name(self, name: str, **_):
        return {"cloudformation": self.cloudformation, "ec2": self.ec2, "logs": self.logs}[name]


def record(node: str, group: str, step: str, hint: str) -> str:
    fields = {"node": node, "group": group, "step": step, "outcome": "failed", "seconds": 3, "hint": hint}
    return f"2026-12-01T12:05:00Z [{step}] moe-cdk-step {json.dumps(fields)}"


def answer(c: Clients, stack_status: str, *instances: dict, failed: tuple[tuple[str, str], ...] = (), logs=True):
    """The stack (naming its log group when ``logs``), its instances, and the log events of ``failed``: (stream,
    record line) pairs."""
    created = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
    stack = {"StackName": "moe-pc", "StackId": STACK_ID, "CreationTime": created, "StackStatus": stack_status}
    if logs:
        stack["Parameters"] = [{"ParameterKey": "ClusterCWLogGroup", "ParameterValue": LOG_GROUP}]
    c.cfn.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": "moe-pc"})
    if logs:
        events = [{"logStreamName": stream, "timestamp": 1, "message": line} for stream, line in failed]
        c.lg.add_response("filter_log_events", {"events": events}, {"logGroupName": LOG_GROUP, "filterPattern": FAILED})
    c.ec.add_response("describe_instances", {"Reservations": [{"Instances": list(instances)}]}, {"Filters": FILTERS})


def test_every_node_is_shown_in_its_instance_group_and_a_running_cluster_is_healthy(clients):
    answer(clients, "CREATE_COMPLETE", instance("i-0a", "HeadNode"),
           instance("i-0b", "LoginNode", login_nodes_pool_name="login"),
           instance("i-0c", "Compute", queue_name="gpu"), instance("i-0d", "Compute", queue_name="gpu"))  # fmt: skip
    status = clients.status()
    assert status.healthy and [(n.group, n.instance_id) for n in status.nodes] == [
        ("gpu", "i-0c"), ("gpu", "i-0d"), ("head", "i-0a"), ("login", "i-0b")
    ]  # fmt: skip
    assert render_status(status).splitlines()[:2] == [
        "cluster moe-pc: CREATE_COMPLETE",
        f"  lifecycle logs: CloudWatch Logs {LOG_GROUP}, streams <host>.<instance>.<log> (ParallelCluster's "
        "Monitoring.Logs)",
    ]


def test_a_stopped_compute_node_leaves_the_cluster_unhealthy_and_the_command_exits_1(clients, monkeypatch, capsys):
    answer(clients, "UPDATE_COMPLETE", instance("i-0a", "HeadNode"),
           instance("i-0c", "Compute", state="stopped", queue_name="gpu"))  # fmt: skip
    monkeypatch.setattr(sys.modules["boto3"], "client", clients.by_name)
    assert status_command.run(status_command.argparse.Namespace(config=str(CONFIG), json=True)) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["healthy"] is False and [n["status"] for n in shown["nodes"]] == ["Stopped", "Running"]


def test_a_node_whose_lifecycle_step_failed_is_in_failure_with_its_step_and_hint(clients):
    line = record("i-0c", "gpu", "setup_enroot", "enroot 3.4.1 from https://github.com/... did not download")
    answer(clients, "CREATE_COMPLETE", instance("i-0a", "HeadNode"), instance("i-0c", "Compute", queue_name="gpu"),
           failed=(("ip-10-0-64-21.i-0c.cloud-init-output", line),))  # fmt: skip
    status = clients.status()
    assert not status.healthy and [n.status for n in status.nodes] == ["Failure", "Running"]
    assert "      step setup_enroot failed after 3s: enroot 3.4.1 from https://github.com/... did not download" in (
        render_status(status).splitlines()
    )


def test_the_failed_steps_of_replaced_nodes_are_listed_apart(clients):
    # ParallelCluster terminates a compute node whose bootstrap failed and starts another.
    line = record("i-0old", "gpu", "observability", "docker is not installed")
    answer(clients, "UPDATE_COMPLETE", instance("i-0a", "HeadNode"), instance("i-0c", "Compute", queue_name="gpu"),
           failed=(("ip-10-0-64-22.i-0old.cloud-init-output", line),))  # fmt: skip
    status = clients.status()
    assert status.healthy and [n.status for n in status.nodes] == ["Running", "Running"]
    assert render_status(status).splitlines()[-1] == (
        "  gone: i-0old of gpu, step observability failed after 3s: docker is not installed"
    )


def test_a_cluster_without_cloudwatch_logs_says_so_and_reads_none(clients):
    answer(clients, "CREATE_COMPLETE", instance("i-0a", "HeadNode"), logs=False)
    assert render_status(clients.status()).splitlines()[-1] == (
        "  the cluster's stack names no log group (ClusterCWLogGroup): its CloudWatch logs are off"
    )


def test_a_cluster_whose_stack_does_not_exist_is_said_so_in_one_line(clients, monkeypatch, capsys):
    clients.cfn.add_client_error("describe_stacks", "ValidationError", "Stack with id moe-pc does not exist", 400)
    monkeypatch.setattr(sys.modules["boto3"], "client", clients.by_name)
    assert status_command.run(status_command.argparse.Namespace(config=str(CONFIG), json=False)) == 1
    err = capsys.readouterr().err
    assert "Stack with id moe-pc does not exist" in err and "Traceback" not in err and len(err.splitlines()) == 1
