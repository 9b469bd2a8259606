"""``moe-cdk diff``: the template diff on hand-made templates and on the shipped configurations' templates,
and one real diff between two commits."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gzip
import io
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
from conftest import SHIPPED_CONFIGS, once_per_run, synth

from moe_cdk.cli.diff import add_parser
from moe_cdk.core.problems import ConfigError
from moe_cdk.schema.config import load_config
from moe_cdk.tools import synth_diff
from moe_cdk.tools.synth_diff import (
    Diff,
    StackDiff,
    diff_templates,
    render_markdown,
    synth_revision,
)

ROOT = Path(__file__).resolve().parents[2]


def _template(**resources) -> dict:
    return {
        "Resources": {
            "CDKMetadata": {"Type": "AWS::CDK::Metadata", "Properties": {"Analytics": "v2:x"}},
            **resources,
        }
    }


def _resource(type_: str, metadata_path: str = "stack/x/Resource", **properties) -> dict:
    return {"Type": type_, "Properties": properties, "Metadata": {"aws:cdk:path": metadata_path}}


def _only(diff, stack="s"):
    (stack_diff,) = [s for s in diff.stacks if s.name == stack]
    (change,) = stack_diff.resources
    return change


def test_identical_templates_are_an_empty_diff():
    template = _template(Bucket=_resource("AWS::S3::Bucket"))
    diff = diff_templates({"s": template}, {"s": template})
    assert diff.empty
    assert "No infrastructure changes." in render_markdown(diff, "HEAD", "working tree")


def test_metadata_and_cdk_metadata_are_ignored():
    old = _template(Bucket=_resource("AWS::S3::Bucket", "stack/old/Resource"))
    new = _template(Bucket=_resource("AWS::S3::Bucket", "stack/new/Resource"))
    new["Resources"]["CDKMetadata"]["Properties"]["Analytics"] = "v2:y"
    assert diff_templates({"s": old}, {"s": new}).empty


def test_added_and_removed():
    old = _template(Old=_resource("AWS::S3::Bucket"))
    new = _template(New=_resource("AWS::Logs::LogGroup", RetentionInDays=7))
    diff = diff_templates({"s": old}, {"s": new})
    kinds = {r.logical_id: r.kind for r in diff.stacks[0].resources}
    assert kinds == {"Old": "removed", "New": "added"}
    assert (diff.count("added"), diff.count("removed")) == (1, 1)
    text = render_markdown(diff, "a", "b")
    assert "1 added, 1 removed, 0 replaced, 0 modified" in text


def test_replaced_by_type_change():
    old = _template(Thing=_resource("AWS::S3::Bucket"))
    new = _template(Thing=_resource("AWS::Logs::LogGroup"))
    change = _only(diff_templates({"s": old}, {"s": new}))
    assert change.kind == "replaced"
    assert "AWS::S3::Bucket" in change.replacement_reasons[0]


def test_replaced_by_replacement_property_including_nested():
    old = _template(
        Fs=_resource(
            "AWS::FSx::FileSystem",
            StorageCapacity=1200,
            LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
        )
    )
    new = _template(
        Fs=_resource(
            "AWS::FSx::FileSystem",
            StorageCapacity=1200,
            LustreConfiguration={"DeploymentType": "SCRATCH_2", "PerUnitStorageThroughput": 250},
        )
    )
    change = _only(diff_templates({"s": old}, {"s": new}))
    assert change.kind == "replaced"
    assert change.replacement_reasons == ["LustreConfiguration.DeploymentType"]
    assert [c.path for c in change.changes] == ["LustreConfiguration.DeploymentType"]
    assert "⚠ replacement" in render_markdown(diff_templates({"s": old}, {"s": new}), "a", "b")

    subnet_old = _template(Sn=_resource("AWS::EC2::Subnet", CidrBlock="10.0.0.0/18", VpcId={"Ref": "Vpc"}))
    subnet_new = _template(Sn=_resource("AWS::EC2::Subnet", CidrBlock="10.0.0.0/19", VpcId={"Ref": "Vpc"}))
    assert _only(diff_templates({"s": subnet_old}, {"s": subnet_new})).replacement_reasons == ["CidrBlock"]


def test_modified_lists_paths_with_old_and_new_values():
    old = _template(Fs=_resource("AWS::FSx::FileSystem", StorageCapacity=4800, Tags=[{"Key": "a", "Value": "1"}]))
    new = _template(Fs=_resource("AWS::FSx::FileSystem", StorageCapacity=9600, Tags=[{"Key": "a", "Value": "2"}]))
    diff = diff_templates({"s": old}, {"s": new})
    change = _only(diff)
    assert change.kind == "modified" and not change.iam and not change.security_group
    assert {c.path: (c.old, c.new) for c in change.changes} == {
        "StorageCapacity": (4800, 9600),
        "Tags[0].Value": ("1", "2"),
    }
    text = render_markdown(diff, "a", "b")
    assert "`StorageCapacity`: `4800` → `9600`" in text


def test_long_values_are_shortened():
    old = _template(P=_resource("AWS::SSM::Parameter", Value="x" * 300 + "old"))
    new = _template(P=_resource("AWS::SSM::Parameter", Value="x" * 300 + "new"))
    text = render_markdown(diff_templates({"s": old}, {"s": new}), "a", "b")
    row = next(line for line in text.splitlines() if "`P`" in line)
    assert "old" in row and "new" in row and "x" * 100 not in row


def test_iam_flag():
    policy = {"Statement": [{"Action": "s3:GetObject", "Effect": "Allow", "Resource": "*"}]}
    wider = {"Statement": [{"Action": "s3:*", "Effect": "Allow", "Resource": "*"}]}
    old = _template(
        Pol=_resource("AWS::IAM::Policy", PolicyDocument=policy),
        Bp=_resource("AWS::S3::BucketPolicy", Bucket="b", PolicyDocument=policy),
    )
    new = _template(
        Pol=_resource("AWS::IAM::Policy", PolicyDocument=wider),
        Bp=_resource("AWS::S3::BucketPolicy", Bucket="b", PolicyDocument=wider),
    )
    diff = diff_templates({"s": old}, {"s": new})
    assert all(r.iam for r in diff.stacks[0].resources) and diff.iam
    text = render_markdown(diff, "a", "b")
    assert "🔒 IAM" in text and "🔒 security group" not in text


def test_security_group_flag():
    rule = {"IpProtocol": "-1", "CidrIp": "10.0.0.0/16"}
    old = _template(
        Sg=_resource("AWS::EC2::SecurityGroup", GroupDescription="d", SecurityGroupIngress=[rule]),
        Fs=_resource("AWS::SageMaker::Domain", SecurityGroupIds=["sg-1"]),
    )
    new = _template(
        Sg=_resource(
            "AWS::EC2::SecurityGroup", GroupDescription="d", SecurityGroupIngress=[{**rule, "CidrIp": "0.0.0.0/0"}]
        ),
        Fs=_resource("AWS::SageMaker::Domain", SecurityGroupIds=["sg-2"]),
    )
    diff = diff_templates({"s": old}, {"s": new})
    assert all(r.security_group for r in diff.stacks[0].resources) and not diff.iam
    assert "🔒 security group" in render_markdown(diff, "a", "b")


def test_access_entry_principal_change_is_a_replacement_and_a_security_change():
    entry = {"ClusterName": {"Ref": "Cluster"}, "Type": "STANDARD", "PrincipalArn": "arn:aws:iam::111122223333:role/a"}
    old = _template(Entry=_resource("AWS::EKS::AccessEntry", **entry))
    new = _template(
        Entry=_resource("AWS::EKS::AccessEntry", **{**entry, "PrincipalArn": "arn:aws:iam::111122223333:role/b"})
    )
    diff = diff_templates({"s": old}, {"s": new})
    change = _only(diff)
    assert change.kind == "replaced" and change.replacement_reasons == ["PrincipalArn"]
    assert change.security and change.iam and diff.security
    assert "| ⚠ replacement 🔒 IAM | `Entry` | AWS::EKS::AccessEntry |" in render_markdown(diff, "a", "b")


POLICY = {"Statement": [{"Action": "kms:*", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::1:root"}}]}
ACCESS_CHANGES = [  # (type, property, old value, new value)
    ("AWS::EKS::AccessEntry", "KubernetesGroups", ["viewers"], ["admins"]),
    ("AWS::S3::BucketPolicy", "Bucket", "a", "b"),
    ("AWS::IAM::InstanceProfile", "Roles", ["a"], ["b"]),
    ("AWS::IAM::Role", "MaxSessionDuration", 3600, 43200),
    ("AWS::KMS::Key", "KeyPolicy", POLICY, {**POLICY, "Version": "2012-10-17"}),
]


@pytest.mark.parametrize(
    ("type_", "name", "old", "new"), [pytest.param(*case, id=f"{case[0]}.{case[1]}") for case in ACCESS_CHANGES]
)
def test_access_changes_are_security_changes(type_, name, old, new):
    """Any change to an access resource, and a policy change on any resource, is an IAM (security) change."""
    diff = diff_templates(
        {"s": _template(R=_resource(type_, **{name: old}))}, {"s": _template(R=_resource(type_, **{name: new}))}
    )
    change = _only(diff)
    assert change.iam and change.security and not change.security_group


def test_outputs_and_parameters_are_a_separate_section():
    old = {**_template(), "Outputs": {"A": {"Value": "1"}, "Gone": {"Value": "x"}}, "Parameters": {}}
    new = {**_template(), "Outputs": {"A": {"Value": "2"}}, "Parameters": {"P": {"Type": "String"}}}
    diff = diff_templates({"s": old}, {"s": new})
    assert not diff.empty and diff.stacks[0].resources == []
    assert {(s.section, s.name, s.kind) for s in diff.stacks[0].sections} == {
        ("Outputs", "A", "modified"),
        ("Outputs", "Gone", "removed"),
        ("Parameters", "P", "added"),
    }
    assert "Parameters and outputs:" in render_markdown(diff, "a", "b")


def test_stack_added():
    diff = diff_templates({}, {"new-stack": _template(B=_resource("AWS::S3::Bucket"))})
    assert diff.stacks[0].status == "added"
    assert "new-stack (stack added)" in render_markdown(diff, "a", "b")


def _synthesize_shipped() -> dict[str, dict[str, dict]]:
    templates = {}
    for config_path in SHIPPED_CONFIGS:
        with tempfile.TemporaryDirectory(prefix="synth-diff-") as outdir:
            templates[config_path] = synth(load_config(ROOT / config_path), Path(outdir))
    return templates


@cache
def _shipped_templates() -> dict[str, dict[str, dict]]:
    """{configuration: {stack name: template}} of every shipped configuration, synthesized once per run (at
    collection: the parametrization below needs the resource types), by the first worker that collects this file."""
    return once_per_run("shipped-templates", _synthesize_shipped)


def _deployed_types() -> dict[str, tuple[str, str, str]]:
    """{resource type: (configuration, stack, logical id) of its first resource} over the shipped configurations."""
    found: dict[str, tuple[str, str, str]] = {}
    for config_path, templates in _shipped_templates().items():
        for stack, template in sorted(templates.items()):
            for logical_id, resource in sorted(template.get("Resources", {}).items()):
                if resource["Type"] not in synth_diff.IGNORED_RESOURCE_TYPES:
                    found.setdefault(resource["Type"], (config_path, stack, logical_id))
    return found


DEPLOYED_TYPES = _deployed_types()


def _has(value, keys: list[str]) -> bool:
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return True


def _set(properties: dict, keys: list[str], value) -> None:
    for key in keys[:-1]:
        if not isinstance(properties.get(key), dict):
            properties[key] = {}
        properties = properties[key]
    properties[keys[-1]] = value


@cache
def _spec_resources() -> dict[str, dict]:
    with gzip.open(synth_diff.service_spec_path()) as handle:
        return {r["cloudFormationType"]: r for r in json.load(handle)["schema"]["resource"]["entities"]}


@pytest.mark.parametrize("resource_type", sorted(DEPLOYED_TYPES))
def test_changing_a_create_only_property_is_a_replacement(resource_type):
    """For each type the shipped configurations deploy: a copy of its template with one of the type's top-level
    replacing properties (read from the CDK's service specification here, not through synth_diff) changed is a
    replacement."""
    # CloudFormation runs every Custom::<name> type as an AWS::CloudFormation::CustomResource.
    spec_type = "AWS::CloudFormation::CustomResource" if resource_type.startswith("Custom::") else resource_type
    properties_spec = _spec_resources()[spec_type]["properties"]
    paths = [[name] for name, spec in properties_spec.items() if spec.get("causesReplacement") == "yes"]
    if not paths:
        pytest.skip(f"{resource_type}: the CDK's service specification lists no property that replaces it")
    config_path, stack, logical_id = DEPLOYED_TYPES[resource_type]
    old = _shipped_templates()[config_path][stack]
    new = copy.deepcopy(old)
    properties = new["Resources"][logical_id].setdefault("Properties", {})
    keys = next((k for k in paths if _has(properties, k)), paths[0])  # one the resource sets, if any
    _set(properties, keys, "changed-by-test")
    change = _only(diff_templates({stack: old}, {stack: new}), stack)
    assert (change.logical_id, change.kind) == (logical_id, "replaced")
    assert ".".join(keys) in change.replacement_reasons


@pytest.fixture
def counted_spec_reads(monkeypatch) -> Iterator[list[str]]:
    """The service-specification files synth_diff opens from now on, with its caches emptied before and after."""
    real_open, reads = gzip.open, []

    def counting_open(path, *args, **kwargs):
        reads.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(synth_diff.gzip, "open", counting_open)
    for cached in (synth_diff._service_spec, synth_diff.replacement_paths):
        cached.cache_clear()
    yield reads
    for cached in (synth_diff._service_spec, synth_diff.replacement_paths):
        cached.cache_clear()


def test_the_specification_is_read_once_per_run(counted_spec_reads):
    subnets = [
        _template(**{name: _resource("AWS::EC2::Subnet", CidrBlock=cidr, VpcId={"Ref": "Vpc"}) for name in ("A", "B")})
        for cidr in ("10.0.0.0/18", "10.0.0.0/19")
    ]
    for _ in range(2):
        assert diff_templates({"s": subnets[0]}, {"s": subnets[1]}).count("replaced") == 2
    assert counted_spec_reads == [str(synth_diff.service_spec_path())]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        check=True,
        capture_output=True,
    )


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new))


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A clone of HEAD with two commits of its own: rev1 marks the network stack's description
    (so the base revision's code differs from both this checkout and the clone's working tree), rev2 changes
    the marker again and the default configuration's storage capacity and subnet mask."""
    repo = tmp_path_factory.mktemp("diff") / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(repo)], check=True, capture_output=True)
    deployment = repo / "stacks/deployment.py"
    _edit(deployment, 'description="moe-cdk: VPC', 'description="moe-cdk [rev1]: VPC')
    _git(repo, "commit", "--quiet", "-am", "rev1")
    _edit(deployment, "moe-cdk [rev1]: VPC", "moe-cdk [rev2]: VPC")
    config = repo / "config/default.yaml"
    _edit(config, "storage_capacity_gib: 4800", "storage_capacity_gib: 9600")
    _edit(config, "private_subnet_cidr_mask: 18", "private_subnet_cidr_mask: 19")
    _git(repo, "commit", "--quiet", "-am", "rev2: bigger file system, smaller subnets")
    return repo


