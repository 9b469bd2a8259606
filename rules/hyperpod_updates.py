"""What a HyperPod instance group's nodes boot and how their AMI is updated: ``ImageId``,
``ScheduledUpdateConfig`` and ``AutoPatchConfig``, with the limits CreateCluster and CloudFormation
put on them.

Sources, read where each rule is applied:
- botocore's SageMaker model (``ClusterInstanceGroupSpecification``), read at run time, as
  ``training_plan_arn_problem`` does: the ImageId pattern, the cron's length, the batch and wait limits,
  the rollback alarms;
- CloudFormation's registry schema for ``AWS::SageMaker::Cluster``, which cfn-lint ships: the cron
  pattern (botocore gives only its length) and the two patching strategies it accepts
  (tests/rules/test_hyperpod_updates.py compares both with the schema);
- cfn-lint's check of the AMI id format that the schema gives ImageId (``AMI_ID_FORMAT``);
- the SageMaker API reference, ``ClusterInstanceGroupSpecification.ImageId``: a custom AMI must be
  unencrypted, owned by the account that creates the cluster, and have no volume but its primary
  snapshot. None of the three can be seen without AWS, so they are documented (docs/capacity.md).
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterator

from pydantic.dataclasses import dataclass as pydantic_dataclass

from moe_cdk.core.loader import SECTION
from moe_cdk.core.problems import Problem, problem

# CloudFormation registry schema, AWS::SageMaker::Cluster, ScheduledUpdateConfig.ScheduleExpression:
# cron(minute hour day-of-month month day-of-week year); AWS's pages name no time zone.
CRON = re.compile(
    r"cron\((?:[0-5][0-9]|[0-9]|) (?:[01][0-9]|2[0-3]|[0-9]) (?:[1-9]|0[1-9]|[12][0-9]|3[01]|\?) "
    r"(?:[1-9]|0[1-9]|1[0-2]|\*|\*/(?:[1-9]|1[0-2])|) "
    r"(?:MON|TUE|WED|THU|FRI|SAT|SUN|[1-7]|\?|L|(?:[1-7]#[1-5])|(?:[1-7]L)) (?:20[2-9][0-9]|\*|)\)"
)


@functools.cache
def _api_shape(*path: str):
    """A member shape of botocore's ``ClusterInstanceGroupSpecification``, down ``path``."""
    import botocore.session

    shape = botocore.session.get_session().get_service_model("sagemaker").shape_for("ClusterInstanceGroupSpecification")
    for name in path:
        shape = shape.members[name] if shape.type_name == "structure" else shape.member.members[name]
    return shape


def _range(*path: str) -> tuple[int, int | None]:
    metadata = _api_shape(*path).metadata
    return metadata.get("min", 0), metadata.get("max")


class BatchUnit(enum.Enum):
    """How a rolling update's batch is counted (``CapacitySizeConfig.Type``)."""

    INSTANCES = "instances"
    """``INSTANCE_COUNT``: that many nodes at a time."""
    PERCENT = "percent"
    """``CAPACITY_PERCENTAGE``: that share of the group's nodes at a time."""

    @property
    def api_value(self) -> str:
        return {BatchUnit.INSTANCES: "INSTANCE_COUNT", BatchUnit.PERCENT: "CAPACITY_PERCENTAGE"}[self]


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class RollingUpdate:
    """How HyperPod takes a group's nodes through an AMI update (``DeploymentConfig``)."""

    batch_size: int = 1
    """Nodes (or percent of the group, with batch_unit percent) updated at a time, at least 1. Default: 1."""
    batch_unit: BatchUnit = BatchUnit.INSTANCES
    """instances or percent. Default: instances."""
    wait_between_batches_s: int = 0
    """Seconds HyperPod waits between batches, 0 to 3600. Default: 0."""
    rollback_alarms: tuple[str, ...] = ()
    """CloudWatch alarm names; one in ALARM during the update rolls it back (1 to 10 names). Default: none."""

    def problems(self) -> Iterator[Problem]:
        low, _ = _range("ScheduledUpdateConfig", "DeploymentConfig", "RollingUpdatePolicy", "MaximumBatchSize", "Value")
        high = 100 if self.batch_unit is BatchUnit.PERCENT else None
        if self.batch_size < low or (high is not None and self.batch_size > high):
            allowed = f"{low} to {high} percent" if high else f"{low} or more nodes"
            yield problem("out of range", got=self.batch_size, allowed=allowed).at("batch_size")
        low, high = _range("ScheduledUpdateConfig", "DeploymentConfig", "WaitIntervalInSeconds")
        if not low <= self.wait_between_batches_s <= high:
            yield problem("out of range", got=self.wait_between_batches_s, allowed=f"{low} to {high} seconds").at(
                "wait_between_batches_s"
            )
        if self.rollback_alarms:
            low, high = _range("ScheduledUpdateConfig", "DeploymentConfig", "AutoRollbackConfiguration")
            if not low <= len(self.rollback_alarms) <= high:
                yield problem(
                    "too many alarms", got=len(self.rollback_alarms), allowed=f"{low} to {high} alarm names"
                ).at("rollback_alarms")
            rule = _api_shape("ScheduledUpdateConfig", "DeploymentConfig", "AutoRollbackConfiguration", "AlarmName")
            for j, name in enumerate(self.rollback_alarms):
                low, high = rule.metadata["min"], rule.metadata["max"]
                if not (low <= len(name) <= high and re.fullmatch(rule.metadata["pattern"], name)):
                    yield problem(
                        "not a CloudWatch alarm name", got=name, allowed=f"{low} to {high} characters, not blank"
                    ).at(f"rollback_alarms[{j}]")

    def batch_problem(self, instance_count: int) -> Problem | None:
        """A batch of more nodes than the group has: no update would ever take a second batch."""
        if self.batch_unit is BatchUnit.INSTANCES and self.batch_size > instance_count:
            return problem(
                "more nodes than the group has",
                got=self.batch_size,
                allowed=f"1 to {instance_count}, the group's instance_count, or batch_unit percent",
            ).at("batch_size")
        return None

    def to_api(self) -> dict:
        """The ``DeploymentConfig`` of CreateCluster (and CloudFormation), as plain JSON."""
        config = {
            "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": self.batch_unit.api_value, "Value": self.batch_size}},
            "WaitIntervalInSeconds": self.wait_between_batches_s,
        }
        if self.rollback_alarms:
            config["AutoRollbackConfiguration"] = [{"AlarmName": name} for name in self.rollback_alarms]
        return config


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class ScheduledUpdate:
    """A recurring AMI update of a group (``ScheduledUpdateConfig``): HyperPod moves its nodes to the newest
    HyperPod AMI at each time the schedule names, batch by batch."""

    schedule: str
    """When, as `cron(minute hour day-of-month month day-of-week year)`, e.g. `cron(0 3 ? * SUN *)` (Sundays at
    03:00; AWS's pages name no time zone). Required."""
    rolling: RollingUpdate | None = None
    """EKS only: batches and rollback alarms of the update. Default: HyperPod's."""

    def problems(self) -> Iterator[Problem]:
        low, high = _range("ScheduledUpdateConfig", "ScheduleExpression")
        if not (low <= len(self.schedule) <= high and CRON.fullmatch(self.schedule)):
            yield problem(
                "not a HyperPod update schedule",
                got=self.schedule,
                allowed="cron(minute hour day-of-month month day-of-week year), e.g. cron(0 3 ? * SUN *)",
            ).at("schedule")

    def to_api(self) -> dict:
        config = {"ScheduleExpression": self.schedule}
        if self.rolling is not None:
            config["DeploymentConfig"] = self.rolling.to_api()
        return config


