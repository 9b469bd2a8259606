"""``moe-cdk diff``: what a change does to the synthesized CloudFormation, as Markdown for a review.

Both sides are synthesized from their own code: the base revision in a temporary ``git
worktree`` (always removed), the head from the checkout's working tree. Each synth runs
``python app.py`` of that checkout in a subprocess with this interpreter, under a small
bootstrap that maps ``moe_cdk.constructs`` / ``moe_cdk.stacks`` / ``moe_cdk.training`` onto
that checkout's folders. Without it, ``import moe_cdk`` would go through the venv's editable
install and load whichever checkout was installed, so both sides would run the same code.

No AWS credentials are needed: synth never calls AWS.

Replacement rule: a resource is *replaced* when its logical id keeps a different ``Type``, or
when one of the properties listed in ``REPLACEMENT_PROPERTIES`` for its type changes. The list
is a documented subset of the CloudFormation resource reference: the properties whose entry
says "Update requires: Replacement". Any other change is reported as *modified* (it may still
interrupt the resource; CloudFormation's change set has the final word).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_cdk.training.schema import problem

EXIT_INVALID = 2
VALUE_WIDTH = 80
_ABSENT = object()

# Per type: property paths (dotted, relative to ``Properties``) whose change replaces the
# resource, per the CloudFormation resource reference's "Update requires: Replacement".
# A subset: the types this project deploys and a few common neighbours.
REPLACEMENT_PROPERTIES: dict[str, tuple[str, ...]] = {
    "AWS::FSx::FileSystem": (
        "FileSystemType", "FileSystemTypeVersion", "StorageType", "SubnetIds", "SecurityGroupIds",
        "KmsKeyId", "BackupId",
        "LustreConfiguration.DeploymentType", "LustreConfiguration.DriveCacheType",
        "LustreConfiguration.EfaEnabled", "LustreConfiguration.ImportPath",
        "LustreConfiguration.ExportPath", "LustreConfiguration.ImportedFileChunkSize",
    ),
    "AWS::FSx::DataRepositoryAssociation": (
        "FileSystemId", "FileSystemPath", "DataRepositoryPath", "BatchImportMetaDataOnCreate",
    ),
    "AWS::EC2::VPC": ("CidrBlock", "Ipv4IpamPoolId", "Ipv4NetmaskLength"),
    "AWS::EC2::Subnet": ("CidrBlock", "AvailabilityZone", "AvailabilityZoneId", "VpcId", "OutpostArn"),
    "AWS::EC2::RouteTable": ("VpcId",),
    "AWS::EC2::Route": ("RouteTableId", "DestinationCidrBlock", "DestinationIpv6CidrBlock"),
    "AWS::EC2::SubnetRouteTableAssociation": ("SubnetId", "RouteTableId"),
    "AWS::EC2::VPCEndpoint": ("ServiceName", "VpcId", "VpcEndpointType"),
    "AWS::EC2::SecurityGroup": ("GroupDescription", "GroupName", "VpcId"),
    "AWS::EC2::SecurityGroupIngress": (
        "GroupId", "IpProtocol", "FromPort", "ToPort", "CidrIp", "CidrIpv6",
        "SourceSecurityGroupId", "SourcePrefixListId",
    ),
    "AWS::EC2::SecurityGroupEgress": (
        "GroupId", "IpProtocol", "FromPort", "ToPort", "CidrIp", "CidrIpv6",
        "DestinationSecurityGroupId", "DestinationPrefixListId",
    ),
    "AWS::S3::Bucket": ("BucketName",),
    "AWS::SageMaker::Cluster": ("ClusterName", "VpcConfig"),
    "AWS::IAM::Role": ("RoleName", "Path"),
    "AWS::IAM::ManagedPolicy": ("ManagedPolicyName", "Path"),
    "AWS::Logs::LogGroup": ("LogGroupName",),
    "AWS::KMS::Key": (),
}

# A change under one of these property names is an IAM change whatever the resource type
# (role and resource policies); every AWS::IAM::* resource is one too.
IAM_PROPERTY_NAMES = frozenset({"PolicyDocument", "ManagedPolicyArns", "AssumeRolePolicyDocument",
                                "Policies", "KeyPolicy"})
# Likewise for security groups: rules and attachments; every AWS::EC2::SecurityGroup* resource.
SECURITY_GROUP_PROPERTY_NAMES = frozenset({"SecurityGroupIngress", "SecurityGroupEgress",
                                          "SecurityGroupIds", "SecurityGroups"})
# Template sections besides Resources that are listed, briefly, in their own section.
OTHER_SECTIONS = ("Parameters", "Outputs", "Conditions")
IGNORED_RESOURCE_TYPES = frozenset({"AWS::CDK::Metadata"})
IGNORED_RESOURCE_KEYS = frozenset({"Metadata"})


class SynthError(Exception):
    """A revision that does not synthesize; ``lines`` are its error lines, ``code`` the exit status to use."""

    def __init__(self, lines: list[str], code: int = EXIT_INVALID):
        self.lines = lines
        self.code = code
        super().__init__("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# Synthesis


# Runs argv[1]/app.py with moe_cdk.<folder> mapped onto argv[1]/<folder>, never the editable install.
_BOOTSTRAP = r"""
import importlib.machinery, runpy, sys, types
root = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()
for name in [n for n in sys.modules if n == "moe_cdk" or n.startswith("moe_cdk.")]:
    del sys.modules[name]
