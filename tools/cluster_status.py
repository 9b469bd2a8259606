"""``moe-cdk status``: a cluster's state, each node's, and (HyperPod) why a node's lifecycle failed.

Read with the caller's boto3 clients (SageMaker ``DescribeCluster`` and ``ListClusterNodes``, CloudWatch
Logs ``FilterLogEvents``); nothing is changed. HyperPod sends each node's lifecycle output to the log
group ``/aws/sagemaker/Clusters/<cluster name>/<cluster id>``, stream
``LifecycleConfig/<instance group>/<instance id>`` (the cluster id is the last part of its ARN). The
lifecycle scripts write one step record per step there (lifecycle_scripts/lib.sh):
``moe-cdk-step {"node":..., "group":..., "step":..., "outcome":"ok"|"failed", "seconds":..., "hint":...}``;
for a node whose status is ``Failure`` this finds its first failed step and the hint.

A ParallelCluster cluster is read as ``pcluster describe-cluster`` reads it (aws-parallelcluster 3.16.1,
pcluster/models/cluster.py ``describe_instances``): its CloudFormation stack, named after the cluster, and its EC2
instances, tagged ``parallelcluster:cluster-name`` with the cluster's name, ``parallelcluster:node-type`` (HeadNode,
Compute, LoginNode), and the queue's or the login pool's name. Its nodes' logs are in the log group its stack names in
the parameter ``ClusterCWLogGroup`` (3.16.1, pcluster/models/cluster_resources.py; ``/aws/parallelcluster/<name>-
<created>``), one stream per node and log file (``<host>.<instance id>.<log>``). The custom actions' output, and so
the step records, is in one of those files; every stream is searched, and a record is the node's whose instance id it
names. ParallelCluster has no node status of its own to say a bootstrap failed: a node with a failed step is shown in
``Failure``, and the failures of nodes ParallelCluster has since replaced are listed apart.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from botocore.exceptions import ClientError

from moe_cdk.schema.config import Config

RECORD_MARK = "moe-cdk-step"
LIFECYCLE_STREAM_PREFIX = "LifecycleConfig/"
# CloudWatch Logs filter pattern syntax: quoted terms, all of which must appear in the event.
FAILED_RECORDS = f'"{RECORD_MARK}" "\\"outcome\\":\\"failed\\""'
# C0 and C1 control characters (DEL included): the ones that break a line, as one space; every other one
# (ESC, CSI U+009B, BEL, ...) dropped, so no escape sequence in a string AWS returns reaches a terminal.
_LINE_BREAKS = re.compile(r"[\t\n\v\f\r\x1c-\x1e\x85]+")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` (read from an AWS API: a lifecycle hint, a HyperPod message, ...) fit for one line of a
    terminal: line breaks become a space, every other control character is removed."""
    return _CONTROLS.sub("", _LINE_BREAKS.sub(" ", text))


@dataclass(frozen=True)
class StepRecord:
    """One lifecycle step record, as lib.sh writes it."""

    node: str
    group: str
    step: str
    outcome: str
    seconds: int
    hint: str = ""


@dataclass(frozen=True)
class NodeStatus:
    group: str
    instance_id: str
    instance_type: str
    status: str
    """``InstanceStatus.Status``: Running, Pending, Failure, ..."""
    message: str = ""
    """``InstanceStatus.Message``, HyperPod's own words."""
    failed_step: StepRecord | None = None
    """The first failed lifecycle step in the node's log stream, for a node in Failure."""


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    arn: str
    status: str
    failure_message: str
    log_group: str
    nodes: list[NodeStatus] = field(default_factory=list)
    log_note: str = ""
    """Why no step could be read (the log group does not exist yet), or empty."""
    log_streams: str = f"{LIFECYCLE_STREAM_PREFIX}<group>/<instance>"
    """The log group's streams of the nodes' lifecycle output."""
    gone: list[StepRecord] = field(default_factory=list)
    """ParallelCluster: the failed steps of nodes that are no longer there (replaced after their bootstrap failed)."""

    @property
    def healthy(self) -> bool:
        return self.status in SERVING and all(n.status == "Running" for n in self.nodes)


