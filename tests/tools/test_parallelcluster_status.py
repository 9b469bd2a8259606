"""moe-cdk status on a ParallelCluster cluster, against botocore's own models (``Stubber`` checks every request
against the CloudFormation and EC2 API shapes): its stack's status and its instances, by ParallelCluster's tags."""

from __future__ import annotations

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
    with Stubber(cloudformation) as cfn, Stubber(ec2) as ec:
        yield cloudformation, cfn, ec2, ec
        cfn.assert_no_pending_responses()
        ec.assert_no_pending_responses()


def answer(cfn, ec, stack_status: str, *instances: dict) -> None:
    created = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
    stack = {"StackName": "moe-pc", "StackId": STACK_ID, "CreationTime": created, "StackStatus": stack_status}
    cfn.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": "moe-pc"})
    ec.add_response("describe_instances", {"Reservations": [{"Instances": list(instances)}]}, {"Filters": FILTERS})


def test_every_node_is_shown_in_its_instance_group_and_a_running_cluster_is_healthy(clients):
    cloudformation, cfn, ec2, ec = clients
    answer(cfn, ec, "CREATE_COMPLETE", instance("i-0a", "HeadNode"),
           instance("i-0b", "LoginNode", login_nodes_pool_name="login"),
           instance("i-0c", "Compute", queue_name="gpu"), instance("i-0d", "Compute", queue_name="gpu"))  # fmt: skip
    status = parallelcluster_status(load_config(CONFIG), cloudformation, ec2)
    assert status.healthy and [(n.group, n.instance_id) for n in status.nodes] == [
        ("gpu", "i-0c"), ("gpu", "i-0d"), ("head", "i-0a"), ("login", "i-0b")
    ]  # fmt: skip
    assert render_status(status).splitlines()[0] == "cluster moe-pc: CREATE_COMPLETE"


def test_a_stopped_compute_node_leaves_the_cluster_unhealthy_and_the_command_exits_1(clients, monkeypatch, capsys):
    cloudformation, cfn, ec2, ec = clients
    answer(cfn, ec, "UPDATE_COMPLETE", instance("i-0a", "HeadNode"),
           instance("i-0c", "Compute", state="stopped", queue_name="gpu"))  # fmt: skip
    clients_by_name = {"cloudformation": cloudformation, "ec2": ec2}
    monkeypatch.setattr(sys.modules["boto3"], "client", lambda name, **_: clients_by_name[name])
    assert status_command.run(status_command.argparse.Namespace(config=str(CONFIG), json=True)) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["healthy"] is False and [n["status"] for n in shown["nodes"]] == ["Stopped", "Running"]


def test_a_cluster_whose_stack_does_not_exist_is_said_so_in_one_line(clients, monkeypatch, capsys):
    cloudformation, cfn, ec2, _ = clients
    cfn.add_client_error("describe_stacks", "ValidationError", "Stack with id moe-pc does not exist", 400)
    monkeypatch.setattr(sys.modules["boto3"], "client", lambda name, **_: {"cloudformation": cloudformation,
                                                                             "ec2": ec2}[name])  # fmt: skip
    assert status_command.run(status_command.argparse.Namespace(config=str(CONFIG), json=False)) == 1
    err = capsys.readouterr().err
    assert "Stack with id moe-pc does not exist" in err and "Traceback" not in err and len(err.splitlines()) == 1