class PatchingStrategy(enum.Enum):
    """When HyperPod applies a security patch to a group (``AutoPatchConfig.PatchingStrategy``). The API
    also has DrainFirst (EKS, evicts running pods); CloudFormation's schema does not accept it."""

    WHEN_IDLE = "when-idle"
    """``WhenIdle``: every node is cordoned and patched as soon as it has no job."""
    WHEN_ALL_IDLE = "when-all-idle"
    """``WhenAllIdle``: every node is cordoned, and the group is patched once all of them are idle."""

    @property
    def api_value(self) -> str:
        return {PatchingStrategy.WHEN_IDLE: "WhenIdle", PatchingStrategy.WHEN_ALL_IDLE: "WhenAllIdle"}[self]


@pydantic_dataclass(frozen=True, kw_only=True, config=SECTION)
class AutoPatch:
    """HyperPod's automatic security patching of a group's AMI (``AutoPatchConfig``)."""

    strategy: PatchingStrategy
    """when-idle or when-all-idle. Required."""
    rolling: RollingUpdate | None = None
    """EKS only: batches and rollback alarms of the patch. Default: HyperPod's."""

    def to_api(self) -> dict:
        config = {"PatchingStrategy": self.strategy.api_value}
        if self.rolling is not None:
            config["DeploymentConfig"] = self.rolling.to_api()
        return config


# CloudFormation's registry schema gives ImageId the format AWS::EC2::Image.Id, which cfn-lint checks with
# this pattern (cfnlint/rules/formats/ImageId.py, E1152): an AMI id of 8 or 17 characters. It refuses
# the API's other value, `default` (HyperPod's latest AMI), which is what a group without ImageId gets.
AMI_ID_FORMAT = r"^ami-([0-9a-z]{8}|[0-9a-z]{17})$"


def image_id_problem(image_id: str) -> Problem | None:
    """Why CreateCluster (botocore's pattern and length) or CloudFormation (the AMI id format) would
    reject ``image_id``, or None."""
    rule = _api_shape("ImageId").metadata
    api = rule["min"] <= len(image_id) <= rule["max"] and re.fullmatch(rule["pattern"], image_id)
    if api and re.match(AMI_ID_FORMAT, image_id):
        return None
    return problem(
        "not an AMI id",
        got=image_id,
        allowed="ami- and 8 or 17 lowercase hexadecimal digits; leave image_id unset for HyperPod's latest AMI",
    )


def update_problems(
    *, image_id: str | None, scheduled_update: ScheduledUpdate | None, auto_patch: AutoPatch | None, instance_count: int
) -> list[Problem]:
    """Problems with one group's AMI and update settings, keyed below the group. The sections' own
    checks run here too, for construct props; a configuration file's loader has run them already, and
    reaches this only where they found nothing."""
    found = []
    if image_id is not None and (p := image_id_problem(image_id)):
        found.append(p.at("image_id"))
    if scheduled_update is not None:
        found += [p.at("scheduled_update") for p in scheduled_update.problems()]
    for key, section in (("scheduled_update", scheduled_update), ("auto_patch", auto_patch)):
        if section is not None and (rolling := section.rolling) is not None:
            batch = rolling.batch_problem(instance_count)
            found += [p.at(f"{key}.rolling") for p in [*rolling.problems(), *([batch] if batch else [])]]
    return found
