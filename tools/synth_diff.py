"""``moe-cdk diff``: what a change does to the synthesized CloudFormation, as Markdown for a review.

Both sides are synthesized from their own code: the base revision in a temporary ``git
worktree`` (always removed), the head from the checkout's working tree. What ``make`` stages
outside git (``STAGED_INPUTS``: the HyperPod chart an EKS synth reads) belongs to no revision,
so the base worktree sees the checkout's own copy. Each synth runs
``python app.py`` of that checkout in a subprocess with this interpreter, under a small
bootstrap that maps each ``moe_cdk.<name>`` package onto that checkout's folder, as that
checkout's own ``pyproject.toml`` (``[tool.setuptools.package-dir]``) lays them out. Without it,
``import moe_cdk`` would go through the venv's editable install and load whichever checkout was
installed, so both sides would run the same code.

No AWS credentials are needed: synth never calls AWS.

Replacement rule: a resource is *replaced* when its logical id keeps a different ``Type``, or
when the value at one of its type's replacing properties changes. Those are what ``cdk diff``
itself reads: the CDK's service specification (``db.json.gz`` in the CDK CLI's package, which
``make setup`` installs), where a property, top-level or nested in a property type, carries
``causesReplacement: yes`` or ``maybe`` (see ``replacement_paths``). It merges the CloudFormation
registry schemas with the older resource specification, so it also knows the nested ones the
registry lacks (AWS::FSx::FileSystem's ``LustreConfiguration.DeploymentType``). A change at,
under or above such a path counts, and the reason names it dotted (``VpcConfig.SubnetIds``). A
type the specification does not know has none. Any other change is reported as *modified*; it may
still interrupt the resource, and CloudFormation's change set has the final word. ``IN_PLACE`` lists
the paths the specification marks but the service updates in place, with the evidence; a test keeps
each entry honest against the specification, cfn-lint's registry schema and botocore's update API.

Export rule: CloudFormation refuses to change or remove an exported output while another deployed stack
imports it (Template Reference, ``Fn::ImportValue``: "After another stack imports an output value, you
can't ... modify the exported output value"). An export *is blocked* when a base stack other than its
own imports it (``Fn::ImportValue`` of its name) and, at the head, the output is removed, its value
expression changes, or it refers (``Ref``, ``Fn::GetAtt``, ``${X}`` in ``Fn::Sub``) to a resource that is
replaced, added or removed, so its deployed value changes though its text does not.

Security rule: a change is a security change (``ResourceChange.security``) when it can change
access. It is flagged 🔒 IAM (who may do what) when it touches an AWS::IAM::* resource or one of
``ACCESS_RESOURCE_TYPES`` (EKS access entries, bucket policies), or any type's policy property
(``IAM_PROPERTY_NAMES``: a role's ``Policies``, a key's ``KeyPolicy``, ...); and 🔒 security group
(what may connect to what) when it touches an AWS::EC2::SecurityGroup* resource, or any type's
rule or attachment property (``SECURITY_GROUP_PROPERTY_NAMES``). An added or removed resource is
flagged by its type and the properties it has.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from moe_cdk.core.problems import EXIT_INVALID, ConfigError, Problem, problem

VALUE_WIDTH = 80
# A long value keeps this much shared text on each side of what changed, and what changed up to DIFFERENCE_WIDTH.
CONTEXT_WIDTH = 20
DIFFERENCE_WIDTH = 240
_ABSENT = object()

# A change under one of these property names is an IAM change whatever the resource type
# (role, key and resource policies: an AWS::KMS::Key's KeyPolicy is one).
IAM_PROPERTY_NAMES = frozenset(
    {"PolicyDocument", "ManagedPolicyArns", "AssumeRolePolicyDocument", "Policies", "KeyPolicy"}
)
# Besides every AWS::IAM::* type, the types whose every change is an IAM change: who may use the
# EKS cluster, and who may use the bucket.
ACCESS_RESOURCE_TYPES = frozenset({"AWS::EKS::AccessEntry", "AWS::S3::BucketPolicy"})
# Likewise for security groups: rules and attachments; every AWS::EC2::SecurityGroup* resource.
SECURITY_GROUP_PROPERTY_NAMES = frozenset(
    {"SecurityGroupIngress", "SecurityGroupEgress", "SecurityGroupIds", "SecurityGroups"}
)
# Paths the CDK's specification marks as replacing (from the legacy resource specification) that the
# service changes in place, and what happens instead. AWS::FSx::FileSystem's registry schema (cfn-lint's
# copy) does not list it among its createOnlyProperties, FSx's UpdateFileSystemLustreConfiguration takes
# it, and the FSx for Lustre User Guide ("Managing throughput capacity") says the throughput tier of a
# persistent SSD file system is raised or lowered in place while "Amazon FSx switches out the file
# system's file servers".
IN_PLACE = {
    ("AWS::FSx::FileSystem", ("LustreConfiguration", "PerUnitStorageThroughput")): (
        "updated in place: FSx switches the file servers, and the file system is unavailable for a few minutes"
    ),
}
# Template sections besides Resources that are listed, briefly, in their own section.
OTHER_SECTIONS = ("Parameters", "Outputs", "Conditions")
IGNORED_RESOURCE_TYPES = frozenset({"AWS::CDK::Metadata"})
IGNORED_RESOURCE_KEYS = frozenset({"Metadata"})
# Ignored folders of the checkout that synth reads: `make hyperpod-chart` stages the EKS chart under .cache.
STAGED_INPUTS = (".cache",)
# The header of the problem list that `report` prints (cli/report.py), e.g. "config/x.yaml: 2 problem(s)".
_PROBLEMS_HEADER = re.compile(r": \d+ problem\(s\)$")


# ---------------------------------------------------------------------------------------------
# Synthesis


# Runs argv[1]/app.py with each moe_cdk.<name> mapped onto the folder argv[1]/pyproject.toml gives it,
# never the editable install.
_BOOTSTRAP = r"""
import importlib.machinery, runpy, sys, tomllib, types
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
with open(root + "/pyproject.toml", "rb") as file:
    folders = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
