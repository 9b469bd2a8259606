"""The Custom::GrafanaDashboards handler (constructs/grafana_dashboards_handler/index.py) against a Grafana of ours.

No Grafana runs on this machine, and none may be downloaded, so two stand-ins take its place:

* The AMG API is a real boto3 ``grafana`` client under ``botocore.stub.Stubber``: every request the
  handler makes is checked against botocore's service model (a wrong parameter name or a missing
  required one fails), and each response is one the model allows.
* Grafana's HTTP API is ``FakeGrafana``, an ``http.server`` on 127.0.0.1 that records each request
  and answers as Grafana 10.4's documentation describes (Grafana documentation, "Data source HTTP
  API", "Folder HTTP API" and "Dashboard HTTP API": the paths, the 404 for a missing uid, the
  ``{"message": ...}`` error bodies, ``overwrite`` on ``POST /api/dashboards/db``). The same server
  takes CloudFormation's ``ResponseURL``, so each test reads the response the stack would get.

The handler is pointed at the fake through the ``GrafanaUrl`` property, which the construct sets to
``https://<workspace endpoint>``.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

ROOT = Path(__file__).resolve().parents[2]
HANDLER = ROOT / "constructs/grafana_dashboards_handler/index.py"

WORKSPACE = "g-0123456789"
ACCOUNT_ID = "7"
TOKEN_ID = "11"
TOKEN_KEY = "glsa_test_0123456789abcdef"
PROMETHEUS_URL = "https://aps-workspaces.us-east-2.amazonaws.com/workspaces/ws-0123/"
STACK_ID = "arn:aws:cloudformation:us-east-2:123456789012:stack/T/0a1b2c3d"


def _load_handler():
    spec = importlib.util.spec_from_file_location("grafana_dashboards_handler_index", HANDLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


index = _load_handler()


def _dashboard(uid: str, title: str) -> str:
    variables = [{"type": "datasource", "name": "datasource", "query": "prometheus", "current": {}}]
    panel = {"id": 1, "type": "timeseries", "datasource": {"type": "prometheus", "uid": "${datasource}"}}
    return json.dumps({"id": 42, "uid": uid, "title": title, "templating": {"list": variables}, "panels": [panel]})


DASHBOARDS = {"moe-training.json": _dashboard("moe-training", "MoE"), "cluster.json": _dashboard("cluster", "Cluster")}


class FakeGrafana:
    """Grafana's data source, folder and dashboard endpoints, in memory, plus CloudFormation's response URL."""

    def __init__(self):
        self.datasources: dict[str, dict] = {}
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}
        self.requests: list[SimpleNamespace] = []
        self.responses: list[dict] = []
        self.failures: dict[tuple[str, str], tuple[int, str]] = {}
        self._ids = iter(range(1, 10_000))
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                status, answer = fake.answer(self.command, self.path, self.headers, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def grafana_requests(self) -> list[SimpleNamespace]:
        return [r for r in self.requests if r.path.startswith("/api/")]

    def answer(self, method: str, path: str, headers, body) -> tuple[int, dict]:
        if path.startswith("/cfn-response/"):
            self.responses.append(body)
            return 200, {}
        self.requests.append(
            SimpleNamespace(method=method, path=path, authorization=headers.get("Authorization"), body=body)
        )
        if headers.get("Authorization") != f"Bearer {TOKEN_KEY}":
            return 401, {"message": "Unauthorized"}
        if (method, path) in self.failures:
            status, message = self.failures[(method, path)]
            return status, {"message": message}
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "datasources", "uid"]:
            return self._datasource(method, parts[3], body)
        if parts == ["api", "datasources"] and method == "POST":
            if any(d["name"] == body["name"] for d in self.datasources.values()):
                return 409, {"message": "data source with the same name already exists"}
            self.datasources[body["uid"]] = {**body, "id": next(self._ids)}
            return 200, {
                "datasource": self.datasources[body["uid"]],
                "message": "Datasource added",
                "name": body["name"],
            }
        if parts[:2] == ["api", "folders"]:
            return self._folder(method, parts[2:], body)
        if parts == ["api", "dashboards", "db"] and method == "POST":
            return self._post_dashboard(body)
        if parts[:3] == ["api", "dashboards", "uid"] and method == "DELETE":
            if self.dashboards.pop(parts[3], None) is None:
                return 404, {"message": "Dashboard not found"}
            return 200, {"title": parts[3], "message": f"Dashboard {parts[3]} deleted"}
        return 404, {"message": "Not found"}

    def _datasource(self, method, uid, body):
        if uid not in self.datasources:
            return 404, {"message": "Data source not found"}
        if method == "GET":
            return 200, self.datasources[uid]
        if method == "PUT":
            self.datasources[uid] = {**body, "id": self.datasources[uid]["id"]}
            return 200, {"datasource": self.datasources[uid], "message": "Datasource updated", "name": body["name"]}
        if method == "DELETE":
            del self.datasources[uid]
            return 200, {"message": "Data source deleted"}
        return 405, {"message": "Method not allowed"}

    def _folder(self, method, rest, body):
        if method == "GET" and rest:
            found = self.folders.get(rest[0])
            return (200, found) if found else (404, {"message": "folder not found"})
        if method == "POST" and not rest:
            if body["uid"] in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            self.folders[body["uid"]] = {**body, "id": next(self._ids)}
            return 200, self.folders[body["uid"]]
        return 405, {"message": "Method not allowed"}

    def _post_dashboard(self, body):
        dashboard = body["dashboard"]
        if body.get("folderUid") not in self.folders:
            return 400, {"message": "folder not found"}
        if dashboard["uid"] in self.dashboards and not body.get("overwrite"):
            return 412, {"status": "name-exists", "message": "A dashboard with the same uid already exists"}
        self.dashboards[dashboard["uid"]] = body
        return 200, {"id": next(self._ids), "uid": dashboard["uid"], "status": "success", "version": 1}


@pytest.fixture
def grafana():
    fake = FakeGrafana()
    yield fake
    fake.close()


@pytest.fixture
def amg():
    client = boto3.client(
        "grafana", region_name="us-east-2", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def _properties(grafana: FakeGrafana, dashboards: dict[str, str] = DASHBOARDS) -> dict:
    return {
        "ServiceToken": "arn:aws:lambda:us-east-2:123456789012:function:handler",
        "GrafanaUrl": grafana.url,
        "WorkspaceId": WORKSPACE,
        "PrometheusUrl": PROMETHEUS_URL,
        "PrometheusRegion": "us-east-2",
        "Folder": "moe-cdk",
        "Dashboards": dashboards,
    }


def _event(grafana: FakeGrafana, kind: str, request_id: str, properties: dict, old: dict | None = None) -> dict:
    event = {
        "RequestType": kind,
        "RequestId": request_id,
        "ResponseURL": f"{grafana.url}/cfn-response/{request_id}",
        "StackId": STACK_ID,
        "LogicalResourceId": "DashboardsCCD7F836",
        "ResourceType": "Custom::GrafanaDashboards",
        "ResourceProperties": properties,
    }
    if kind != "Create":
        event["PhysicalResourceId"] = f"moe-cdk-grafana-dashboards:{WORKSPACE}"
    if old is not None:
        event["OldResourceProperties"] = old
    return event


def _expect_account(stubber: Stubber, *, exists: bool) -> None:
    accounts = [{"id": ACCOUNT_ID, "name": "moe-cdk-dashboards", "grafanaRole": "ADMIN", "isDisabled": "false"}]
    stubber.add_response(
        "list_workspace_service_accounts",
        {"serviceAccounts": accounts if exists else [], "workspaceId": WORKSPACE},
        {"workspaceId": WORKSPACE},
    )
    if not exists:
        stubber.add_response(
            "create_workspace_service_account",
            {"id": ACCOUNT_ID, "name": "moe-cdk-dashboards", "grafanaRole": "ADMIN", "workspaceId": WORKSPACE},
            {"workspaceId": WORKSPACE, "name": "moe-cdk-dashboards", "grafanaRole": "ADMIN"},
        )


def _expect_token(stubber: Stubber, kind: str, request_id: str) -> None:
    stubber.add_response(
        "create_workspace_service_account_token",
        {
            "serviceAccountToken": {"id": TOKEN_ID, "name": f"moe-cdk-{kind}-{request_id}", "key": TOKEN_KEY},
            "serviceAccountId": ACCOUNT_ID,
            "workspaceId": WORKSPACE,
        },
        {
            "workspaceId": WORKSPACE,
            "serviceAccountId": ACCOUNT_ID,
            "name": f"moe-cdk-{kind}-{request_id}",
            "secondsToLive": index.TOKEN_SECONDS_TO_LIVE,
        },
    )


def _expect_token_deleted(stubber: Stubber) -> None:
    stubber.add_response(
        "delete_workspace_service_account_token",
        {"tokenId": TOKEN_ID, "serviceAccountId": ACCOUNT_ID, "workspaceId": WORKSPACE},
        {"workspaceId": WORKSPACE, "serviceAccountId": ACCOUNT_ID, "tokenId": TOKEN_ID},
    )


def _run(event: dict, client, *, timeout_s: float = 5) -> dict:
    return index.handler(
        event, SimpleNamespace(log_stream_name="2026/01/01/[$LATEST]abc"), amg=client, timeout_s=timeout_s
    )


def _create(grafana, amg, *, request_id="req-create", account_exists=False, dashboards=DASHBOARDS) -> dict:
    client, stubber = amg
    _expect_account(stubber, exists=account_exists)
    _expect_token(stubber, "create", request_id)
    _expect_token_deleted(stubber)
    return _run(_event(grafana, "Create", request_id, _properties(grafana, dashboards)), client)


def test_every_grafana_request_carries_the_token(grafana, amg):
    _create(grafana, amg)
    assert grafana.grafana_requests() and {r.authorization for r in grafana.grafana_requests()} == {
        f"Bearer {TOKEN_KEY}"
    }


def test_create_answers_cloudformation_with_success(grafana, amg):
    returned = _create(grafana, amg)
    (response,) = grafana.responses
    assert response == returned
    assert (response["Status"], response["PhysicalResourceId"], response["RequestId"]) == (
        "SUCCESS",
        f"moe-cdk-grafana-dashboards:{WORKSPACE}",
        "req-create",
    )
    assert response["Data"] == {
        "DataSourceUid": "moe-cdk-amp",
        "FolderUid": "moe-cdk",
        "DashboardUids": "cluster,moe-training",
    }


def test_data_source_queries_the_workspace_with_sigv4(grafana, amg):
    _create(grafana, amg)
    source = grafana.datasources["moe-cdk-amp"]
    assert (source["type"], source["access"], source["url"]) == ("prometheus", "proxy", PROMETHEUS_URL.rstrip("/"))
    assert source["jsonData"] == {
        "httpMethod": "POST",
        "sigV4Auth": True,
        "sigV4AuthType": "ec2_iam_role",
        "sigV4Region": "us-east-2",
    }


def test_dashboards_go_into_the_folder_with_the_data_source_selected(grafana, amg):
    _create(grafana, amg)
    assert set(grafana.folders) == {"moe-cdk"} and set(grafana.dashboards) == {"moe-training", "cluster"}
    for posted in grafana.dashboards.values():
        assert (posted["folderUid"], posted["overwrite"], posted["dashboard"]["id"]) == ("moe-cdk", True, None)
        (variable,) = posted["dashboard"]["templating"]["list"]
        assert variable["current"]["value"] == "moe-cdk-amp"


def test_service_account_is_created_once_and_found_again(grafana, amg):
    _create(grafana, amg)
    response = _create(grafana, amg, request_id="req-again", account_exists=True)  # no create call queued
    assert response["Status"] == "SUCCESS"


def test_rerun_overwrites_instead_of_duplicating(grafana, amg):
    _create(grafana, amg)
    first = len(grafana.requests)
    _create(grafana, amg, request_id="req-again", account_exists=True)
    second = [(r.method, r.path) for r in grafana.requests[first:]]
    assert ("PUT", "/api/datasources/uid/moe-cdk-amp") in second
    assert ("POST", "/api/datasources") not in second and ("POST", "/api/folders") not in second
    assert (len(grafana.datasources), len(grafana.folders), len(grafana.dashboards)) == (1, 1, 2)


def test_token_is_deleted_even_when_a_dashboard_post_fails(grafana, amg):
    grafana.failures[("POST", "/api/dashboards/db")] = (400, "Dashboard title cannot be empty")
    response = _create(grafana, amg)  # the amg fixture fails unless delete_workspace_service_account_token ran
    assert response["Status"] == "FAILED"


def test_failure_reason_is_the_call_the_status_and_grafanas_message(grafana, amg):
    grafana.failures[("POST", "/api/dashboards/db")] = (400, "Dashboard title cannot be empty")
    _create(grafana, amg)
    (response,) = grafana.responses
    assert response["Status"] == "FAILED"
    assert response["Reason"].startswith(
        "Grafana POST /api/dashboards/db answered HTTP 400: Dashboard title cannot be empty"
    )
    assert "Traceback" not in response["Reason"]


def test_amg_failure_is_reported_with_the_operation_and_message(grafana, amg):
    client, stubber = amg
    stubber.add_response("list_workspace_service_accounts", {"serviceAccounts": [], "workspaceId": WORKSPACE})
    stubber.add_client_error(
        "create_workspace_service_account",
        service_error_code="ValidationException",
        service_message="Service accounts need Grafana 9 or later",
        http_status_code=400,
    )
    response = _run(_event(grafana, "Create", "req-create", _properties(grafana)), client)
    assert response["Status"] == "FAILED"
    assert response["Reason"].startswith(
        "Amazon Managed Grafana CreateWorkspaceServiceAccount failed (ValidationException): "
        "Service accounts need Grafana 9 or later"
    )


def test_update_deletes_dashboards_no_longer_listed(grafana, amg):
    _create(grafana, amg)
    client, stubber = amg
    _expect_account(stubber, exists=True)
    _expect_token(stubber, "update", "req-update")
    _expect_token_deleted(stubber)
    kept = {"moe-training.json": DASHBOARDS["moe-training.json"]}
    event = _event(grafana, "Update", "req-update", _properties(grafana, kept), old=_properties(grafana))
    assert _run(event, client)["Status"] == "SUCCESS"
    assert set(grafana.dashboards) == {"moe-training"}


def test_failed_update_keeps_the_physical_id(grafana, amg):
    client, stubber = amg
    _expect_account(stubber, exists=True)
    _expect_token(stubber, "update", "req-update")
    _expect_token_deleted(stubber)
    grafana.failures[("GET", "/api/datasources/uid/moe-cdk-amp")] = (500, "database is locked")
    event = _event(grafana, "Update", "req-update", _properties(grafana), old=_properties(grafana))
    event["PhysicalResourceId"] = "moe-cdk-grafana-dashboards:g-aaaaaaaaaa"  # not what this update would name
    response = _run(event, client)
    assert (response["Status"], response["PhysicalResourceId"]) == ("FAILED", "moe-cdk-grafana-dashboards:g-aaaaaaaaaa")


def _delete(grafana, amg, *, request_id="req-delete") -> dict:
    client, stubber = amg
    _expect_account(stubber, exists=True)
    _expect_token(stubber, "delete", request_id)
    _expect_token_deleted(stubber)
    stubber.add_response(
        "delete_workspace_service_account",
        {"serviceAccountId": ACCOUNT_ID, "workspaceId": WORKSPACE},
        {"workspaceId": WORKSPACE, "serviceAccountId": ACCOUNT_ID},
    )
    return _run(_event(grafana, "Delete", request_id, _properties(grafana)), client)


def test_delete_removes_dashboards_data_source_and_service_account(grafana, amg):
    _create(grafana, amg)
    response = _delete(grafana, amg)  # the amg fixture fails unless delete_workspace_service_account ran
    assert response["Status"] == "SUCCESS"
    assert (grafana.dashboards, grafana.datasources) == ({}, {})


def test_delete_keeps_the_folder(grafana, amg):
    _create(grafana, amg)
    _delete(grafana, amg)
    assert set(grafana.folders) == {"moe-cdk"}


def test_delete_tolerates_404(grafana, amg):
    response = _delete(grafana, amg)  # nothing in Grafana: every DELETE answers 404
    deletes = [r for r in grafana.grafana_requests() if r.method == "DELETE"]
    assert len(deletes) == 3 and response["Status"] == "SUCCESS"


def test_delete_of_a_workspace_already_gone_succeeds(grafana, amg):
    client, stubber = amg
    stubber.add_client_error(
        "list_workspace_service_accounts",
        service_error_code="ResourceNotFoundException",
        service_message=f"Workspace {WORKSPACE} not found",
        http_status_code=404,
    )
    response = _run(_event(grafana, "Delete", "req-delete", _properties(grafana)), client)
    assert response["Status"] == "SUCCESS" and grafana.grafana_requests() == []


def test_delete_on_a_workspace_without_service_accounts_succeeds(grafana, amg):
    # The rollback of a Create on a Grafana 8 workspace, which failed before making anything.
    client, stubber = amg
    stubber.add_client_error(
        "list_workspace_service_accounts",
        service_error_code="ValidationException",
        service_message="Service accounts are not supported on this workspace version",
        http_status_code=400,
    )
    response = _run(_event(grafana, "Delete", "req-delete", _properties(grafana)), client)
    assert response["Status"] == "SUCCESS" and grafana.grafana_requests() == []


def test_delete_without_our_service_account_touches_nothing(grafana, amg):
    client, stubber = amg
    other = [{"id": "3", "name": "someone-else", "grafanaRole": "VIEWER", "isDisabled": "false"}]
    stubber.add_response("list_workspace_service_accounts", {"serviceAccounts": other, "workspaceId": WORKSPACE})
    response = _run(_event(grafana, "Delete", "req-delete", _properties(grafana)), client)
    assert response["Status"] == "SUCCESS" and grafana.grafana_requests() == []


def test_service_accounts_are_found_on_a_later_page(grafana, amg):
    client, stubber = amg
    ours = [{"id": ACCOUNT_ID, "name": "moe-cdk-dashboards", "grafanaRole": "ADMIN", "isDisabled": "false"}]
    stubber.add_response(
        "list_workspace_service_accounts",
        {"serviceAccounts": [], "workspaceId": WORKSPACE, "nextToken": "page-2"},
        {"workspaceId": WORKSPACE},
    )
    stubber.add_response(
        "list_workspace_service_accounts",
        {"serviceAccounts": ours, "workspaceId": WORKSPACE},
        {"workspaceId": WORKSPACE, "nextToken": "page-2"},
    )
    _expect_token(stubber, "create", "req-create")  # and no create_workspace_service_account
    _expect_token_deleted(stubber)
    assert _run(_event(grafana, "Create", "req-create", _properties(grafana)), client)["Status"] == "SUCCESS"


@pytest.fixture
def silent_server():
    """A socket that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_grafana_that_never_answers_fails_within_the_timeout(grafana, amg, silent_server):
    client, stubber = amg
    _expect_account(stubber, exists=True)
    _expect_token(stubber, "create", "req-create")
    _expect_token_deleted(stubber)
    event = _event(grafana, "Create", "req-create", {**_properties(grafana), "GrafanaUrl": silent_server})
    started = time.monotonic()
    response = _run(event, client, timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert response["Status"] == "FAILED" and "could not be reached: timed out" in response["Reason"]