def _worktrees(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def two_commits(clone, tmp_path_factory) -> SimpleNamespace:
    """``moe-cdk diff HEAD~1`` run once in the clone: base from a temporary worktree, head from the clone's files.
    Its exit code, what it printed, the file it wrote, and per side (the base commit, None for the working tree)
    the templates and the validation report that synth left in cdk.out."""
    templates, reports = {}, {}
    real = synth_diff.synth_revision

    def recording(ref, config, outdir, repo):
        templates[ref] = real(ref, config, outdir, repo)
        reports[ref] = json.loads((outdir / "validation-report.json").read_text())
        return templates[ref]

    output = tmp_path_factory.mktemp("two-commits") / "diff.md"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(printed):
        monkeypatch.setattr(synth_diff, "synth_revision", recording)
        monkeypatch.chdir(clone)
        args = _args("HEAD~1", "--output", str(output))
        code = args.run(args)
    base_commit = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD~1"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return SimpleNamespace(
        code=code, printed=printed.getvalue(), output=output, base_commit=base_commit, templates=templates,
        reports=reports,
    )  # fmt: skip


def test_two_commits(two_commits, clone):
    assert two_commits.code == 0
    output, base_commit = two_commits.output, two_commits.base_commit
    assert two_commits.printed.strip() == f"wrote {output}"
    base, head = two_commits.templates[base_commit], two_commits.templates[None]
    # Each side ran its own code: rev1 exists only in the removed worktree, rev2 only in the clone.
    assert base["moe-network"]["Description"].startswith("moe-cdk [rev1]")
    assert head["moe-network"]["Description"].startswith("moe-cdk [rev2]")
    assert len(_worktrees(clone).strip().splitlines()) == 1  # the temporary worktree is gone

    diff = diff_templates(base, head)
    text = output.read_text()
    assert text == render_markdown(diff, f"HEAD~1 ({base_commit[:12]})", "working tree")
    print(text)
    fs_row = next(line for line in text.splitlines() if "AWS::FSx::FileSystem" in line)
    assert fs_row.startswith("| modified") and "`StorageCapacity`: `4800` → `9600`" in fs_row
    subnet_rows = [line for line in text.splitlines() if "| AWS::EC2::Subnet |" in line]
    assert subnet_rows and all(row.startswith("| ⚠ replacement") for row in subnet_rows)
    assert all(re.search(r'`CidrBlock`: `"10\.0\.[0-9.]+/18"` → `"10\.0\.[0-9.]+/19"`', row) for row in subnet_rows)
    assert diff.count("replaced") >= len(subnet_rows)