SERVING = ("InService", "CREATE_COMPLETE", "UPDATE_COMPLETE")
"""The cluster states in which it runs jobs: HyperPod's, and a ParallelCluster cluster's stack's."""


def parse_record(message: str) -> StepRecord | None:
    """The step record in one log line, or None when the line holds none (or a damaged one)."""
    _, mark, payload = message.partition(f" {RECORD_MARK} ")
    if not mark:
        return None
    try:
        data = json.loads(payload)
        return StepRecord(
            node=printable(str(data["node"])),
            group=printable(str(data["group"])),
            step=printable(str(data["step"])),
            outcome=printable(str(data["outcome"])),
            seconds=int(data["seconds"]),
            hint=printable(str(data.get("hint", ""))),
        )
    except (ValueError, KeyError, TypeError):
        return None


def first_failures(logs, log_group: str, stream_prefix: str | None = LIFECYCLE_STREAM_PREFIX) -> dict[str, StepRecord]:
    """Stream name -> the earliest failed step record in it, across every stream of the group whose name starts with
    ``stream_prefix`` (None: every stream). Raises ``ClientError`` ``ResourceNotFoundException`` when the group does
    not exist."""
    found: dict[str, tuple[int, StepRecord]] = {}
    prefix = {} if stream_prefix is None else {"logStreamNamePrefix": stream_prefix}
    pages = logs.get_paginator("filter_log_events").paginate(
        logGroupName=log_group, filterPattern=FAILED_RECORDS, **prefix
    )
    for page in pages:
        for event in page.get("events", []):
            record = parse_record(event.get("message", ""))
            if record is None or record.outcome != "failed":
                continue
            stream, at = event["logStreamName"], event.get("timestamp", 0)
            if stream not in found or at < found[stream][0]:
                found[stream] = (at, record)
    return {stream: record for stream, (_, record) in found.items()}


def cluster_status(config: Config, sagemaker, logs) -> ClusterStatus:
    """The cluster of ``config`` (a HyperPod configuration: its name is the cluster's) as the APIs see it.
    Every string read from AWS is kept ``printable``."""
    described = sagemaker.describe_cluster(ClusterName=config.name)
    arn = printable(described["ClusterArn"])
    log_group = f"/aws/sagemaker/Clusters/{config.name}/{arn.rsplit('/', 1)[-1]}"
    summaries = [
        summary
        for page in sagemaker.get_paginator("list_cluster_nodes").paginate(ClusterName=config.name)
        for summary in page.get("ClusterNodeSummaries", [])
    ]
    stream_failures: dict[str, StepRecord] = {}
    note = ""
    if any(s["InstanceStatus"]["Status"] == "Failure" for s in summaries):
        try:
            stream_failures = first_failures(logs, log_group)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            note = f"log group {log_group} does not exist yet: no node has run its lifecycle scripts so far"
    nodes = [
        NodeStatus(
            group=printable(s["InstanceGroupName"]),
            instance_id=printable(s["InstanceId"]),
            instance_type=printable(s.get("InstanceType", "")),
            status=printable(s["InstanceStatus"]["Status"]),
            message=printable(s["InstanceStatus"].get("Message", "")),
            failed_step=stream_failures.get(f"{LIFECYCLE_STREAM_PREFIX}{s['InstanceGroupName']}/{s['InstanceId']}")
            if s["InstanceStatus"]["Status"] == "Failure"
            else None,
        )
        for s in summaries
    ]
    return ClusterStatus(
        name=printable(described["ClusterName"]),
        arn=arn,
        status=printable(described["ClusterStatus"]),
        failure_message=printable(described.get("FailureMessage", "")),
        log_group=log_group,
        nodes=sorted(nodes, key=lambda n: (n.group, n.instance_id)),
        log_note=note,
    )


PCLUSTER_TAG = "parallelcluster:"
PCLUSTER_LOG_GROUP_PARAMETER = "ClusterCWLogGroup"
# A ParallelCluster instance's state as the node's status, in the words HyperPod uses for its nodes.
_EC2_STATES = {"pending": "Pending", "running": "Running", "stopping": "Stopping", "stopped": "Stopped"}