def package(name, path):
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = list(path)
    module = types.ModuleType(name)
    module.__spec__, module.__path__, module.__package__ = spec, spec.submodule_search_locations, name
    sys.modules[name] = module
    return module
top = package("moe_cdk", [])
for sub in ("constructs", "rules", "stacks", "training"):
    setattr(top, sub, package("moe_cdk." + sub, [root + "/" + sub]))
sys.argv = [root + "/app.py"]
sys.path[0] = root
runpy.run_path(root + "/app.py", run_name="__main__")
"""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def resolve_revision(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` names in ``repo``, or None when it names none."""
    if not ref or ref.startswith("-"):
        return None
    result = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    return result.stdout.strip() if result.returncode == 0 else None


def _synth_checkout(root: Path, config: str, outdir: Path) -> dict[str, dict]:
    outdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CDK_OUTDIR": str(outdir), "CDK_CONTEXT_JSON": json.dumps({"config": config}),
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    result = subprocess.run([sys.executable, "-c", _BOOTSTRAP, str(root)], cwd=root, env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()] or [f"synth exited {result.returncode}"]
        raise SynthError(lines, EXIT_INVALID if result.returncode == EXIT_INVALID else 1)
    return read_templates(outdir)


def read_templates(outdir: Path) -> dict[str, dict]:
    """{stack name: template} of a cloud assembly folder (its manifest.json, else every *.template.json)."""
    manifest = outdir / "manifest.json"
    templates: dict[str, dict] = {}
    if manifest.is_file():
        artifacts = json.loads(manifest.read_text()).get("artifacts", {})
        for artifact_id, artifact in artifacts.items():
            if artifact.get("type") != "aws:cloudformation:stack":
                continue
            properties = artifact.get("properties", {})
            name = properties.get("stackName") or artifact.get("displayName") or artifact_id
            templates[name] = json.loads((outdir / properties["templateFile"]).read_text())
        if templates:
            return templates
    for path in sorted(outdir.glob("*.template.json")):
        templates[path.name[: -len(".template.json")]] = json.loads(path.read_text())
    return templates


def synth_revision(ref: str | None, config: str, outdir: Path, repo: Path) -> dict[str, dict]:
    """Synthesize ``config`` at ``ref`` of ``repo`` (None: its working tree) into ``outdir``.

    ``config`` is a path relative to the checkout (as ``python app.py`` takes it), or absolute.
    A revision is checked out in a temporary worktree that is removed afterwards, even on failure.
    Raises SynthError with the error lines when it does not synthesize.
    """
    repo = Path(repo).resolve()
    outdir = Path(outdir).resolve()
    if ref is None:
        return _synth_checkout(repo, config, outdir)
    commit = resolve_revision(repo, ref)
    if commit is None:
        raise SynthError([_bad_ref_line(ref)])
    scratch = Path(tempfile.mkdtemp(prefix="moe-cdk-diff-"))
    worktree = scratch / "checkout"
    try:
        added = _git(repo, "worktree", "add", "--detach", "--quiet", str(worktree), commit)
        if added.returncode != 0:
            raise SynthError([f"{ref}: git worktree add failed: {added.stderr.strip()}"], 1)
        return _synth_checkout(worktree, config, outdir)
    finally:
        if worktree.exists():
            _git(repo, "worktree", "remove", "--force", str(worktree))
        shutil.rmtree(scratch, ignore_errors=True)
        _git(repo, "worktree", "prune")


