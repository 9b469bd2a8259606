"""The Lambda behind ``Custom::GrafanaDashboards`` (constructs/grafana_dashboards.py): it puts a
Prometheus data source, a folder and dashboards into an Amazon Managed Grafana workspace, and takes
them out again when the resource leaves the stack.

It runs on the Lambda Python runtime (3.12 or later) with the standard library and the boto3 the
runtime ships; it is an asset of its own and imports nothing of moe_cdk.

One event, from CloudFormation, asynchronously; the answer is a PUT of the response object to the
presigned ``ResponseURL`` (CloudFormation User Guide, "CloudFormation custom resource request and
response reference"; the body is at most 4096 bytes). Every failure is caught and answered FAILED
with a one-line reason (the Grafana call, its HTTP status and Grafana's message), so a stack never
waits out the service timeout and never shows a traceback.

Grafana's HTTP API takes a token, not AWS credentials. The token comes from an AMG service account
(Amazon Managed Grafana API reference, CreateWorkspaceServiceAccount and
CreateWorkspaceServiceAccountToken; service accounts need a workspace of Grafana 9 or later): the
account ``moe-cdk-dashboards`` is made once, with the Admin role (Grafana's Editor role may not
manage data sources), and found again by name on later events; each event makes a token that lives
``TOKEN_SECONDS_TO_LIVE`` seconds and deletes it in a ``finally``.

The Grafana calls are the ones Grafana 10.4's HTTP API documents ("Data source HTTP API",
"Folder HTTP API", "Dashboard HTTP API"):

* data source: ``GET /api/datasources/uid/:uid``, then ``PUT`` to the same path when it exists or
  ``POST /api/datasources`` when Grafana answers 404; the uid is fixed, so a re-run updates it;
* folder: ``GET /api/folders/:uid``, then ``POST /api/folders`` on a 404;
* dashboard: ``POST /api/dashboards/db`` with ``overwrite: true`` and ``folderUid``; the dashboard's
  ``id`` is sent as null so that its ``uid`` alone says which dashboard is replaced;
* delete: ``DELETE /api/dashboards/uid/:uid`` and ``DELETE /api/datasources/uid/:uid``; a 404 means
  already gone.

The data source is Grafana's core Prometheus plugin with SigV4 signing through the workspace's IAM
role. The ``jsonData`` keys are the Prometheus data source's SigV4 settings (Grafana documentation,
"Connect to Amazon Managed Service for Prometheus"; Amazon Managed Grafana User Guide, "Manually
adding the Prometheus data source"). ``sigV4AuthType: ec2_iam_role`` is the credential chain of the
Grafana server itself, which in AMG is the workspace's IAM role (grafana/grafana-aws-sdk,
pkg/awsds/settings.go at bffb8adb3b848a9fe6ea3a79cb8f1697b8003856, the auth type names). AMG's
version 12 removed SigV4 from the core Prometheus plugin (same User Guide page), so this handler is
for workspaces of Grafana 9 to 11.

The folder is left in place on Delete: Grafana deletes a folder together with every dashboard in it,
and people save their own dashboards there.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import boto3
from botocore.exceptions import ClientError

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)

HTTP_TIMEOUT_S = 10
"""Seconds any one HTTP call (Grafana, or the response to CloudFormation) may take."""
TOKEN_SECONDS_TO_LIVE = 600
"""The Grafana token outlives the function's 3-minute timeout, and no more than that by much."""
SERVICE_ACCOUNT_NAME = "moe-cdk-dashboards"
DATA_SOURCE_UID = "moe-cdk-amp"
DATA_SOURCE_NAME = "moe-cdk: Amazon Managed Prometheus"
DATASOURCE_VARIABLE = "datasource"
MAX_REASON_CHARS = 1500
"""The reason is cut here so that the whole response stays under CloudFormation's 4096 bytes."""