def parallelcluster_status(config: Config, cloudformation, ec2, logs) -> ClusterStatus:
    """The ParallelCluster cluster of ``config`` (its name is the cluster's, and its stack's): the stack's status,
    and one node per instance, in the configuration's instance group (the head node's is the controller group), with
    its first failed lifecycle step."""
    (stack,) = cloudformation.describe_stacks(StackName=config.name)["Stacks"]
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}
    log_group, note, failures = printable(parameters.get(PCLUSTER_LOG_GROUP_PARAMETER, "")), "", {}
    if not log_group:
        note = f"the cluster's stack names no log group ({PCLUSTER_LOG_GROUP_PARAMETER}): its CloudWatch logs are off"
    else:
        try:
            failures = {r.node: r for r in first_failures(logs, log_group, stream_prefix=None).values()}
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            note = f"log group {log_group} does not exist yet: no node has sent its logs so far"
    groups = {g.role.value: g.name for g in config.cluster.instance_groups}
    filters = [
        {"Name": f"tag:{PCLUSTER_TAG}cluster-name", "Values": [config.name]},
        {"Name": "instance-state-name", "Values": list(_EC2_STATES)},
    ]
    nodes = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for instance in (i for reservation in page["Reservations"] for i in reservation["Instances"]):
            tags = {t["Key"].removeprefix(PCLUSTER_TAG): t["Value"] for t in instance.get("Tags", [])}
            group = {
                "HeadNode": groups.get("controller", "head node"),
                "LoginNode": tags.get("login-nodes-pool-name", "login"),
            }.get(tags.get("node-type", ""), tags.get("queue-name", "?"))
            state, instance_id = instance["State"]["Name"], printable(instance["InstanceId"])
            failed = failures.pop(instance_id, None)
            nodes.append(
                NodeStatus(
                    group=printable(group),
                    instance_id=instance_id,
                    instance_type=printable(instance.get("InstanceType", "")),
                    status="Failure" if failed else _EC2_STATES.get(state, printable(state)),
                    failed_step=failed,
                )
            )
    return ClusterStatus(
        name=config.name,
        arn=printable(stack["StackId"]),
        status=printable(stack["StackStatus"]),
        failure_message=printable(stack.get("StackStatusReason", "")),
        log_group=log_group or "(none)",
        log_streams="<host>.<instance>.<log> (ParallelCluster's Monitoring.Logs)",
        nodes=sorted(nodes, key=lambda n: (n.group, n.instance_id)),
        log_note=note,
        gone=sorted(failures.values(), key=lambda r: (r.group, r.node)),
    )


def render_status(status: ClusterStatus) -> str:
    """The cluster line, then one line per node; a failed node's first failed step and hint under it."""
    lines = [
        f"cluster {status.name}: {status.status}" + (f" ({status.failure_message})" if status.failure_message else "")
    ]
    lines.append(f"  lifecycle logs: CloudWatch Logs {status.log_group}, streams {status.log_streams}")
    if not status.nodes:
        lines.append("  no nodes")
    width = max([len(n.group) for n in status.nodes] + [5])
    for node in status.nodes:
        lines.append(f"  {node.group:<{width}}  {node.instance_id:<19}  {node.instance_type:<17}  {node.status}")
        if node.status != "Failure":
            continue
        if node.failed_step is not None:
            step = node.failed_step
            lines.append(f"      step {step.step} failed after {step.seconds}s: {step.hint}")
        elif status.log_note:
            lines.append(f"      {status.log_note}")
        else:
            lines.append("      no failed moe-cdk step in its lifecycle log: HyperPod failed it outside the scripts")
        if node.message:
            lines.append(f"      HyperPod: {node.message}")
    for step in status.gone:
        lines.append(f"  gone: {step.node} of {step.group}, step {step.step} failed after {step.seconds}s: {step.hint}")
    if status.log_note and not any(n.status == "Failure" for n in status.nodes):
        lines.append(f"  {status.log_note}")
    return "\n".join(lines) + "\n"


def to_json(status: ClusterStatus) -> dict:
    return {**asdict(status), "healthy": status.healthy}