def _bad_ref_line(ref: str) -> str:
    return "BASE_REF: " + problem("not a revision", got=ref, allowed="a commit, branch or tag")


# ---------------------------------------------------------------------------------------------
# Diff


@dataclass
class PropertyChange:
    path: str
    old: Any = _ABSENT
    new: Any = _ABSENT


@dataclass
class ResourceChange:
    logical_id: str
    type: str
    kind: str  # "added", "removed", "replaced" or "modified"
    changes: list[PropertyChange] = field(default_factory=list)
    replacement_reasons: list[str] = field(default_factory=list)
    iam: bool = False
    security_group: bool = False


@dataclass
class SectionChange:
    section: str  # "Parameters", "Outputs", ...
    name: str
    kind: str  # "added", "removed" or "modified"
    old: Any = _ABSENT
    new: Any = _ABSENT


@dataclass
class StackDiff:
    name: str
    status: str  # "added", "removed" or "changed"
    resources: list[ResourceChange] = field(default_factory=list)
    sections: list[SectionChange] = field(default_factory=list)


@dataclass
class Diff:
    stacks: list[StackDiff] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for stack in self.stacks for r in stack.resources if r.kind == kind)

    @property
    def iam(self) -> bool:
        return any(r.iam for stack in self.stacks for r in stack.resources)

    @property
    def security_group(self) -> bool:
        return any(r.security_group for stack in self.stacks for r in stack.resources)

    @property
    def empty(self) -> bool:
        return not self.stacks


