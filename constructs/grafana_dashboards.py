"""Dashboards and their Prometheus data source, put into an Amazon Managed Grafana workspace at deploy time.

Grafana keeps dashboards and data sources in its own database, behind its HTTP API; CloudFormation
has no resource for either. This construct is one ``Custom::GrafanaDashboards`` resource backed by
one Lambda function (constructs/grafana_dashboards_handler/index.py, whose docstring lists the calls).
On Create and Update the function takes a short-lived token from an AMG service account, upserts
a Prometheus data source for the AMP workspace (fixed uid ``moe-cdk-amp``, SigV4 through the
Grafana workspace's IAM role), finds or makes the folder, and posts every dashboard with
``overwrite: true``, its ``${datasource}`` variable defaulting to that data source. On Delete it
deletes the dashboards and the data source it made, then the service account; a workspace already
gone is success.

Choices, and why:

* **A plain ``CustomResource`` over one ``aws_lambda.Function``, not ``custom_resources.Provider``.**
  The handler answers CloudFormation itself (a PUT to the presigned response URL) and catches every
  failure, which is what the Provider framework would add, at the price of a second (Node.js)
  function, its role and their cdk-nag acknowledgments. ``service_timeout`` bounds how long a stack
  waits should the function die before answering.
* **The dashboards travel in the resource's properties**, compact JSON per file, not as an S3
  asset: a changed dashboard changes the template, so ``moe-cdk diff`` and ``cdk diff`` show it and
  CloudFormation sends an Update without an asset hash in between; and the function needs no S3 or
  KMS permissions on the bootstrap bucket. The cost is a size limit, checked at synth: an Update
  event carries the new and the old properties, and CloudFormation delivers the event to Lambda
  asynchronously, whose payload may be 1 MB (Lambda API reference, Invoke); the template itself is
  at most 1 MB (CloudFormation User Guide, "CloudFormation quotas"). ``MAX_DASHBOARDS_BYTES`` keeps
  both the event and the template well inside.
* **The physical id is one per Grafana workspace**, so an update keeps the resource, and a new
  workspace replaces it (CloudFormation then deletes the old one against the old workspace).

The workspace must run Grafana 9 or later (service accounts) and below 12 (SigV4 in the core
Prometheus plugin); see ``GrafanaDashboardsProps.workspace_id``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_iam as iam, aws_lambda as lambda_, aws_logs as logs
from constructs import Construct

from moe_cdk.constructs.training_network import RETENTION_BY_DAYS
from moe_cdk.constructs.validation import Problem, is_unresolved, problem, raise_if_any
from moe_cdk.rules.logs import retention_problem

HANDLER_DIRECTORY = Path(__file__).resolve().parent / "grafana_dashboards_handler"

MAX_DASHBOARDS_BYTES = 256 * 1024
"""The dashboards' compact JSON, all together. Twice this (an Update's new and old properties) is about half of
Lambda's 1 MB asynchronous payload; once is about a quarter of CloudFormation's 1 MB template."""

# Grafana "Dashboard HTTP API": a dashboard's uid is at most 40 characters. A folder's uid is
# kept to the same length and to letters, digits, '-' and '_', which every Grafana version takes
# in a uid and which need no escaping in the API's paths.
MAX_UID_CHARS = 40
FOLDER_UID = re.compile(r"[A-Za-z0-9_-]{1,40}")

# A workspace id is g- and ten hex digits (the WorkspaceId pattern of botocore's grafana service model).
WORKSPACE_ID = re.compile(r"g-[0-9a-f]{10}")

# Long enough for the function's calls (a dozen, 10 s timeout each) with room to spare.
HANDLER_TIMEOUT = cdk.Duration.minutes(3)
# How long CloudFormation waits for an answer: long enough for the function's first try and the two
# retries Lambda makes of an asynchronous invocation that died without answering (3 x 3 minutes, and
# the minute or two Lambda waits before each retry).
SERVICE_TIMEOUT = cdk.Duration.minutes(15)

SERVICE_ACCOUNT_ACTIONS = [
    "grafana:ListWorkspaceServiceAccounts",
    "grafana:CreateWorkspaceServiceAccount",
    "grafana:DeleteWorkspaceServiceAccount",
    "grafana:CreateWorkspaceServiceAccountToken",
    "grafana:DeleteWorkspaceServiceAccountToken",
]


@dataclass(frozen=True, kw_only=True)
class GrafanaDashboardsProps:
    workspace_id: str
    """The Amazon Managed Grafana workspace (``grafana.CfnWorkspace.attr_id``). It must run Grafana 9 or later,
    which service accounts need, and before 12, whose core Prometheus plugin has no SigV4 in AMG: set
    ``grafana_version="10.4"``. Its IAM role must be allowed to query the AMP workspace. Required."""
    workspace_endpoint: str
    """The workspace's host name, without a scheme (``grafana.CfnWorkspace.attr_endpoint``). Required."""
    prometheus_endpoint: str
    """The AMP workspace's query endpoint, ``https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/``
    (``aps.CfnWorkspace.attr_prometheus_endpoint``). Required."""
    prometheus_region: str
    """The AMP workspace's region, which SigV4 signs for. Required."""
    dashboards: Mapping[str, str]
    """File name -> the dashboard's JSON text, as Grafana exports it: an object with a ``uid`` (at most 40
    characters, distinct across dashboards), a ``title``, and a ``datasource`` template variable of type
    ``datasource`` for its panels, which is set to the provisioned data source. Required."""
    folder: str = "moe-cdk"
    """Uid and title of the Grafana folder the dashboards go into; made when missing, kept on Delete. Default:
    moe-cdk."""
    log_retention_days: int = 365
    """Days to keep the function's logs, a CloudWatch Logs retention value. Default: 365."""


