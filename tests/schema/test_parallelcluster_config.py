"""The configuration of a ParallelCluster deployment (orchestrator parallelcluster): what it refuses, at which key."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import ROOT, config_errors

from moe_cdk.schema.config import load_config, parse_config

SHIPPED = yaml.safe_load((ROOT / "config/parallelcluster.yaml").read_text())
DEFAULT = yaml.safe_load((ROOT / "config/default.yaml").read_text())
GPU = 2  # config/parallelcluster.yaml's compute group


def group(data: dict, index: int) -> dict:
    return data["cluster"]["instance_groups"][index]


def test_the_shipped_configuration_loads():
    config = load_config(ROOT / "config/parallelcluster.yaml")
    assert config.cluster.orchestrator.value == "parallelcluster" and config.parallelcluster.version == "3.16.1"


SECRET = "arn:aws:secretsmanager:us-east-2:123456789012:secret:moe-pc-slurmdbd-AbCdEf"
TEAMS = {"qos": [{"name": "normal", "priority": 1}], "teams": [{"name": "research", "share_percent": 100}]}
REFUSED = {
    "capacity-block-without-reservation": (
        lambda d: group(d, GPU).pop("capacity_reservation_id"),
        "cluster.instance_groups[2].capacity_reservation_id: a Capacity Block group names its reservation",
    ),
    "capacity-block-min-below-count": (
        lambda d: group(d, GPU).update(min_instance_count=1),
        "cluster.instance_groups[2].min_instance_count: a Capacity Block's nodes are all started with it; "
        "ParallelCluster: Max count must be set to the same value of min count when using Capacity Block reservation.",
    ),
    "spot-into-a-reservation": (
        lambda d: group(d, GPU).update(capacity="spot"),
        "cluster.instance_groups[2].capacity: Spot nodes do not launch into a capacity reservation",
    ),
    "bad-reservation-id": (
        lambda d: group(d, GPU).update(capacity_reservation_id="cr-1"),
        "cluster.instance_groups[2].capacity_reservation_id: not a capacity reservation ID",
    ),
    "queue-name-with-capitals": (
        lambda d: group(d, GPU).update(name="GPU"),
        "cluster.instance_groups[2].name: not a ParallelCluster queue name",
    ),
    "partition-other-than-the-queue": (
        lambda d: group(d, GPU).update(partition="train"),
        "cluster.instance_groups[2].partition: ParallelCluster names each queue's partition after the queue",
    ),
    "training-plan": (
        lambda d: group(d, GPU).update(training_plan_arn="arn:aws:sagemaker:us-east-2:123456789012:training-plan/x"),
        "cluster.instance_groups[2].training_plan_arn: a HyperPod setting",
    ),
    "two-head-nodes": (
        lambda d: group(d, 0).update(instance_count=2),
        "cluster.instance_groups: ParallelCluster has one head node",
    ),
    "compute-type-without-efa": (
        lambda d: group(d, GPU).update(instance_type="m5.8xlarge", capacity="on-demand", capacity_reservation_id=None),
        "cluster.instance_groups[2].instance_type: has no EFA, and EFA is required",
    ),
    "continuous-provisioning": (
        lambda d: d["cluster"].update(node_provisioning_mode="continuous"),
        "cluster.node_provisioning_mode: a HyperPod setting",
    ),
    "another-release": (
        lambda d: d["parallelcluster"].update(version="3.15.1"),
        "parallelcluster.version: moe-cdk deploys and validates one ParallelCluster release",
    ),
    "service-token-not-an-arn": (
        lambda d: d["parallelcluster"].update(service_token="pcluster-provider"),
        "parallelcluster.service_token: not a Lambda function ARN",
    ),
    "compute-fleet-stop": (
        lambda d: d["parallelcluster"].update(queue_update_strategy="COMPUTE_FLEET_STOP"),
        "parallelcluster.queue_update_strategy: unknown value",
    ),
    "teams-without-accounting": (
        lambda d: d.update(teams=TEAMS),
        "teams: teams need Slurm accounting, which ParallelCluster keeps only in an external database",
    ),
    "accounting-without-its-user": (
        lambda d: d["cluster"].update(accounting_database={"endpoint": "db.example.com", "secret_arn": SECRET}),
        "cluster.accounting_database.user_name: ParallelCluster's SlurmSettings.Database takes the user name here",
    ),
    "accounting-with-a-bad-secret": (
        lambda d: d["cluster"].update(
            accounting_database={"endpoint": "db.example.com", "secret_arn": "slurm-db", "user_name": "slurm"}
        ),
        "cluster.accounting_database.secret_arn: not a Secrets Manager secret ARN",
    ),
}


@pytest.mark.parametrize(("mutate", "expected"), REFUSED.values(), ids=REFUSED.keys())
def test_a_parallelcluster_configuration_is_refused_at_its_key(mutate, expected):
    errors = config_errors(SHIPPED, mutate)
    assert any(line.startswith(expected) for line in errors), errors


def test_a_capacity_block_is_refused_on_hyperpod():
    def mutate(data):
        group(data, GPU).update(capacity="capacity-block", capacity_reservation_id="cr-0123456789abcdef0")

    errors = config_errors(DEFAULT, mutate)
    assert any(e.startswith("cluster.instance_groups[2].capacity: only ParallelCluster groups") for e in errors)
    assert any(e.startswith("cluster.instance_groups[2].capacity_reservation_id: only ParallelCluster") for e in errors)


def test_the_parallelcluster_section_is_refused_with_another_orchestrator():
    errors = config_errors(DEFAULT, lambda d: d.update(parallelcluster={"deletion_policy": "Delete"}))
    assert any(e.startswith("parallelcluster: only used with orchestrator parallelcluster") for e in errors), errors


def test_teams_with_an_accounting_database_and_its_user_are_accepted():
    data = copy.deepcopy(SHIPPED)
    data["cluster"]["accounting_database"] = {"endpoint": "db.example.com", "secret_arn": SECRET, "user_name": "slurm"}
    config = parse_config(data | {"teams": TEAMS})
    assert config.cluster.accounting_database.user_name == "slurm" and config.teams.teams[0].name == "research"


def test_an_accounting_database_user_name_is_refused_on_hyperpod():
    def mutate(data):
        data["cluster"].update(
            node_provisioning_mode="continuous",
            accounting_database={"endpoint": "db.example.com", "secret_arn": SECRET, "user_name": "slurm"},
        )
        data["cluster"].pop("slurm_config_strategy", None)

    errors = config_errors(DEFAULT, mutate)
    assert [e for e in errors if e.startswith("cluster.accounting_database.user_name: ParallelCluster only")], errors