top = package("moe_cdk", [])
for name, folder in folders.items():
    if name.count(".") == 1 and name.startswith("moe_cdk."):
        setattr(top, name.split(".")[1], package(name, [root + "/" + folder]))
sys.argv = [root + "/app.py"]
sys.path[0] = root
runpy.run_path(root + "/app.py", run_name="__main__")
"""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def repo_root(start: Path) -> Path | None:
    """The git working tree ``start`` is in, or None."""
    result = _git(start, "rev-parse", "--show-toplevel")
    return Path(result.stdout.strip()) if result.returncode == 0 else None


def resolve_revision(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` names in ``repo``, or None when it names none."""
    if not ref or ref.startswith("-"):
        return None
    result = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    return result.stdout.strip() if result.returncode == 0 else None


def _synth_checkout(root: Path, config: str, outdir: Path) -> dict[str, dict]:
    outdir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "CDK_OUTDIR": str(outdir),
        "CDK_CONTEXT_JSON": json.dumps({"config": config}),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        # Without aws-cdk-lib's built-in CloudFormation validation, which changes no template (make synth runs it):
        # aws-cdk-lib's core/lib/private/synthesis-validation.js skips it when CDK_VALIDATION is "false". It costs
        # about 6 s of CPU per revision here, most of it compiling its WebAssembly engine. cdk-nag still runs.
        "CDK_VALIDATION": "false",
    }
    result = subprocess.run(
        [sys.executable, "-c", _BOOTSTRAP, str(root)], cwd=root, env=env, capture_output=True, text=True
    )
    if result.returncode == EXIT_INVALID:  # the configuration, as that revision reads it, is invalid
        raise ConfigError(_reported_problems(result.stderr) or [Problem("", f"synth exited {result.returncode}")])
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()] or [f"synth exited {result.returncode}"]
        raise RuntimeError("\n".join(lines))
    return read_templates(outdir)


def _reported_problems(stderr: str) -> list[Problem]:
    """The problems under each ``<file>: N problem(s)`` header of ``stderr``, one per indented line
    right after it; other output (a library's warning, indented or not) is not one."""
    found: list[Problem] = []
    listing = False
    for line in stderr.splitlines():
        if _PROBLEMS_HEADER.search(line):
            listing = True
        elif listing and line.startswith("  "):
            found.append(Problem("", line.strip()))
        else:
            listing = False
    return found