def test_each_revision_is_synthesized_without_the_cdks_cloudformation_validation(two_commits):
    # It changes no template, and make synth runs it; skipping it saves about 6 s of CPU per revision.
    assert set(two_commits.reports) == {two_commits.base_commit, None}
    for report in two_commits.reports.values():
        assert "CloudFormation Validate" not in [plugin["pluginName"] for plugin in report["pluginReports"]], report


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="moe-cdk")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["diff", *argv])


def test_bad_ref_exits_2(clone, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(clone)
    args = _args("no-such-branch", "--output", str(tmp_path / "diff.md"))
    assert args.base_ref == "no-such-branch" and args.config == "config/default.yaml"
    assert args.run(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        "moe-cdk diff: 1 problem(s)",
        "  BASE_REF: not a revision (got 'no-such-branch'; allowed a commit, branch or tag)",
    ]
    assert not (tmp_path / "diff.md").exists()
    with pytest.raises(ConfigError, match="not a revision"):
        synth_revision("no-such-branch", "config/default.yaml", tmp_path / "out", clone)
    assert _args().base_ref == "HEAD"


def test_invalid_config_exits_2_with_its_errors(clone, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (clone / "config/default.yaml").read_text().replace("storage_capacity_gib: 9600", "storage_capacity_gib: 7")
    )
    monkeypatch.chdir(clone)
    args = _args("HEAD~1", "--config", str(bad))
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "storage_capacity_gib" in err
    assert len(_worktrees(clone).strip().splitlines()) == 1


def test_a_missing_service_specification_exits_1_before_synth(clone, monkeypatch, capsys):
    def missing():
        raise FileNotFoundError("/nowhere/db.json.gz")

    def no_synth(*args):
        raise AssertionError("synthesized without the service specification")

    monkeypatch.setattr(synth_diff, "service_spec_path", missing)
    monkeypatch.setattr(synth_diff, "synth_revision", no_synth)
    monkeypatch.chdir(clone)
    args = _args("HEAD~1")
    assert args.run(args) == 1
    assert capsys.readouterr().err.strip() == (
        "moe-cdk diff: the CDK CLI's service specification is not installed (looked for /nowhere/db.json.gz); "
        "run make setup"
    )


def test_an_eks_configuration_diffs_with_the_chart_staged_in_the_checkout_only(clone, tmp_path, monkeypatch, capsys):
    # make hyperpod-chart stages the chart under the ignored .cache: no revision holds it.
    staged = clone / ".cache/hyperpod-helm-chart"
    shutil.copytree(ROOT / "tests/fixtures/hyperpod-chart-standin", staged)
    try:
        monkeypatch.chdir(clone)
        output = tmp_path / "diff.md"
        args = _args("HEAD~1", "--config", "config/eks-p5en.yaml", "--output", str(output))
        assert args.run(args) == 0, capsys.readouterr().err
        assert output.read_text().startswith("## Infrastructure diff: HEAD~1")
        assert len(_worktrees(clone).strip().splitlines()) == 1
    finally:
        shutil.rmtree(staged.parent)


def test_only_the_reported_problems_count_not_a_library_warning():
    stderr = (
        "[WARNING] aws-cdk-lib.Stack#addDependency is deprecated.\n"
        "  Use `stack.addDependency()` instead\n"
        "  This API will be removed in the next major release.\n"
        "config/x.yaml: 2 problem(s)\n"
        "  storage.throughput_mib_s_per_tib: not a PERSISTENT_2 tier (got 7; allowed 125, 250, 500 or 1000)\n"
        "  name: too long (got 'x'; allowed at most 24 characters)\n"
        "Subprocess exited with error 2\n"
    )
    problems = synth_diff._reported_problems(stderr)
    assert [p.text for p in problems] == [
        "storage.throughput_mib_s_per_tib: not a PERSISTENT_2 tier (got 7; allowed 125, 250, 500 or 1000)",
        "name: too long (got 'x'; allowed at most 24 characters)",
    ]


@pytest.mark.parametrize(("resource_type", "keys"), sorted(synth_diff.IN_PLACE))
def test_each_in_place_exception_is_marked_by_the_cdk_and_updatable_in_the_service(resource_type, keys):
    # The CDK's specification still marks it (else the entry is stale), the registry schema CloudFormation's
    # handler follows does not make it create-only, and the service's update API takes it.
    assert keys in synth_diff.replacement_paths(resource_type)
    create_only = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", resource_type).schema["createOnlyProperties"]
    assert f"/properties/{keys[0]}" not in create_only and "/properties/" + "/".join(keys) not in create_only
    service = {"AWS::FSx::FileSystem": ("fsx", "UpdateFileSystemLustreConfiguration")}[resource_type]
    update = boto3.client(service[0], region_name="us-east-1").meta.service_model.shape_for(service[1])
    assert keys[-1] in update.members


def test_a_persistent_2_throughput_change_is_an_in_place_update(default_synth):
    _, templates = default_synth
    old = templates["moe-storage"]
    new = copy.deepcopy(old)
    (logical_id,) = [k for k, r in new["Resources"].items() if r["Type"] == "AWS::FSx::FileSystem"]
    lustre = new["Resources"][logical_id]["Properties"]["LustreConfiguration"]
    assert lustre["DeploymentType"] == "PERSISTENT_2"
    lustre["PerUnitStorageThroughput"] = 1000 if lustre["PerUnitStorageThroughput"] != 1000 else 500
    change = _only(diff_templates({"moe-storage": old}, {"moe-storage": new}), "moe-storage")
    assert (change.kind, change.replacement_reasons) == ("modified", [])
    row = next(
        line
        for line in render_markdown(Diff([StackDiff("moe-storage", "changed", [change])]), "a", "b").splitlines()
        if logical_id in line
    )
    assert "ⓘ LustreConfiguration.PerUnitStorageThroughput: updated in place" in row


def test_a_vpc_cidr_change_names_the_exports_its_importers_block(default_config, default_synth, tmp_path):
    _, before = default_synth
    network = dataclasses.replace(default_config.network, vpc_cidr="10.1.0.0/16")
    after = synth(dataclasses.replace(default_config, network=network), tmp_path)
    diff = diff_templates(before, after)
    blocked = {(b.stack, tuple(b.importers)) for b in diff.blocked_exports}
    assert ("moe-network", ("moe-cluster", "moe-storage")) in blocked
    assert all(
        b.reason.startswith("its value comes from NetworkVpc") and "(replaced)" in b.reason
        for b in diff.blocked_exports
    )
    text = render_markdown(diff, "a", "b")
    assert "⛔ 2 export(s) in use change" in text.splitlines()[2] and "### ⛔ Exports in use" in text


def test_an_export_no_other_stack_imports_is_not_blocked():
    exporter = {
        "Resources": {"V": _resource("AWS::EC2::VPC", CidrBlock="10.0.0.0/16")},
        "Outputs": {"O": {"Value": {"Ref": "V"}, "Export": {"Name": "n:O"}}},
    }
    changed = copy.deepcopy(exporter)
    changed["Resources"]["V"]["Properties"]["CidrBlock"] = "10.1.0.0/16"
    importer = {"Resources": {"S": _resource("AWS::EC2::Subnet", VpcId={"Fn::ImportValue": "n:O"})}}
    assert diff_templates({"n": exporter}, {"n": changed}).blocked_exports == []
    (blocked,) = diff_templates({"n": exporter, "i": importer}, {"n": changed, "i": importer}).blocked_exports
    assert (blocked.export, blocked.importers, blocked.reason) == ("n:O", ["i"], "its value comes from V (replaced)")


def _parameter_change_markdown(old: str, new: str) -> str:
    """The Markdown of one SSM parameter whose value changes from ``old`` to ``new``."""
    before = {"s": _template(P=_resource("AWS::SSM::Parameter", Value=old))}
    return render_markdown(
        diff_templates(before, {"s": _template(P=_resource("AWS::SSM::Parameter", Value=new))}), "a", "b"
    )


def test_a_changed_hash_in_a_long_value_is_shown_whole():
    prefix = "arn:aws:ecr:us-east-2:123456789012:repository/cdk-hnb659fds-container-assets:"
    old, new = prefix + "01f43c2c" * 8, prefix + "52b06d4b" * 8
    text = _parameter_change_markdown(old, new)
    row = next(line for line in text.splitlines() if "`P`" in line)
    assert "01f43c2c" * 8 in row and "52b06d4b" * 8 in row and "full values below" not in row


def test_a_long_rewrite_is_cut_in_the_table_and_shown_whole_below():
    old, new = "a" * 1000, "b" * 1000
    text = _parameter_change_markdown(old, new)
    row = next(line for line in text.splitlines() if "`P`" in line)
    assert "a" * 1000 not in row and "(full values below)" in row
    below = text[text.index("<details>") :]
    assert "<code>P Value</code>" in below and f'"{old}"' in below and f'"{new}"' in below