class GrafanaError(Exception):
    """A Grafana HTTP API call that did not succeed: which call, the HTTP status, Grafana's message."""

    def __init__(self, method: str, path: str, status: int | None, message: str):
        self.status = status
        answered = f"answered HTTP {status}" if status is not None else "could not be reached"
        super().__init__(f"Grafana {method} {path} {answered}: {message}")


class Grafana:
    """The few calls of Grafana's HTTP API this handler makes, each with a timeout."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = HTTP_TIMEOUT_S):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: dict | None = None, *, missing_ok: bool = False) -> dict | None:
        """The JSON Grafana answers; None for a 404 when ``missing_ok``; GrafanaError for any other failure."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as error:
            if error.code == 404 and missing_ok:
                return None
            message = _grafana_message(error.read().decode(errors="replace"))
            raise GrafanaError(method, path, error.code, message) from None
        except (urllib.error.URLError, TimeoutError, OSError) as error:
            raise GrafanaError(method, path, None, str(getattr(error, "reason", error))) from None
        return json.loads(text) if text.strip() else {}


def _grafana_message(text: str) -> str:
    """Grafana's error bodies are ``{"message": ...}``; anything else is shown as it came, shortened."""
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else text.strip()[:300] or "(empty body)"


def data_source(prometheus_url: str, region: str) -> dict:
    """The Prometheus data source for the AMP workspace: SigV4 through the workspace's IAM role."""
    return {
        "uid": DATA_SOURCE_UID,
        "name": DATA_SOURCE_NAME,
        "type": "prometheus",
        "access": "proxy",
        "url": prometheus_url.rstrip("/"),
        "isDefault": False,
        "jsonData": {
            # AMP's query API takes POST; long PromQL (many label values) does not fit a URL.
            "httpMethod": "POST",
            "sigV4Auth": True,
            "sigV4AuthType": "ec2_iam_role",
            "sigV4Region": region,
        },
    }


def with_default_data_source(dashboard: dict) -> dict:
    """``dashboard`` ready to post: no numeric id, and its ``datasource`` variable set to our data source."""
    dashboard = {**dashboard, "id": None}
    variables = dashboard.get("templating", {}).get("list", [])
    for variable in variables:
        if variable.get("name") == DATASOURCE_VARIABLE and variable.get("type") == "datasource":
            variable["current"] = {"selected": True, "text": DATA_SOURCE_NAME, "value": DATA_SOURCE_UID}
    return dashboard


class ServiceAccount:
    """Our AMG service account on one workspace, and the short-lived tokens made from it."""

    def __init__(self, amg, workspace_id: str):
        self.amg = amg
        self.workspace_id = workspace_id

    def find(self) -> str | None:
        """The id of ``SERVICE_ACCOUNT_NAME`` on the workspace, or None."""
        kwargs: dict[str, Any] = {"workspaceId": self.workspace_id}
        while True:
            page = self.amg.list_workspace_service_accounts(**kwargs)
            for account in page.get("serviceAccounts", []):
                if account["name"] == SERVICE_ACCOUNT_NAME:
                    return account["id"]
            if not page.get("nextToken"):
                return None
            kwargs["nextToken"] = page["nextToken"]

    def find_or_create(self) -> str:
        found = self.find()
        if found is not None:
            return found
        LOG.info("creating service account %s on workspace %s", SERVICE_ACCOUNT_NAME, self.workspace_id)
        try:
            created = self.amg.create_workspace_service_account(
                workspaceId=self.workspace_id, name=SERVICE_ACCOUNT_NAME, grafanaRole="ADMIN"
            )
        except ClientError as error:
            # Another event made it between our list and our create.
            if _code(error) != "ConflictException" or (found := self.find()) is None:
                raise
            return found
        return created["id"]

    def create_token(self, account_id: str, name: str) -> tuple[str, str]:
        """(token id, token key), valid for TOKEN_SECONDS_TO_LIVE seconds."""
        token = self.amg.create_workspace_service_account_token(
            workspaceId=self.workspace_id,
            serviceAccountId=account_id,
            name=name,
            secondsToLive=TOKEN_SECONDS_TO_LIVE,
        )["serviceAccountToken"]
        return token["id"], token["key"]

    def delete_token(self, account_id: str, token_id: str) -> None:
        try:
            self.amg.delete_workspace_service_account_token(
                workspaceId=self.workspace_id, serviceAccountId=account_id, tokenId=token_id
            )
        except ClientError as error:
            # Not worth failing a deployment over: the token expires by itself.
            LOG.warning("could not delete token %s (it expires in %ds): %s", token_id, TOKEN_SECONDS_TO_LIVE, error)

    def delete(self, account_id: str) -> None:
        try:
            self.amg.delete_workspace_service_account(workspaceId=self.workspace_id, serviceAccountId=account_id)
        except ClientError as error:
            if _code(error) != "ResourceNotFoundException":
                raise