def _value_changes(old: Any, new: Any, path: str) -> list[PropertyChange]:
    """The leaf paths where ``old`` and ``new`` differ (dicts by key, equal-length lists by index)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        changes = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            changes += _value_changes(old.get(key, _ABSENT), new.get(key, _ABSENT), sub)
        return changes
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        changes = []
        for index, (a, b) in enumerate(zip(old, new)):
            changes += _value_changes(a, b, f"{path}[{index}]")
        return changes
    return [PropertyChange(path, old, new)]


def _lookup(value: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return _ABSENT
        value = value[key]
    return value


def _path_names(path: str) -> set[str]:
    return {part.split("[", 1)[0] for part in path.split(".")}


def _is_iam_type(type_: str) -> bool:
    return type_.startswith("AWS::IAM::")


def _is_security_group_type(type_: str) -> bool:
    return type_.startswith("AWS::EC2::SecurityGroup")


def _set_flags(change: ResourceChange, types: list[str], names: set[str]) -> ResourceChange:
    """Flag ``change`` as IAM / security group when one of ``types`` is, or ``names`` holds such a property."""
    change.iam = any(_is_iam_type(t) for t in types) or bool(names & IAM_PROPERTY_NAMES)
    change.security_group = (any(_is_security_group_type(t) for t in types)
                             or bool(names & SECURITY_GROUP_PROPERTY_NAMES))
    return change


def _flag(change: ResourceChange) -> ResourceChange:
    """Set the IAM and security-group flags of a modified or replaced resource from its changed paths."""
    names = set().union(*(_path_names(c.path) for c in change.changes)) if change.changes else set()
    return _set_flags(change, [change.type], names)


def _resources(template: dict) -> dict[str, dict]:
    return {logical_id: {k: v for k, v in resource.items() if k not in IGNORED_RESOURCE_KEYS}
            for logical_id, resource in (template.get("Resources") or {}).items()
            if resource.get("Type") not in IGNORED_RESOURCE_TYPES}


def _whole(resource: dict, logical_id: str, kind: str) -> ResourceChange:
    """An added or removed resource; flagged when it is IAM / security group or carries a policy or rules."""
    properties = resource.get("Properties") or {}
    change = ResourceChange(logical_id, resource.get("Type", "?"), kind)
    return _set_flags(change, [change.type], set(properties))


def _diff_resource(logical_id: str, old: dict, new: dict) -> ResourceChange | None:
    if old == new:
        return None
    old_type, new_type = old.get("Type", "?"), new.get("Type", "?")
    if old_type != new_type:
        change = ResourceChange(logical_id, new_type, "replaced",
                                changes=[PropertyChange("Type", old_type, new_type)],
                                replacement_reasons=[f"Type {old_type} -> {new_type}"])
        return _set_flags(change, [old_type, new_type], set())
    changes: list[PropertyChange] = []
    for key in sorted(set(old) | set(new)):
        if key == "Type":
            continue
        if key == "Properties":
            changes += _value_changes(old.get(key) or {}, new.get(key) or {}, "")
        else:  # DependsOn, DeletionPolicy, UpdateReplacePolicy, Condition, ...
            changes += _value_changes(old.get(key, _ABSENT), new.get(key, _ABSENT), f"({key})")
    old_props, new_props = old.get("Properties") or {}, new.get("Properties") or {}
    reasons = [path for path in REPLACEMENT_PROPERTIES.get(new_type, ())
               if _lookup(old_props, path) != _lookup(new_props, path)]
    change = ResourceChange(logical_id, new_type, "replaced" if reasons else "modified",
                            changes=changes, replacement_reasons=reasons)
    return _flag(change)


def _diff_sections(old: dict, new: dict) -> list[SectionChange]:
    changes = []
    for section in OTHER_SECTIONS:
        a, b = old.get(section) or {}, new.get(section) or {}
        for name in sorted(set(a) | set(b)):
            if section == "Conditions" and name == "CDKMetadataAvailable":
                continue
            if name not in b:
                changes.append(SectionChange(section, name, "removed", old=a[name]))
            elif name not in a:
                changes.append(SectionChange(section, name, "added", new=b[name]))
            elif a[name] != b[name]:
                changes.append(SectionChange(section, name, "modified", a[name], b[name]))
    return changes


_ORDER = {"replaced": 0, "removed": 1, "added": 2, "modified": 3}


def diff_templates(old: dict[str, dict], new: dict[str, dict]) -> Diff:
    """Compare two {stack name: template} maps resource by resource (see the module docstring)."""
    diff = Diff()
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        status = "added" if a is None else "removed" if b is None else "changed"
        a, b = a or {}, b or {}
        ra, rb = _resources(a), _resources(b)
        resources: list[ResourceChange] = []
        for logical_id in sorted(set(ra) | set(rb)):
            if logical_id not in rb:
                resources.append(_whole(ra[logical_id], logical_id, "removed"))
            elif logical_id not in ra:
                resources.append(_whole(rb[logical_id], logical_id, "added"))
            else:
                change = _diff_resource(logical_id, ra[logical_id], rb[logical_id])
                if change is not None:
                    resources.append(change)
        resources.sort(key=lambda r: (_ORDER[r.kind], r.logical_id))
        sections = _diff_sections(a, b)
        if resources or sections or status != "changed":
            diff.stacks.append(StackDiff(name, status, resources, sections))
    return diff


# ---------------------------------------------------------------------------------------------
# Markdown


def short(value: Any, width: int = VALUE_WIDTH) -> str:
    """A value as compact JSON, cut to ``width`` characters."""
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def short_pair(old: Any, new: Any, width: int = VALUE_WIDTH) -> tuple[str, str]:
    """Both values shortened; when they share a long prefix, each starts shortly before the first difference."""
    a, b = short(old, 10**9), short(new, 10**9)
    if len(a) <= width and len(b) <= width:
        return a, b
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    start = max(0, common - 20)
    cut = [("…" + t[start:]) if start else t for t in (a, b)]
    return tuple(t if len(t) <= width else t[: width - 1] + "…" for t in cut)


def _change_text(old: Any, new: Any) -> str:
    a, b = short_pair(old, new)
    return f"{_code(a)} → {_code(b)}"


def _code(text: str) -> str:
    text = text.replace("|", "\\|").replace("`", "'")
    return f"`{text}`"


def _labels(change: ResourceChange) -> str:
    labels = {"replaced": "⚠ replacement", "added": "added", "removed": "removed", "modified": "modified"}
    parts = [labels[change.kind]]
    if change.iam:
        parts.append("🔒 IAM")
    if change.security_group:
        parts.append("🔒 security group")
    return " ".join(parts)


def _details(change: ResourceChange) -> str:
    lines = []
    if change.kind == "replaced":
        lines.append("replaced because " + ", ".join(_code(r) for r in change.replacement_reasons) + " changed")
    for c in change.changes:
        lines.append(f"{_code(c.path)}: {_change_text(c.old, c.new)}")
    return "<br>".join(lines) if lines else ("new resource" if change.kind == "added" else
                                             "deleted" if change.kind == "removed" else "")


def render_markdown(diff: Diff, base_label: str, head_label: str) -> str:
    """The diff as Markdown: heading, summary line, then one table per stack."""
    out = [f"## Infrastructure diff: {base_label} → {head_label}", ""]
    if diff.empty:
        out += ["No infrastructure changes.", ""]
        return "\n".join(out)
    counts = [f"{diff.count(kind)} {kind}" for kind in ("added", "removed", "replaced", "modified")]
    flags = []
    if diff.count("replaced"):
        flags.append("⚠ replacement")
    if diff.iam:
        flags.append("🔒 IAM")
    if diff.security_group:
        flags.append("🔒 security group")
    out += [f"**Summary:** {', '.join(counts)}" + (f"; flags: {', '.join(flags)}" if flags else "; no flags"), ""]
    for stack in diff.stacks:
        title = f"### {stack.name}"
        if stack.status != "changed":
            title += f" (stack {stack.status})"
        out += [title, ""]
        if stack.resources:
            out += ["| Change | Resource | Type | Details |", "|---|---|---|---|"]
            for change in stack.resources:
                out.append(f"| {_labels(change)} | {_code(change.logical_id)} | {change.type} | {_details(change)} |")
            out.append("")
        if stack.sections:
            out += ["Parameters and outputs:", ""]
            for s in stack.sections:
                detail = {"added": f"added {_code(short(s.new))}", "removed": "removed",
                          "modified": _change_text(s.old, s.new)}[s.kind]
                out.append(f"- {s.section} {_code(s.name)}: {detail}")
            out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Command line


def _report(lines: list[str], code: int) -> int:
    for line in lines:
        print(line, file=sys.stderr)
    return code


def _repo_root(start: Path) -> Path | None:
    result = _git(start, "rev-parse", "--show-toplevel")
    return Path(result.stdout.strip()) if result.returncode == 0 else None


def run(args: argparse.Namespace) -> int:
    """``moe-cdk diff``: Markdown of BASE_REF's templates against the working tree's."""
    repo = _repo_root(Path.cwd())
    if repo is None:
        return _report(["moe-cdk diff: " + problem("not inside a git checkout", got=str(Path.cwd()),
                                                   allowed="a git working tree")], EXIT_INVALID)
    commit = resolve_revision(repo, args.base_ref)
    if commit is None:
        return _report([_bad_ref_line(args.base_ref)], EXIT_INVALID)
    config = Path(args.config)
    absolute = config if config.is_absolute() else (Path.cwd() / config).resolve()
    try:  # the same file at both revisions: a path relative to the checkout
        config_arg = str(absolute.relative_to(repo.resolve()))
    except ValueError:
        config_arg = str(absolute)
    with tempfile.TemporaryDirectory(prefix="moe-cdk-diff-out-") as scratch:
        try:
            with ThreadPoolExecutor(2) as pool:  # each synth is a subprocess: run both at once
                head_job = pool.submit(synth_revision, None, config_arg, Path(scratch) / "head", repo)
                base_job = pool.submit(synth_revision, commit, config_arg, Path(scratch) / "base", repo)
                head, base = head_job.result(), base_job.result()
        except SynthError as error:
            return _report(error.lines, error.code)
    text = render_markdown(diff_templates(base, head), f"{args.base_ref} ({commit[:12]})", "working tree")
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def add_parser(subcommands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``diff`` on the ``moe-cdk`` subcommands."""
    parser = subcommands.add_parser(
        "diff", help="Markdown of what the working tree changes in the synthesized templates against BASE_REF")
    parser.add_argument("base_ref", metavar="BASE_REF", nargs="?", default="HEAD",
                        help="commit, branch or tag to compare against (default: HEAD)")
    parser.add_argument("--config", default="config/default.yaml",
                        help="configuration, relative to the checkout (default: config/default.yaml)")
    parser.add_argument("--output", metavar="FILE", help="write the Markdown here instead of stdout")
    parser.set_defaults(run=run)
    return parser