def _link_staged_inputs(repo: Path, worktree: Path) -> None:
    for name in STAGED_INPUTS:
        if (repo / name).exists() and not (worktree / name).exists():
            (worktree / name).symlink_to(repo / name, target_is_directory=True)


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
    Raises ``ConfigError`` for a ref that is not a revision or a configuration that revision refuses,
    and ``RuntimeError`` with synth's error lines when it fails otherwise.
    """
    repo = Path(repo).resolve()
    outdir = Path(outdir).resolve()
    if ref is None:
        return _synth_checkout(repo, config, outdir)
    commit = resolve_revision(repo, ref)
    if commit is None:
        raise ConfigError([bad_ref_problem(ref)])
    scratch = Path(tempfile.mkdtemp(prefix="moe-cdk-diff-"))
    worktree = scratch / "checkout"
    try:
        added = _git(repo, "worktree", "add", "--detach", "--quiet", str(worktree), commit)
        if added.returncode != 0:
            raise RuntimeError(f"{ref}: git worktree add failed: {added.stderr.strip()}")
        _link_staged_inputs(repo, worktree)
        return _synth_checkout(worktree, config, outdir)
    finally:
        if worktree.exists():
            _git(repo, "worktree", "remove", "--force", str(worktree))
        shutil.rmtree(scratch, ignore_errors=True)
        _git(repo, "worktree", "prune")


def bad_ref_problem(ref: str) -> Problem:
    return problem("not a revision", got=ref, allowed="a commit, branch or tag").at("BASE_REF")


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
    notes: list[str] = field(default_factory=list)  # what an in-place update does (IN_PLACE)
    iam: bool = False  # may change who may do what (module docstring: security rule)
    security_group: bool = False  # may change what may connect to what

    @property
    def security(self) -> bool:
        """A security change: an IAM or a security-group one."""
        return self.iam or self.security_group


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
class BlockedExport:
    stack: str
    output: str
    export: str
    reason: str
    importers: list[str]


@dataclass
class Diff:
    stacks: list[StackDiff] = field(default_factory=list)
    blocked_exports: list[BlockedExport] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for stack in self.stacks for r in stack.resources if r.kind == kind)

    @property
    def iam(self) -> bool:
        return any(r.iam for stack in self.stacks for r in stack.resources)

    @property
    def security_group(self) -> bool:
        return any(r.security_group for stack in self.stacks for r in stack.resources)

    @property
    def security(self) -> bool:
        return self.iam or self.security_group

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


def service_spec_path() -> Path:
    """The CDK CLI's service specification, ``aws-cdk/db.json.gz``: the one in this environment's
    ``cdk-cli`` (``make setup``), else beside the ``cdk`` on PATH. FileNotFoundError when neither."""
    candidates = [Path(sys.prefix) / "cdk-cli/node_modules/aws-cdk"]
    if cdk := shutil.which("cdk"):
        candidates.append(Path(os.path.realpath(cdk)).parent.parent)  # <package>/bin/cdk
    for package in candidates:
        if (package / "db.json.gz").is_file():
            return package / "db.json.gz"
    raise FileNotFoundError(", ".join(str(p / "db.json.gz") for p in candidates))


@cache
def _service_spec() -> tuple[dict[str, dict], dict[str, dict]]:
    """(resources by CloudFormation type, property types by id) of the service specification."""
    with gzip.open(service_spec_path()) as handle:
        schema = json.load(handle)["schema"]
    resources = {r["cloudFormationType"]: r for r in schema["resource"]["entities"]}
    return resources, {t["$id"]: t for t in schema["typeDefinition"]["entities"]}


def _replacing(properties: dict, types: dict[str, dict], prefix: tuple[str, ...], seen: frozenset[str]):
    for name, prop in properties.items():
        keys = (*prefix, name)
        if prop.get("causesReplacement") in ("yes", "maybe"):
            yield keys
            continue
        kind = prop.get("type", {})
        if kind.get("type") in ("array", "map"):  # every item of a list or a map
            kind, keys = kind.get("element", {}), (*keys, "*")
        target = kind.get("reference", {}).get("$ref") if kind.get("type") == "ref" else None
        if target in types and target not in seen:
            yield from _replacing(types[target].get("properties", {}), types, keys, seen | {target})


@cache
def replacement_paths(resource_type: str) -> tuple[tuple[str, ...], ...]:
    """The properties of ``resource_type`` whose change replaces the resource, each as its keys under
    ``Properties`` (``"*"``: every item of a list or map); empty for a type the specification does not
    know. Cached: one walk per type per run."""
    resources, types = _service_spec()
    # A custom resource of any name is an AWS::CloudFormation::CustomResource (create-only ServiceToken).
    name = "AWS::CloudFormation::CustomResource" if resource_type.startswith("Custom::") else resource_type
    resource = resources.get(name)
    return tuple(_replacing(resource["properties"], types, (), frozenset())) if resource else ()


def _replacement_rule(resource_type: str) -> tuple[tuple[str, ...], ...]:
    """``replacement_paths`` less the ``IN_PLACE`` ones."""
    return tuple(p for p in replacement_paths(resource_type) if (resource_type, p) not in IN_PLACE)


def _at(value: Any, keys: tuple[str, ...]) -> Any:
    """The value at ``keys`` in ``value`` (``"*"``: every item's value, of a list or of a map by key), or _ABSENT."""
    if not keys:
        return value
    key, rest = keys[0], keys[1:]
    if key == "*":
        if isinstance(value, dict):
            return {name: _at(item, rest) for name, item in value.items()}
        return [_at(item, rest) for item in value] if isinstance(value, list) else _ABSENT
    return _at(value[key], rest) if isinstance(value, dict) and key in value else _ABSENT


def _path_text(keys: tuple[str, ...]) -> str:
    """A replacing path the way changed paths are written: ``VpcConfig.SubnetIds``, ``Rules[*].Name``."""
    return ".".join(keys).replace(".*", "[*]")


def _path_names(path: str) -> set[str]:
    return {part.split("[", 1)[0] for part in path.split(".")}


def _is_iam_type(type_: str) -> bool:
    """Whether every change to a resource of ``type_`` is an IAM change (see ACCESS_RESOURCE_TYPES)."""
    return type_.startswith("AWS::IAM::") or type_ in ACCESS_RESOURCE_TYPES


def _is_security_group_type(type_: str) -> bool:
    return type_.startswith("AWS::EC2::SecurityGroup")


def _set_flags(change: ResourceChange, types: list[str], names: set[str]) -> ResourceChange:
    """Flag ``change`` as IAM / security group when one of ``types`` is, or ``names`` holds such a property."""
    change.iam = any(_is_iam_type(t) for t in types) or bool(names & IAM_PROPERTY_NAMES)
    change.security_group = any(_is_security_group_type(t) for t in types) or bool(
        names & SECURITY_GROUP_PROPERTY_NAMES
    )
    return change


def _flag(change: ResourceChange) -> ResourceChange:
    """Set the IAM and security-group flags of a modified or replaced resource from its changed paths."""
    names = set().union(*(_path_names(c.path) for c in change.changes)) if change.changes else set()
    return _set_flags(change, [change.type], names)


def _resources(template: dict) -> dict[str, dict]:
    return {
        logical_id: {k: v for k, v in resource.items() if k not in IGNORED_RESOURCE_KEYS}
        for logical_id, resource in (template.get("Resources") or {}).items()
        if resource.get("Type") not in IGNORED_RESOURCE_TYPES
    }


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
        change = ResourceChange(
            logical_id,
            new_type,
            "replaced",
            changes=[PropertyChange("Type", old_type, new_type)],
            replacement_reasons=[f"Type {old_type} -> {new_type}"],
        )
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
    reasons = [_path_text(keys) for keys in _replacement_rule(new_type) if _at(old_props, keys) != _at(new_props, keys)]
    notes = [
        f"{_path_text(keys)}: {note}"
        for (type_, keys), note in IN_PLACE.items()
        if type_ == new_type and _at(old_props, keys) != _at(new_props, keys)
    ]
    change = ResourceChange(
        logical_id,
        new_type,
        "replaced" if reasons else "modified",
        changes=changes,
        replacement_reasons=reasons,
        notes=notes,
    )
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
_SUB_REFERENCE = re.compile(r"\$\{([A-Za-z0-9]+)(?:\.[A-Za-z0-9.]+)?\}")


def _referenced_ids(value: Any) -> set[str]:
    """The logical ids ``value`` refers to through Ref, Fn::GetAtt and Fn::Sub."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner)
            elif key == "Fn::GetAtt":
                target = inner[0] if isinstance(inner, list) and inner else inner
                if isinstance(target, str):
                    found.add(target.split(".", 1)[0])
            elif key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) and inner else inner
                if isinstance(text, str):
                    found |= set(_SUB_REFERENCE.findall(text))
                found |= _referenced_ids(inner[1:] if isinstance(inner, list) else None)
            else:
                found |= _referenced_ids(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= _referenced_ids(inner)
    return found


def _export_name(value: Any) -> str:
    """An export's name as ``Export.Name`` and ``Fn::ImportValue`` both spell it: the string, or compact JSON."""
    return value if isinstance(value, str) else short(value, 10**9)


def _imports(template: dict) -> set[str]:
    """The export names ``template`` imports (as compact JSON when a name is not a plain string)."""
    names: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "Fn::ImportValue":
                    names.add(_export_name(inner))
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(template.get("Resources") or {})
    walk(template.get("Outputs") or {})
    return names


def _blocked_exports(old: dict[str, dict], new: dict[str, dict], stacks: list[StackDiff]) -> list[BlockedExport]:
    """The export rule of the module docstring."""
    imported_by: dict[str, list[str]] = {}
    for name, template in old.items():
        for export in _imports(template):
            imported_by.setdefault(export, []).append(name)
    changed_ids = {
        stack.name: {r.logical_id: r.kind for r in stack.resources if r.kind != "modified"} for stack in stacks
    }
    blocked = []
    for name, template in sorted(old.items()):
        head_outputs = (new.get(name) or {}).get("Outputs") or {}
        for key, output in sorted((template.get("Outputs") or {}).items()):
            if "Export" not in output:
                continue
            export = _export_name(output["Export"].get("Name"))
            importers = sorted(n for n in imported_by.get(export, []) if n != name)
            if not importers:
                continue
            head = head_outputs.get(key)
            if head is None:
                reason = "the output is removed"
            elif head.get("Value") != output.get("Value"):
                reason = "its value changes"
            else:
                ids = sorted(i for i in _referenced_ids(head.get("Value")) if i in changed_ids.get(name, {}))
                if not ids:
                    continue
                reason = "its value comes from " + ", ".join(f"{i} ({changed_ids[name][i]})" for i in ids)
            blocked.append(BlockedExport(name, key, export, reason, importers))
    return blocked


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
    diff.blocked_exports = _blocked_exports(old, new, diff.stacks)
    return diff


# ---------------------------------------------------------------------------------------------
# Markdown


def short(value: Any, width: int = VALUE_WIDTH) -> str:
    """A value as compact JSON, cut to ``width`` characters."""
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def short_pair(old: Any, new: Any, width: int = VALUE_WIDTH) -> tuple[str, str, bool]:
    """Both values as compact JSON, and whether either was cut. Values that fit ``width`` stay whole. Longer ones
    lose only what both share, around the part that differs, which stays whole up to ``DIFFERENCE_WIDTH``
    characters (a changed hash or CIDR reads in full); past that the rest is cut, and the table points to the
    full values below it."""
    a, b = short(old, 10**9), short(new, 10**9)
    if len(a) <= width and len(b) <= width:
        return a, b, False
    prefix = len(os.path.commonprefix([a, b]))
    suffix = len(os.path.commonprefix([a[prefix:][::-1], b[prefix:][::-1]]))
    start = max(0, prefix - CONTEXT_WIDTH)
    shown, cut = [], False
    for text in (a, b):
        end = min(len(text), len(text) - suffix + CONTEXT_WIDTH)
        middle = text[start:end]
        if len(middle) > DIFFERENCE_WIDTH:
            middle, cut = middle[: DIFFERENCE_WIDTH - 1] + "…", True
        elif end < len(text):
            middle += "…"
        shown.append(("…" if start else "") + middle)
    return shown[0], shown[1], cut


def _change_text(old: Any, new: Any) -> str:
    a, b, cut = short_pair(old, new)
    return f"{_code(a)} → {_code(b)}" + (" (full values below)" if cut else "")


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
    lines += [f"ⓘ {note}" for note in change.notes]
    return (
        "<br>".join(lines)
        if lines
        else ("new resource" if change.kind == "added" else "deleted" if change.kind == "removed" else "")
    )


def _full_values(stack: StackDiff) -> list[str]:
    """A collapsed block with the whole old and new value of each change the table had to cut."""
    cut = [
        (f"{r.logical_id} {c.path}", c.old, c.new)
        for r in stack.resources
        for c in r.changes
        if short_pair(c.old, c.new)[2]
    ]
    cut += [
        (f"{s.section} {s.name}", s.old, s.new)
        for s in stack.sections
        if s.kind == "modified" and short_pair(s.old, s.new)[2]
    ]
    out = []
    for where, old, new in cut:
        out += [f"<details><summary>Full values: <code>{where}</code></summary>", ""]
        for label, value in (("before", old), ("after", new)):
            text = "(absent)" if value is _ABSENT else json.dumps(value, indent=2, sort_keys=True, default=str)
            out += [f"{label}:", "", "```json", text, "```", ""]
        out += ["</details>", ""]
    return out


PARALLELCLUSTER = "Custom::PclusterCluster"
PARALLELCLUSTER_PYTHON = ".venv-pcluster/bin/python"
"""ParallelCluster's own interpreter in a checkout (``make parallelcluster``)."""


def parallelcluster_notes(diff: Diff, old: dict[str, dict], new: dict[str, dict], repo: Path) -> None:
    """Note on each modified ParallelCluster cluster whether ParallelCluster applies the change to the running
    cluster or refuses it (a new cluster is needed), from its own ConfigPatch (cli/parallelcluster_patch.py, run with
    ParallelCluster's interpreter; without it, a note says how to set it up)."""
    python, script = repo / PARALLELCLUSTER_PYTHON, repo / "cli/parallelcluster_patch.py"
    for stack in diff.stacks:
        for change in stack.resources:
            if change.type != PARALLELCLUSTER or change.kind != "modified":
                continue
            configs = [t[stack.name]["Resources"][change.logical_id]["Properties"].get("ClusterConfiguration") for t in
                       (old, new)]  # fmt: skip
            if configs[0] == configs[1]:
                continue
            if not python.exists():
                change.notes.append(
                    "ParallelCluster's update check did not run: `make parallelcluster` sets up its code"
                )
                continue
            with tempfile.TemporaryDirectory(prefix="moe-cdk-pcluster-") as folder:
                paths = [Path(folder) / f"{side}.json" for side in ("old", "new")]
                for path, config in zip(paths, configs):
                    path.write_text(json.dumps(config))
                done = subprocess.run([str(python), str(script), *map(str, paths)], capture_output=True, text=True,
                                      timeout=120, check=False)  # fmt: skip
            if done.returncode != 0:
                change.notes.append(f"ParallelCluster's update check failed: {done.stderr.strip()[-300:]}")
                continue
            change.notes += _patch_notes(json.loads(done.stdout))


def _patch_notes(result: dict) -> list[str]:
    verdict = (
        "ParallelCluster applies this change to the running cluster"
        if result["applies"]
        else "ParallelCluster refuses this change to the running cluster (the update fails; a new cluster is needed)"
    )
    details = [
        f"{c['path']}: {c['check']}" + (f" ({c['reason']})" if c["reason"] not in (None, "-") else "")
        + (f"; {c['action']}" if c["action"] else "")
        for c in result["changes"]
        if c["check"] != "SUCCEEDED"
    ]  # fmt: skip
    return [verdict, *details]


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
    if diff.blocked_exports:
        flags.append(f"⛔ {len(diff.blocked_exports)} export(s) in use change")
    out += [f"**Summary:** {', '.join(counts)}" + (f"; flags: {', '.join(flags)}" if flags else "; no flags"), ""]
    if diff.blocked_exports:
        out += [
            "### ⛔ Exports in use",
            "",
            "CloudFormation refuses to change or remove an export that a deployed stack imports, so this deploy fails "
            "at the first of these stacks until the importers stop importing it:",
            "",
        ]
        for b in diff.blocked_exports:
            importers = ", ".join(_code(i) for i in b.importers)
            where = f"{_code(b.stack)} output {_code(b.output)} (export {_code(b.export)})"
            out.append(f"- {where}: {b.reason}; imported by {importers}")
        out.append("")
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
                detail = {
                    "added": f"added {_code(short(s.new))}",
                    "removed": "removed",
                    "modified": _change_text(s.old, s.new),
                }[s.kind]
                out.append(f"- {s.section} {_code(s.name)}: {detail}")
            out.append("")
        out += _full_values(stack)
    return "\n".join(out)