def _code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def _quoted(uid: str) -> str:
    """``uid`` as one path segment."""
    return urllib.parse.quote(uid, safe="")


def _dashboards(properties: dict) -> dict[str, dict]:
    """uid -> dashboard, from the ``Dashboards`` property (file name -> JSON text)."""
    parsed = [json.loads(text) for text in (properties.get("Dashboards") or {}).values()]
    return {dashboard["uid"]: dashboard for dashboard in parsed}


def physical_resource_id(properties: dict) -> str:
    """One id per workspace: updates keep it, and a new workspace replaces the resource."""
    return f"moe-cdk-grafana-dashboards:{properties.get('WorkspaceId', 'unknown')}"


def _provision(grafana: Grafana, properties: dict, old_properties: dict | None) -> dict:
    source = data_source(properties["PrometheusUrl"], properties["PrometheusRegion"])
    if grafana.call("GET", f"/api/datasources/uid/{DATA_SOURCE_UID}", missing_ok=True) is None:
        grafana.call("POST", "/api/datasources", source)
    else:
        grafana.call("PUT", f"/api/datasources/uid/{DATA_SOURCE_UID}", source)

    folder = properties["Folder"]
    if grafana.call("GET", f"/api/folders/{_quoted(folder)}", missing_ok=True) is None:
        grafana.call("POST", "/api/folders", {"uid": folder, "title": folder})

    dashboards = _dashboards(properties)
    for uid, dashboard in dashboards.items():
        LOG.info("posting dashboard %s into folder %s", uid, folder)
        grafana.call(
            "POST",
            "/api/dashboards/db",
            {
                "dashboard": with_default_data_source(dashboard),
                "folderUid": folder,
                "overwrite": True,
                "message": "moe-cdk: deployed by CloudFormation",
            },
        )
    # Dashboards this resource made before and no longer lists (same workspace only: a
    # replaced workspace gets its own Delete event).
    if old_properties and old_properties.get("WorkspaceId") == properties["WorkspaceId"]:
        for uid in sorted(_dashboards(old_properties).keys() - dashboards.keys()):
            LOG.info("deleting dashboard %s, no longer in the stack", uid)
            grafana.call("DELETE", f"/api/dashboards/uid/{_quoted(uid)}", missing_ok=True)
    return {"DataSourceUid": DATA_SOURCE_UID, "FolderUid": folder, "DashboardUids": ",".join(sorted(dashboards))}


def _remove(grafana: Grafana, properties: dict) -> None:
    for uid in sorted(_dashboards(properties)):
        LOG.info("deleting dashboard %s", uid)
        grafana.call("DELETE", f"/api/dashboards/uid/{_quoted(uid)}", missing_ok=True)
    grafana.call("DELETE", f"/api/datasources/uid/{DATA_SOURCE_UID}", missing_ok=True)


def _create_or_update(event: dict, amg, timeout_s: float) -> dict:
    properties = event["ResourceProperties"]
    accounts = ServiceAccount(amg, properties["WorkspaceId"])
    account_id = accounts.find_or_create()
    token_id, key = accounts.create_token(account_id, _token_name(event))
    try:
        grafana = Grafana(properties["GrafanaUrl"], key, timeout_s=timeout_s)
        return _provision(grafana, properties, event.get("OldResourceProperties"))
    finally:
        accounts.delete_token(account_id, token_id)


