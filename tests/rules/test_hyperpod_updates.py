"""An instance group's AMI and its updates (image_id, scheduled_update, auto_patch): checked against
botocore's SageMaker model and CloudFormation's registry schema, refused by name, and synthesized clean."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import botocore.session
import pytest
import yaml
from botocore.validate import ParamValidator
from cfnlint.rules.formats.ImageId import ImageId
from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
from conftest import ROOT, assert_cfn_lint_clean, config_errors, resources_of_type, synth

from moe_cdk.rules.hyperpod_updates import AMI_ID_FORMAT, CRON, BatchUnit, PatchingStrategy
from moe_cdk.schema.config import parse_config

SAGEMAKER = botocore.session.get_session().get_service_model("sagemaker")
CLUSTER_SCHEMA = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-2", "AWS::SageMaker::Cluster").schema[
    "definitions"
]

SLURM, EKS = "config/default.yaml", "config/eks-p5en.yaml"
# The index of each shipped configuration's compute group "gpu" (2 x ml.p5en.48xlarge).
GPU = {SLURM: 2, EKS: 1, "config/training-job.yaml": 0}
ROLLING = {"batch_size": 50, "batch_unit": "percent", "wait_between_batches_s": 600, "rollback_alarms": ["gpu-xid"]}
# Every setting; batches (rolling) are for EKS clusters only.
FLEET = {
    SLURM: {
        "image_id": "ami-0123456789abcdef0",
        "scheduled_update": {"schedule": "cron(0 3 ? * SUN *)"},
        "auto_patch": {"strategy": "when-all-idle"},
    },
    EKS: {
        "image_id": "ami-0fedcba9876543210",
        "scheduled_update": {"schedule": "cron(0 3 ? * SUN *)", "rolling": ROLLING},
        "auto_patch": {"strategy": "when-idle", "rolling": {"batch_size": 1}},
    },
}


def _load(config: str) -> dict:
    return yaml.safe_load((ROOT / config).read_text())


def _errors(config: str, **settings) -> list[str]:
    return config_errors(_load(config), lambda data: data["cluster"]["instance_groups"][GPU[config]].update(settings))


def test_the_cron_is_cloudformations_pattern():
    assert CRON.pattern == CLUSTER_SCHEMA["ScheduledUpdateConfig"]["properties"]["ScheduleExpression"]["pattern"]


def test_the_ami_id_format_is_the_one_cfn_lint_checks():
    assert AMI_ID_FORMAT == ImageId().pattern


def test_the_patching_strategies_are_those_cloudformation_accepts_and_the_api_has():
    ours = {s.api_value for s in PatchingStrategy}
    assert ours == set(CLUSTER_SCHEMA["AutoPatchConfig"]["properties"]["PatchingStrategy"]["enum"])
    assert ours <= set(SAGEMAKER.shape_for("ClusterAutoPatchConfig").members["PatchingStrategy"].enum)


def test_the_batch_units_are_the_apis():
    assert {u.api_value for u in BatchUnit} == set(SAGEMAKER.shape_for("NodeUnavailabilityType").enum)


@pytest.fixture(scope="module", params=[SLURM, EKS])
def fleet(request, tmp_path_factory) -> tuple[str, dict, Path]:
    """A shipped configuration (Slurm, then EKS) whose compute group has every fleet setting, synthesized:
    (configuration, templates by stack, cdk.out)."""
    data = _load(request.param)
    data["cluster"]["instance_groups"][GPU[request.param]].update(copy.deepcopy(FLEET[request.param]))
    outdir = tmp_path_factory.mktemp("fleet")
    return request.param, synth(parse_config(data), outdir), outdir


def _cluster(templates: dict) -> dict:
    (cluster,) = [r for t in templates.values() for r in resources_of_type(t, "AWS::SageMaker::Cluster").values()]
    return cluster


def test_the_settings_reach_the_cluster_as_createcluster_takes_them(fleet):
    config, templates, _ = fleet
    (group,) = [g for g in _cluster(templates)["Properties"]["InstanceGroups"] if g["InstanceGroupName"] == "gpu"]
    request = {key: group[key] for key in ("ImageId", "ScheduledUpdateConfig", "AutoPatchConfig")}
    assert request == {
        "ImageId": FLEET[config]["image_id"],
        "ScheduledUpdateConfig": {
            "ScheduleExpression": "cron(0 3 ? * SUN *)",
            **(
                {
                    "DeploymentConfig": {
                        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "CAPACITY_PERCENTAGE", "Value": 50}},
                        "WaitIntervalInSeconds": 600,
                        "AutoRollbackConfiguration": [{"AlarmName": "gpu-xid"}],
                    }
                }
                if config == EKS
                else {}
            ),
        },
        "AutoPatchConfig": {"PatchingStrategy": "WhenAllIdle"}
        if config == SLURM
        else {
            "PatchingStrategy": "WhenIdle",
            "DeploymentConfig": {
                "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}},
                "WaitIntervalInSeconds": 0,
            },
        },
    }
    request |= {
        "InstanceGroupName": "gpu",
        "InstanceType": "ml.p5en.48xlarge",
        "InstanceCount": 2,
        "ExecutionRole": "arn:aws:iam::123456789012:role/node",
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-bucket/lifecycle/", "OnCreate": "on_create.sh"},
    }
    report = ParamValidator().validate(request, SAGEMAKER.shape_for("ClusterInstanceGroupSpecification"))
    assert not report.has_errors(), report.generate_report()


def test_the_template_is_cfn_lint_clean(fleet):
    _, _, outdir = fleet
    assert_cfn_lint_clean("us-east-2", *sorted(outdir.glob("*.template.json")))  # both configurations' region


def test_the_nodes_may_read_the_alarms_an_update_rolls_back_on(fleet):
    config, templates, _ = fleet
    statements = [
        s
        for t in templates.values()
        for policy in resources_of_type(t, "AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if "cloudwatch:DescribeAlarms" in json.dumps(s["Action"])
    ]
    if config == SLURM:
        assert statements == []
    else:
        (statement,) = statements
        assert json.dumps(statement["Resource"]).endswith(':alarm:gpu-xid"]]}')


def test_groups_without_the_settings_carry_none_of_them(default_synth):
    _, templates = default_synth
    text = json.dumps(templates)
    assert not re.search(r'"(ImageId|ScheduledUpdateConfig|AutoPatchConfig)"', text)


KEY = f"cluster.instance_groups[{GPU[EKS]}]"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        pytest.param({"image_id": "ami-12"}, f"{KEY}.image_id: not an AMI id (got 'ami-12';", id="short-ami"),
        pytest.param({"image_id": "latest"}, f"{KEY}.image_id: not an AMI id (got 'latest';", id="latest"),
        # botocore's pattern takes both; CloudFormation's AMI id format (cfn-lint E1152) takes neither.
        pytest.param({"image_id": "default"}, f"{KEY}.image_id: not an AMI id (got 'default';", id="default"),
        pytest.param(
            {"image_id": "ami-0123456789"}, f"{KEY}.image_id: not an AMI id (got 'ami-0123456789';", id="ami-10-digits"
        ),
        pytest.param(
            {"scheduled_update": {"schedule": "cron(0 25 ? * SUN *)"}},
            f"{KEY}.scheduled_update.schedule: not a HyperPod update schedule (got 'cron(0 25 ? * SUN *)';",
            id="hour-25",
        ),
        pytest.param(
            {"scheduled_update": {"schedule": "rate(7 days)"}},
            f"{KEY}.scheduled_update.schedule: not a HyperPod update schedule (got 'rate(7 days)';",
            id="rate",
        ),
        pytest.param(
            {"scheduled_update": {"schedule": "cron(0 3 ? * SUN *)", "rolling": {"batch_size": 0}}},
            f"{KEY}.scheduled_update.rolling.batch_size: out of range (got 0; allowed 1 or more nodes)",
            id="batch-0",
        ),
        pytest.param(
            {"auto_patch": {"strategy": "when-idle", "rolling": {"batch_size": 150, "batch_unit": "percent"}}},
            f"{KEY}.auto_patch.rolling.batch_size: out of range (got 150; allowed 1 to 100 percent)",
            id="percent-150",
        ),
        pytest.param(
            {"auto_patch": {"strategy": "when-idle", "rolling": {"batch_size": 3}}},
            f"{KEY}.auto_patch.rolling.batch_size: more nodes than the group has (got 3; allowed 1 to 2,",
            id="batch-over-the-group",
        ),
        pytest.param(
            {"auto_patch": {"strategy": "when-idle", "rolling": {"wait_between_batches_s": 3601}}},
            f"{KEY}.auto_patch.rolling.wait_between_batches_s: out of range (got 3601; allowed 0 to 3600 seconds)",
            id="wait-3601",
        ),
        pytest.param(
            {"auto_patch": {"strategy": "when-idle", "rolling": {"rollback_alarms": [f"a{i}" for i in range(11)]}}},
            f"{KEY}.auto_patch.rolling.rollback_alarms: too many alarms (got 11; allowed 1 to 10 alarm names)",
            id="eleven-alarms",
        ),
        pytest.param(
            {"auto_patch": {"strategy": "when-idle", "rolling": {"rollback_alarms": ["  "]}}},
            f"{KEY}.auto_patch.rolling.rollback_alarms[0]: not a CloudWatch alarm name (got '  ';",
            id="blank-alarm",
        ),
        pytest.param(
            {"auto_patch": {"strategy": "drain-first"}},
            f"{KEY}.auto_patch.strategy: unknown value (got 'drain-first'; allowed when-idle, when-all-idle)",
            id="drain-first",
        ),
    ],
)
def test_a_bad_setting_is_refused_by_its_key(settings, expected):
    errors = _errors(EKS, **settings)
    assert any(line.startswith(expected) for line in errors), errors


def test_a_slurm_cluster_refuses_updates_in_batches():
    errors = _errors(SLURM, auto_patch={"strategy": "when-idle", "rolling": {"batch_size": 1}})
    assert errors == [
        f"cluster.instance_groups[{GPU[SLURM]}].auto_patch.rolling: updates in batches are for EKS clusters only "
        "(got 'batch_size 1 instances'; allowed no rolling section on a Slurm cluster)"
    ]


def test_a_training_job_refuses_every_fleet_setting():
    errors = _errors("config/training-job.yaml", **FLEET[SLURM])
    assert {line.split(":")[0] for line in errors} == {
        f"cluster.instance_groups[0].{key}" for key in ("image_id", "scheduled_update", "auto_patch")
    }
