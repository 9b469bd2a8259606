"""GrafanaDashboards: one custom resource and its Lambda, least-privilege, cdk-nag clean, props checked at synth."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_aps as aps, aws_grafana as grafana, aws_lambda as lambda_
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from moe_cdk.constructs.grafana_dashboards import (
    HANDLER_DIRECTORY,
    MAX_DASHBOARDS_BYTES,
    GrafanaDashboards,
    GrafanaDashboardsProps,
)
from moe_cdk.core.problems import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_FILES = {
    "moe-training.json": ROOT / "charts/moe-training/dashboards/moe-training.json",
    "hyperpod-cluster.json": ROOT / "observability/dashboards/hyperpod-cluster.json",
}
SHIPPED = {name: path.read_text() for name, path in DASHBOARD_FILES.items()}


def _dashboard(uid: str = "d1", title: str = "One", **extra) -> str:
    variables = [{"type": "datasource", "name": "datasource", "query": "prometheus"}]
    return json.dumps({"uid": uid, "title": title, "templating": {"list": variables}, "panels": [], **extra})


def _build(**overrides):
    app = cdk.App()
    stack = cdk.Stack(app, "T", env=cdk.Environment(account="123456789012", region="us-east-2"))
    amp = aps.CfnWorkspace(stack, "Prometheus", alias="t")
    workspace = grafana.CfnWorkspace(
        stack,
        "Grafana",
        account_access_type="CURRENT_ACCOUNT",
        authentication_providers=["AWS_SSO"],
        permission_type="CUSTOMER_MANAGED",
        grafana_version="10.4",
    )
    props = (
        dict(
            workspace_id=workspace.attr_id,
            workspace_endpoint=workspace.attr_endpoint,
            prometheus_endpoint=amp.attr_prometheus_endpoint,
            prometheus_region="us-east-2",
            dashboards=SHIPPED,
        )
        | overrides
    )
    construct = GrafanaDashboards(stack, "Dashboards", GrafanaDashboardsProps(**props))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack, construct


@pytest.fixture(scope="module")
def built():
    # What importing the handler locally leaves behind (gitignored), planted to show it stays out of the asset.
    cache = HANDLER_DIRECTORY / "__pycache__"
    made_cache = not cache.exists()
    planted = cache / "moe-cdk-test-planted.cpython-311.pyc"
    cache.mkdir(exist_ok=True)
    planted.write_bytes(b"not code")
    try:
        app, stack, construct = _build()
        assembly = app.synth()  # fails on any unacknowledged cdk-nag finding
    finally:
        planted.unlink()
        if made_cache:
            cache.rmdir()
    return assembly, Template.from_stack(stack), construct


@pytest.fixture(scope="module")
def template(built):
    return built[1]


def _only(template: Template, kind: str) -> dict:
    (resource,) = template.find_resources(kind).values()
    return resource


def test_resource_points_at_the_workspaces(template):
    props = _only(template, "Custom::GrafanaDashboards")["Properties"]
    assert props["GrafanaUrl"] == {"Fn::Join": ["", ["https://", {"Fn::GetAtt": ["Grafana", "Endpoint"]}]]}
    assert props["WorkspaceId"] == {"Fn::GetAtt": ["Grafana", "Id"]}
    assert props["PrometheusUrl"] == {"Fn::GetAtt": ["Prometheus", "PrometheusEndpoint"]}
    assert (props["PrometheusRegion"], props["Folder"]) == ("us-east-2", "moe-cdk")


def test_dashboards_travel_as_compact_json_of_the_files(template):
    carried = _only(template, "Custom::GrafanaDashboards")["Properties"]["Dashboards"]
    assert set(carried) == set(SHIPPED)
    for name, text in carried.items():
        assert json.loads(text) == json.loads(SHIPPED[name])
        assert text == json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)  # no whitespace


def test_the_resource_is_invoked_through_the_function(template):
    resource = _only(template, "Custom::GrafanaDashboards")
    (function_id,) = template.find_resources("AWS::Lambda::Function")
    assert resource["Properties"]["ServiceToken"] == {"Fn::GetAtt": [function_id, "Arn"]}


def test_cloudformation_waits_longer_than_the_function_runs(template):
    resource = _only(template, "Custom::GrafanaDashboards")
    function = _only(template, "AWS::Lambda::Function")
    assert int(resource["Properties"]["ServiceTimeout"]) > function["Properties"]["Timeout"]


def test_function_runs_the_handler_on_the_newest_python(template):
    newest = max(
        (getattr(lambda_.Runtime, name) for name in dir(lambda_.Runtime) if name.startswith("PYTHON_3_")),
        key=lambda runtime: int(runtime.name.split(".")[1]),
    )
    props = _only(template, "AWS::Lambda::Function")["Properties"]
    assert (props["Runtime"], props["Handler"]) == (newest.name, "index.handler")


def test_function_logs_to_its_own_group_with_retention(template):
    (group_id,) = template.find_resources("AWS::Logs::LogGroup", {"Properties": {"RetentionInDays": 365}})
    props = _only(template, "AWS::Lambda::Function")["Properties"]
    assert props["LoggingConfig"] == {"LogGroup": {"Ref": group_id}}


def test_role_has_no_managed_policies(template):
    assert "ManagedPolicyArns" not in _only(template, "AWS::IAM::Role")["Properties"]


def _statements(template: Template) -> list[dict]:
    return [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_grafana_actions_are_scoped_to_the_workspace(template):
    (statement,) = [s for s in _statements(template) if any(a.startswith("grafana:") for a in s["Action"])]
    parts = statement["Resource"]["Fn::Join"][1]
    assert parts[2:] == [":grafana:us-east-2:123456789012:/workspaces/", {"Fn::GetAtt": ["Grafana", "Id"]}]
    assert set(statement["Action"]) == {
        "grafana:ListWorkspaceServiceAccounts",
        "grafana:CreateWorkspaceServiceAccount",
        "grafana:DeleteWorkspaceServiceAccount",
        "grafana:CreateWorkspaceServiceAccountToken",
        "grafana:DeleteWorkspaceServiceAccountToken",
    }


def test_logs_actions_are_scoped_to_the_log_group(template):
    (group_id,) = template.find_resources("AWS::Logs::LogGroup")
    (statement,) = [s for s in _statements(template) if any(a.startswith("logs:") for a in s["Action"])]
    assert statement["Resource"] == {"Fn::GetAtt": [group_id, "Arn"]}


def test_no_statement_allows_every_resource(template):
    assert all(s["Resource"] != "*" for s in _statements(template))


def test_function_asset_is_the_handler_alone(built):
    assembly, template, _ = built
    key = _only(template, "AWS::Lambda::Function")["Properties"]["Code"]["S3Key"]
    staged = Path(assembly.directory) / f"asset.{key.removesuffix('.zip')}"
    assert sorted(p.name for p in staged.iterdir()) == ["index.py"]


def test_exposes_where_things_are(built):
    construct = built[2]
    spec = importlib.util.spec_from_file_location("grafana_dashboards_handler_index", HANDLER_DIRECTORY / "index.py")
    handler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler)
    uids = sorted(json.loads(text)["uid"] for text in SHIPPED.values())
    assert (construct.dashboard_uids, construct.folder_uid) == (uids, "moe-cdk")
    assert construct.data_source_uid == handler.DATA_SOURCE_UID


@pytest.mark.parametrize(
    ("dashboards", "expected"),
    [
        ({"a.json": "{not json"}, "dashboards['a.json']: not JSON"),
        ({"a.json": "[1, 2]"}, "dashboards['a.json']: not a JSON object"),
        ({"a.json": _dashboard(uid="")}, "dashboards['a.json']: has no uid"),
        ({"a.json": _dashboard(title=" ")}, "dashboards['a.json']: has no title"),
        ({"a.json": _dashboard(uid="x" * 41)}, "dashboards['a.json']: uid too long"),
        ({"a.json": _dashboard(), "b.json": _dashboard()}, "dashboards['b.json']: uid already used by 'a.json'"),
        ({"a.json": json.dumps({"uid": "a", "title": "A"})}, "dashboards['a.json']: has no `datasource` template"),
        ({}, "dashboards: needs at least one dashboard"),
    ],
)
def test_invalid_dashboards_are_refused(dashboards, expected):
    with pytest.raises(ConfigError) as error:
        _build(dashboards=dashboards)
    assert len(error.value.errors) == 1 and error.value.errors[0].startswith(expected)


def test_every_dashboard_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as error:
        _build(dashboards={"a.json": "{", "b.json": json.dumps({"title": "B"}), "c.json": json.dumps({"uid": "c"})})
    keys = [problem.key for problem in error.value.problems]
    assert keys.count("dashboards['a.json']") == 1 and keys.count("dashboards['b.json']") == 2
    assert keys.count("dashboards['c.json']") == 2  # no title, no datasource variable


def test_dashboards_too_big_for_the_resource_are_refused():
    filler = "x" * (MAX_DASHBOARDS_BYTES // 2)
    dashboards = {"a.json": _dashboard(uid="a", description=filler), "b.json": _dashboard(uid="b", description=filler)}
    with pytest.raises(ConfigError) as error:
        _build(dashboards=dashboards)
    (line,) = error.value.errors
    assert line.startswith("dashboards: too big for a custom resource's properties")


@pytest.mark.parametrize(
    ("prop", "value"),
    [
        ("workspace_id", "ws-123"),
        ("workspace_endpoint", "https://g-0123456789.grafana-workspace.us-east-2.amazonaws.com"),
        ("prometheus_endpoint", "aps-workspaces.us-east-2.amazonaws.com/workspaces/ws-1/"),
        ("folder", "moe cdk"),
        ("log_retention_days", 10),
    ],
)
def test_invalid_props_are_refused(prop, value):
    with pytest.raises(ConfigError) as error:
        _build(**{prop: value})
    (line,) = error.value.errors
    assert line.startswith(f"{prop}: ")