class GrafanaDashboards(Construct):
    """Dashboards, their folder and an AMP data source in a Grafana workspace, kept in step with the stack.

    ``data_source_uid``, ``folder_uid`` and ``dashboard_uids`` say where things are once deployed;
    ``function`` is the Lambda that does the work.
    """

    def __init__(self, scope: Construct, id: str, props: GrafanaDashboardsProps) -> None:
        super().__init__(scope, id)
        raise_if_any("GrafanaDashboards", self._problems(props))
        self.props = props
        stack = cdk.Stack.of(self)

        compact = {name: _compact(text) for name, text in props.dashboards.items()}
        self.dashboard_uids = sorted(json.loads(text)["uid"] for text in compact.values() if not is_unresolved(text))
        self.folder_uid = props.folder
        self.data_source_uid = "moe-cdk-amp"  # the handler's DATA_SOURCE_UID

        self.log_group = logs.LogGroup(self, "Logs", retention=RETENTION_BY_DAYS[props.log_retention_days])
        # A role of our own instead of the default's AWSLambdaBasicExecutionRole, whose logs
        # permissions cover every log group in the account.
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="moe-cdk: provisions Grafana dashboards into one Amazon Managed Grafana workspace",
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[self.log_group.log_group_arn]
            )
        )
        # Amazon Managed Grafana service authorization reference: the service-account actions
        # take the workspace resource, arn:<partition>:grafana:<region>:<account>:/workspaces/<id>.
        workspace_arn = stack.format_arn(
            service="grafana",
            resource="/workspaces",
            resource_name=props.workspace_id,
            arn_format=cdk.ArnFormat.SLASH_RESOURCE_NAME,
        )
        self.role.add_to_policy(iam.PolicyStatement(actions=SERVICE_ACCOUNT_ACTIONS, resources=[workspace_arn]))

        self.function = lambda_.Function(
            self,
            "Handler",
            # The newest Python runtime aws-cdk-lib knows (cdk-nag AwsSolutions-L1); the handler
            # itself needs 3.12 or later.
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            handler="index.handler",
            code=lambda_.Code.from_asset(str(HANDLER_DIRECTORY), exclude=["__pycache__", "*.pyc"]),
            timeout=HANDLER_TIMEOUT,
            role=self.role,
            log_group=self.log_group,
            description="moe-cdk: Grafana dashboards and data source for Custom::GrafanaDashboards",
        )

        self._resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=self.function.function_arn,
            resource_type="Custom::GrafanaDashboards",
            service_timeout=SERVICE_TIMEOUT,
            properties={
                "GrafanaUrl": f"https://{props.workspace_endpoint}",
                "WorkspaceId": props.workspace_id,
                "PrometheusUrl": props.prometheus_endpoint,
                "PrometheusRegion": props.prometheus_region,
                "Folder": props.folder,
                "Dashboards": compact,
            },
        )

    @staticmethod
    def _problems(props: GrafanaDashboardsProps) -> list[Problem]:
        found = []
        if not is_unresolved(props.workspace_id) and not WORKSPACE_ID.fullmatch(props.workspace_id):
            found.append(
                problem("not a Grafana workspace id", got=props.workspace_id, allowed="g- and 10 hex digits").at(
                    "workspace_id"
                )
            )
        if not is_unresolved(props.workspace_endpoint) and "://" in props.workspace_endpoint:
            found.append(
                problem(
                    "is a host name, without a scheme",
                    got=props.workspace_endpoint,
                    allowed="e.g. g-1.grafana-workspace.us-east-2.amazonaws.com",
                ).at("workspace_endpoint")
            )
        if not is_unresolved(props.prometheus_endpoint) and not props.prometheus_endpoint.startswith("https://"):
            found.append(
                problem(
                    "not an https URL", got=props.prometheus_endpoint, allowed="the AMP workspace's query endpoint"
                ).at("prometheus_endpoint")
            )
        if not is_unresolved(props.folder) and not FOLDER_UID.fullmatch(props.folder):
            found.append(
                problem("not a Grafana folder uid", got=props.folder, allowed="1 to 40 letters, digits, '-' or '_'").at(
                    "folder"
                )
            )
        if p := retention_problem(props.log_retention_days):
            found.append(p.at("log_retention_days"))
        found += _dashboard_problems(props.dashboards)
        return found