def _delete(event: dict, amg, timeout_s: float) -> None:
    properties = event["ResourceProperties"]
    accounts = ServiceAccount(amg, properties["WorkspaceId"])
    try:
        account_id = accounts.find()
    except ClientError as error:
        if _code(error) == "ResourceNotFoundException":
            LOG.info("workspace %s is gone, and what this resource made with it", properties["WorkspaceId"])
            return
        if _code(error) == "ValidationException":
            # A workspace that cannot list service accounts (Grafana 8) holds none of ours: the
            # Create this Delete rolls back failed before making anything.
            LOG.info("workspace %s has no service accounts: %s", properties["WorkspaceId"], error)
            return
        raise
    if account_id is None:
        LOG.info("no %s service account: nothing was provisioned", SERVICE_ACCOUNT_NAME)
        return
    token_id, key = accounts.create_token(account_id, _token_name(event))
    try:
        _remove(Grafana(properties["GrafanaUrl"], key, timeout_s=timeout_s), properties)
    finally:
        accounts.delete_token(account_id, token_id)
    accounts.delete(account_id)


def _token_name(event: dict) -> str:
    # Unique per event: a token name may be used once per service account.
    return f"moe-cdk-{event['RequestType'].lower()}-{event['RequestId'][:36]}"


def _respond(event: dict, body: dict, timeout_s: float) -> None:
    data = json.dumps(body).encode()
    # The presigned URL is signed without a content type, so none may be sent.
    request = urllib.request.Request(event["ResponseURL"], data=data, method="PUT", headers={"Content-Type": ""})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        LOG.info("CloudFormation response: HTTP %s", response.status)


def handler(event: dict, context: Any, *, amg=None, timeout_s: float = HTTP_TIMEOUT_S) -> dict:
    """Handle one CloudFormation event and send its response; returns the response body.

    ``amg`` is the boto3 ``grafana`` client (made here when not given); ``timeout_s`` bounds each HTTP call.
    """
    kind = event["RequestType"]
    properties = event["ResourceProperties"]
    # A Delete names the resource CloudFormation has; Create and Update name the one they make.
    physical_id = event.get("PhysicalResourceId") if kind == "Delete" else physical_resource_id(properties)
    LOG.info("%s %s on workspace %s", kind, event.get("LogicalResourceId"), properties.get("WorkspaceId"))
    status, reason, data = "SUCCESS", "", {}
    try:
        amg = amg or boto3.client("grafana", region_name=os.environ.get("AWS_REGION"))
        if kind == "Delete":
            _delete(event, amg, timeout_s)
        else:
            data = _create_or_update(event, amg, timeout_s)
    except GrafanaError as error:
        status, reason = "FAILED", str(error)
    except ClientError as error:
        status, reason = (
            "FAILED",
            f"Amazon Managed Grafana {error.operation_name} failed ({_code(error)}): "
            f"{error.response.get('Error', {}).get('Message', '')}",
        )
    except Exception as error:  # every failure goes back to CloudFormation, never only to the log
        LOG.exception("unexpected failure")
        status, reason = "FAILED", f"{type(error).__name__}: {error}"
    if status == "FAILED":
        LOG.error("%s failed: %s", kind, reason)
        if kind == "Update":
            # A failed update keeps the resource CloudFormation has, whatever this one would have been.
            physical_id = event["PhysicalResourceId"]
        log_stream = getattr(context, "log_stream_name", None)
        if log_stream:
            reason += f" (log stream {log_stream})"
    body = {
        "Status": status,
        "Reason": reason[:MAX_REASON_CHARS] or "done",
        "PhysicalResourceId": physical_id,
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
        "Data": data,
    }
    _respond(event, body, timeout_s)
    return body