def _compact(text: str) -> str:
    """The dashboard's JSON without whitespace (what the resource carries); tokens pass as they are."""
    return text if is_unresolved(text) else json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)


def _dashboard_problems(dashboards: Mapping[str, str]) -> list[Problem]:
    if not dashboards:
        return [problem("needs at least one dashboard", got={}, allowed="file name -> dashboard JSON").at("dashboards")]
    found: list[Problem] = []
    uids: dict[str, str] = {}
    total_bytes = 0
    for name, text in dashboards.items():
        key = f"dashboards[{name!r}]"
        if is_unresolved(text):
            continue
        try:
            dashboard = json.loads(text)
        except ValueError as error:
            found.append(problem("not JSON", got=str(error), allowed="a Grafana dashboard's JSON").at(key))
            continue
        if not isinstance(dashboard, dict):
            found.append(problem("not a JSON object", got=type(dashboard).__name__, allowed="a dashboard").at(key))
            continue
        total_bytes += len(_compact(text).encode())
        for field in ("uid", "title"):
            if not isinstance(dashboard.get(field), str) or not dashboard[field].strip():
                found.append(problem(f"has no {field}", got=dashboard.get(field), allowed="a non-empty string").at(key))
        uid = dashboard.get("uid")
        if isinstance(uid, str) and uid:
            if len(uid) > MAX_UID_CHARS:
                found.append(problem("uid too long", got=uid, allowed=f"at most {MAX_UID_CHARS} characters").at(key))
            if uid in uids:
                found.append(
                    problem("uid already used by " + repr(uids[uid]), got=uid, allowed="distinct uids").at(key)
                )
            uids.setdefault(uid, name)
        variables = (
            dashboard.get("templating", {}).get("list", []) if isinstance(dashboard.get("templating"), dict) else []
        )
        if not any(
            v.get("name") == "datasource" and v.get("type") == "datasource" for v in variables if isinstance(v, dict)
        ):
            found.append(
                problem(
                    "has no `datasource` template variable of type datasource",
                    got=sorted(v.get("name") for v in variables if isinstance(v, dict)),
                    allowed="a datasource variable, which is set to the provisioned data source",
                ).at(key)
            )
    if total_bytes > MAX_DASHBOARDS_BYTES:
        found.append(
            problem(
                "too big for a custom resource's properties (compact JSON, all dashboards)",
                got=f"{total_bytes} bytes",
                allowed=f"at most {MAX_DASHBOARDS_BYTES} bytes",
            ).at("dashboards")
        )
    return found
