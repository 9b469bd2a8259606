"""An architecture diagram of a synthesized app, drawn from cdk.out alone.

``python -m moe_cdk.cli.diagram --cdk-out cdk.out --output docs/architecture.png`` reads the cloud assembly that
``make synth`` wrote (manifest, templates, asset manifests); no CDK import, so it runs wherever Python, the ``graphviz``
package and Graphviz's ``dot`` do. Three steps:

- ``Index`` reads the templates once: every resource and, per property path, the resources it refers to (``Ref``,
  ``Fn::GetAtt``, ``Fn::Sub``, cross-stack ``Fn::ImportValue`` / ``Fn::GetStackOutput``), and who refers to whom,
  so that drawing is lookups (``Index.linked``) rather than a scan of the templates per question.
- ``draw`` puts each significant resource in a node (its own, or a counted one per group: subnets, endpoints,
  parameters), leaves supporting ones out (route tables, policies, custom-resource handlers), labels nodes from their
  properties and draws edges from references, so the picture follows the configuration with no per-config code.
- ``to_graph`` lays that out as a ``graphviz.Digraph`` (a cluster per stack and per VPC); the package writes and
  quotes the DOT source, and renders it with ``dot``.

Exit codes: 0 written, 2 the command line is invalid, the assembly cannot be read, or ``dot`` is missing or fails.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import graphviz

from moe_cdk.core.problems import ConfigError, problem

TAG_DEPLOYMENT = "moe-cdk:deployment"
INTERNET, EXISTING_SUBNETS = "internet", "existing_subnets"
NO_DOT = "the `dot` command (Graphviz) is not installed; install it with: apt-get install graphviz"
Key = tuple[str, str]  # (stack name, logical id)
Rule = tuple[str, str, "Key | str"]  # ("in" or "out", ports, peer: a security group's key, or a CIDR / prefix list)


class T:
    """The resource types this module looks into."""

    VPC, SUBNET, ROUTE, ASSOCIATION = (
        "AWS::EC2::VPC",
        "AWS::EC2::Subnet",
        "AWS::EC2::Route",
        "AWS::EC2::SubnetRouteTableAssociation",
    )
    NAT, IGW, ATTACHMENT = "AWS::EC2::NatGateway", "AWS::EC2::InternetGateway", "AWS::EC2::VPCGatewayAttachment"
    FLOW_LOG, ENDPOINT, SG = "AWS::EC2::FlowLog", "AWS::EC2::VPCEndpoint", "AWS::EC2::SecurityGroup"
    FSX, DRA, BUCKET = "AWS::FSx::FileSystem", "AWS::FSx::DataRepositoryAssociation", "AWS::S3::Bucket"
    PARAMETER, KEY, HYPERPOD = "AWS::SSM::Parameter", "AWS::KMS::Key", "AWS::SageMaker::Cluster"
    ROLE, POLICY = "AWS::IAM::Role", "AWS::IAM::Policy"
    EKS, ADDON, ACCESS = "AWS::EKS::Cluster", "AWS::EKS::Addon", "AWS::EKS::AccessEntry"
    PROMETHEUS, RULES, SCRAPER = "AWS::APS::Workspace", "AWS::APS::RuleGroupsNamespace", "AWS::APS::Scraper"
    GRAFANA = "AWS::Grafana::Workspace"


ROUTE_TARGETS = ("NatGatewayId", "GatewayId", "TransitGatewayId")
# The category (node style) of each type drawn as a node of its kind; a role is drawn if one of the others uses it.
CATEGORIES = {
    T.SUBNET: "network",
    T.NAT: "network",
    T.IGW: "network",
    T.ENDPOINT: "endpoint",
    T.SG: "security",
    T.FSX: "storage",
    T.DRA: "config",
    T.BUCKET: "bucket",
    T.PARAMETER: "config",
    T.KEY: "security",
    T.HYPERPOD: "compute",
    T.ROLE: "security",
    T.EKS: "compute",
    T.ADDON: "config",
    T.ACCESS: "security",
    T.PROMETHEUS: "observability",
    T.RULES: "config",
    T.SCRAPER: "observability",
    T.GRAFANA: "observability",
}
# Never a node: VPCs (drawn as clusters), routing plumbing, policies, log groups, CDK's custom-resource machinery.
HIDDEN = {
    T.VPC,
    "AWS::EC2::EIP",
    T.ROUTE,
    "AWS::EC2::RouteTable",
    T.ATTACHMENT,
    T.ASSOCIATION,
    T.FLOW_LOG,
    "AWS::EC2::SecurityGroupIngress",
    "AWS::EC2::SecurityGroupEgress",
    T.POLICY,
    "AWS::IAM::ManagedPolicy",
    "AWS::Lambda::Function",
    "AWS::S3::BucketPolicy",
    "AWS::CDK::Metadata",
    "AWS::Logs::LogGroup",
    "AWS::Lambda::LayerVersion",  # kubectl, helm and the AWS CLI for the CDK's EKS handlers
}
# The SSM parameter aws-eks-v2 uses to order its kubectl handler after the cluster: plumbing, not configuration.
KUBECTL_BARRIER = "aws:cdk:eks:kubectl-ready"
HIDDEN_PREFIXES = ("Custom::", "AWS::CloudFormation::")
# Edges that are one reference each: (type, property path, edge label, kind, drawn from the referred-to resource).
REFERENCE_EDGES = [
    (T.NAT, "SubnetId", "", "network", False),
    (T.ENDPOINT, "SubnetIds", "PrivateLink", "network", True),
    (T.ENDPOINT, "SecurityGroupIds", "", "wiring", False),
    (T.FSX, "SecurityGroupIds", "", "wiring", False),
    (T.FSX, "SubnetIds", "in subnet", "wiring", False),
    (T.FSX, "KmsKeyId", "encrypts", "wiring", True),
    (T.HYPERPOD, "VpcConfig.SecurityGroupIds", "VPC security group", "wiring", False),
    (T.HYPERPOD, "VpcConfig.Subnets", "ENIs in", "network", False),
    (T.PARAMETER, "Value", "", "wiring", True),
    (T.BUCKET, "LoggingConfiguration.DestinationBucketName", "access logs", "wiring", False),
    (T.EKS, "ResourcesVpcConfig.SubnetIds", "control plane ENIs in", "network", False),
    (T.EKS, "ResourcesVpcConfig.SecurityGroupIds", "", "wiring", False),
    (T.EKS, "EncryptionConfig.Provider.KeyArn", "encrypts secrets", "wiring", True),
    (T.ADDON, "ClusterName", "installs", "wiring", True),
    (T.ACCESS, "ClusterName", "may use", "wiring", False),
    (T.HYPERPOD, "Orchestrator.Eks.ClusterArn", "nodes join", "data", False),
    (T.SCRAPER, "Source.EksConfiguration.ClusterArn", "scrapes pods", "data", True),
    (T.SCRAPER, "Destination.AmpConfiguration.WorkspaceArn", "remote write", "data", False),
    (T.RULES, "Workspace", "evaluated in", "wiring", False),
]
# Where an existing VPC's subnets appear as literal IDs; they share one node outside the stacks.
EXISTING_SUBNET_PATHS = {(T.FSX, "SubnetIds"), (T.HYPERPOD, "VpcConfig.Subnets")}

# Node styles by category: (shape, fill colour, border colour); edge styles by kind; cluster and graph attributes.
STYLES = {
    "network": ("box", "#E8F5E9", "#2E7D32"),
    "endpoint": ("box", "#F1F8E9", "#558B2F"),
    "security": ("box", "#FDECEA", "#C62828"),
    "storage": ("cylinder", "#FFF3E0", "#E65100"),
    "bucket": ("cylinder", "#FFF8E1", "#FF8F00"),
    "config": ("note", "#FFFDE7", "#9E9D24"),
    "compute": ("box3d", "#E3F2FD", "#1565C0"),
    "image": ("component", "#F3E5F5", "#6A1B9A"),
    "observability": ("box", "#E0F7FA", "#00838F"),
    "external": ("ellipse", "#ECEFF1", "#455A64"),
    "other": ("box", "#FAFAFA", "#616161"),
}
EDGE_STYLES = {
    "data": {"color": "#1565C0", "penwidth": "2.2", "fontcolor": "#0D47A1"},
    "network": {"color": "#2E7D32", "penwidth": "1.6", "fontcolor": "#1B5E20"},
    "wiring": {"color": "#757575", "style": "dashed", "fontcolor": "#424242"},
}
GRAPH_ATTR = {
    "labelloc": "t",
    "fontsize": "22",
    "fontname": "Helvetica-Bold",
    "rankdir": "TB",
    "newrank": "true",
    "nodesep": "0.3",
    "ranksep": "0.6",
    "compound": "true",
    "pad": "0.3",
    "dpi": "96",
    "size": "18.5,40",
}
STACK_ATTR = {
    "labeljust": "l",
    "fontsize": "14",
    "fontname": "Helvetica-Bold",
    "style": "rounded,filled",
    "color": "#90A4AE",
}
VPC_ATTR = {
    "labeljust": "l",
    "fontsize": "12",
    "fontname": "Helvetica",
    "style": "dashed,rounded",
    "color": "#2E7D32",
    "fillcolor": "#FFFFFF",
}
STACK_FILL = ["#FAFAFA", "#F5F9FF", "#FFFAF5", "#F9F5FF"]
LEGEND = (
    '<<table border="0" cellborder="0" cellspacing="2"><tr><td align="left"><b>Edges</b></td></tr>'
    '<tr><td align="left"><font color="#1565C0">━━ data flow</font></td></tr>'
    '<tr><td align="left"><font color="#2E7D32">━━ network path</font></td></tr>'
    '<tr><td align="left"><font color="#757575">╌╌ wiring: security groups, roles, keys, parameters</font>'
    "</td></tr></table>>"
)


@dataclass
class Stack:
    name: str
    region: str
    template: dict
    images: dict[str, dict]  # the docker image assets of its asset manifest


@dataclass
class Resource:
    key: Key
    type: str
    props: dict
    refs: dict[str, list[Key]]  # dotted property path ("" for all properties) -> resources referred to, in order


def load_stacks(cdk_out: Path) -> list[Stack]:
    """The stacks of the assembly in ``cdk_out``, dependencies first, then by name."""
    no_app = ConfigError(
        [problem("no synthesized app", got=str(cdk_out), allowed="a folder written by make synth").at("--cdk-out")]
    )
    try:
        artifacts = json.loads((Path(cdk_out) / "manifest.json").read_text()).get("artifacts", {})
    except (OSError, ValueError) as error:
        raise no_app from error
    stacks: dict[str, Stack] = {}
    for artifact_id, artifact in artifacts.items():
        if artifact.get("type") == "aws:cloudformation:stack":
            props, images = artifact.get("properties", {}), {}
            for dep in (artifacts.get(d, {}) for d in artifact.get("dependencies", [])):
                asset_file = Path(cdk_out) / dep.get("properties", {}).get("file", "")
                if dep.get("type") == "cdk:asset-manifest" and asset_file.is_file():
                    images.update(json.loads(asset_file.read_text()).get("dockerImages", {}))
            template = json.loads((Path(cdk_out) / props["templateFile"]).read_text())
            region = artifact.get("environment", "").rsplit("/", 1)[-1]
            stacks[artifact_id] = Stack(props.get("stackName", artifact_id), region, template, images)
    if not stacks:
        raise no_app

    def depth(artifact_id: str, seen: frozenset[str] = frozenset()) -> int:
        parents = [d for d in artifacts[artifact_id].get("dependencies", []) if d in stacks and d not in seen]
        return 1 + max((depth(d, seen | {artifact_id}) for d in parents), default=-1)

    return [stacks[a] for a in sorted(stacks, key=lambda a: (depth(a), stacks[a].name))]


def _paths(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every property nested in ``value``, not entering intrinsics; list items share a path."""
    if isinstance(value, list):
        for item in value:
            yield from _paths(item, prefix)
    elif isinstance(value, dict) and not (len(value) == 1 and re.match(r"Ref$|Fn::", next(iter(value)))):
        for name, item in value.items():
            yield (path := f"{prefix}.{name}".lstrip(".")), item
            yield from _paths(item, path)


class Index:
    """Every resource of the assembly and the references between them, read in one pass."""

    def __init__(self, stacks: list[Stack]):
        self.stacks, self.templates = stacks, {s.name: s.template for s in stacks}
        self.exports = {
            self.text(s.name, out["Export"]["Name"]): (s.name, out.get("Value"))
            for s in stacks
            for out in s.template.get("Outputs", {}).values()
            if "Name" in out.get("Export", {})
        }
        self.resources: dict[Key, Resource] = {}
        self.referrers: dict[Key, list[Resource]] = defaultdict(list)  # resource -> the resources referring to it
        for stack in stacks:
            for lid, raw in sorted(stack.template.get("Resources", {}).items()):
                props, refs = raw.get("Properties", {}), defaultdict(list)
                for path, value in [("", props), *_paths(props)]:
                    refs[path] = list(dict.fromkeys(refs[path] + self.resolve(stack.name, value)[1]))
                resource = self.resources[(stack.name, lid)] = Resource(
                    (stack.name, lid), raw.get("Type", ""), props, dict(refs)
                )
                for target in refs[""]:
                    self.referrers[target].append(resource)

    def resolve(self, stack: str, value: Any) -> tuple[str, list[Key]]:
        """``value`` as text, and the resources it refers to in order of appearance.

        References are written ``${LogicalId}`` / ``${AWS::Region}`` and cross-stack values are followed, so two
        spellings of one name (``Fn::Join`` in one stack, ``Fn::Sub`` in another) give the same text."""
        refs: list[Key] = []

        def walk(stack: str, value: Any) -> str:
            if isinstance(value, str):
                return value
            if isinstance(value, list):
                return ",".join(walk(stack, item) for item in value)
            if not isinstance(value, dict):
                return json.dumps(value)
            fn, arg = next(iter(value.items())) if len(value) == 1 else (None, None)
            if fn in ("Ref", "Fn::GetAtt"):
                name = ".".join(arg) if isinstance(arg, list) else str(arg)
                if name.split(".")[0] in self.templates[stack].get("Resources", {}):
                    refs.append((stack, name.split(".")[0]))
                return "${" + name + "}"
            if fn == "Fn::Join":
                return str(arg[0]).join(walk(stack, item) for item in _listed(arg[1]))
            if fn == "Fn::Sub":
                template, variables = arg if isinstance(arg, list) else (arg, {})
                return re.sub(r"\$\{([^}!]+)\}", lambda m: walk(stack, variables.get(m[1], {"Ref": m[1]})), template)
            if fn == "Fn::GetStackOutput" and isinstance(arg, dict) and arg.get("StackName") in self.templates:
                output = self.templates[arg["StackName"]].get("Outputs", {}).get(arg.get("OutputName"), {})
                return walk(arg["StackName"], output.get("Value"))
            if fn == "Fn::If" and isinstance(arg, list) and len(arg) == 3:  # either branch; no value reads as none
                branches = [walk(stack, branch) for branch in arg[1:] if branch != {"Ref": "AWS::NoValue"}]
                return " | ".join(branches) + (f" (if {arg[0]})" if len(branches) == 1 else "")
            if fn == "Fn::ImportValue" and self.text(stack, arg) in self.exports:
                return walk(*self.exports[self.text(stack, arg)])
            for item in value.values():
                walk(stack, item)  # only for the references in it
            return json.dumps(value, sort_keys=True)

        return walk(stack, value), list(dict.fromkeys(refs))

    def text(self, stack: str, value: Any) -> str:
        return self.resolve(stack, value)[0]

    def of_type(self, type_: str) -> list[Resource]:
        """Every resource of ``type_``, in stack order, then by logical id."""
        return [r for r in self.resources.values() if r.type == type_]

    def linked(self, key: Key, type_: str, path: str) -> list[Resource]:
        """The resources of ``type_`` whose property ``path`` refers to ``key``."""
        return [r for r in self.referrers[key] if r.type == type_ and key in r.refs.get(path, [])]


@dataclass
class Node:
    id: str
    category: str
    stack: str | None = None  # None: outside every stack (the internet, existing subnets)
    vpc: str | None = None  # the VPC sub-cluster it is drawn in, if any
    members: list[Resource] = field(default_factory=list)
    label: str = ""


@dataclass
class Diagram:
    """What ``to_graph`` draws: nodes (and the node each resource is drawn in), edges, and VPC clusters."""

    title: str
    vpcs: dict[str, tuple[str, str]]  # sub-cluster id -> (stack, label)
    rules: dict[Key, list[Rule]]  # security group -> its rules, for labels and edges
    nodes: dict[str, Node] = field(default_factory=dict)
    node_of: dict[Key, str] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], tuple[str, bool]] = field(default_factory=dict)  # (tail, head, label) -> kind

    def of(self, keys: Iterable[Key]) -> list[str]:
        """The nodes the resources ``keys`` are drawn in."""
        return list(dict.fromkeys(self.node_of[k] for k in keys if k in self.node_of))

    def edge(self, tail: str, head: str, label: str = "", kind: str = "wiring", both: bool = False) -> None:
        if tail != head and tail in self.nodes and head in self.nodes:
            self.edges[(tail, head, label)] = (kind, both)


def _slug(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9]+", "_", p).strip("_").lower() for p in parts if p)


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _at(props: dict, path: str) -> Any:
    """The property at dotted ``path``, ``{}`` where there is none."""
    for name in path.split("."):
        props = props.get(name, {}) if isinstance(props, dict) else {}
    return props


def _tag(props: dict, name: str) -> str | None:
    """Tag ``name``'s value if it is a string; tags are Key/Value pairs, or a map on some types."""
    tags = props.get("Tags", {})
    pairs = (
        tags.items()
        if isinstance(tags, dict)
        else [(t.get("Key"), t.get("Value")) for t in tags if isinstance(t, dict)]
    )
    return next((value for key, value in pairs if key == name and isinstance(value, str)), None)


def _counted(noun: str, count: int, items: list[str] | None = None, separator: str = " ", per_line: int = 1) -> str:
    """``Private subnet us-east-2a``, or ``Private subnets ×2`` with the items below, ``per_line`` to a line."""
    items = items or []
    if count == 1:
        return f"{noun}{separator}{items[0]}" if items else noun
    return "\n".join(
        [f"{noun}s ×{count}"] + [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    )


def _humanize(name: str) -> str:
    """``TrainingImage`` -> ``Training image``."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", name)
    return " ".join([words[0]] + [w.lower() for w in words[1:]]) if words else name


def _ports(rule: dict) -> str:
    protocol, low, high = str(rule.get("IpProtocol", "-1")), rule.get("FromPort"), rule.get("ToPort")
    name = {"6": "tcp", "17": "udp", "1": "icmp"}.get(protocol, protocol).upper()
    if protocol in ("-1", "all"):
        return "all traffic"
    if low is None or (low, high) in ((0, 65535), (-1, -1)):
        return f"{name} all"
    return f"{name} {low}" if low == high else f"{name} {low}-{high}"


def _merge_ports(ports: list[str]) -> str:
    """``TCP 988``, ``TCP 1018-1023`` -> ``TCP 988, 1018-1023``."""
    by_protocol: dict[str, list[str]] = defaultdict(list)
    for port in dict.fromkeys(ports):
        protocol, _, rest = port.partition(" ")
        by_protocol[protocol if rest else port] += [rest] if rest else []

    def first_port(rest: str) -> tuple[int, str]:
        return int(rest.split("-")[0]) if rest.split("-")[0].isdigit() else -1, rest

    return ", ".join(
        " ".join([protocol, *([", ".join(sorted(rests, key=first_port))] if rests else [])])
        for protocol, rests in sorted(by_protocol.items())
    )


def _subnet_kind(ix: Index, subnet: Resource) -> str:
    """Public (default route to an internet gateway), Private (to a NAT or transit gateway), else as tagged."""
    targets = {
        target
        for association in ix.linked(subnet.key, T.ASSOCIATION, "SubnetId")
        for table in association.refs.get("RouteTableId", [])
        for route in ix.linked(table, T.ROUTE, "RouteTableId")
        for target in ROUTE_TARGETS
        if target in route.props
    }
    if targets:
        return "Public" if "GatewayId" in targets else "Private"
    tagged = _tag(subnet.props, "aws-cdk:subnet-type")
    return tagged or ("Public" if subnet.props.get("MapPublicIpOnLaunch") else "Isolated")


def _table_subnets(ix: Index, tables: list[Key]) -> list[Key]:
    return [s for t in tables for a in ix.linked(t, T.ASSOCIATION, "RouteTableId") for s in a.refs.get("SubnetId", [])]


def _existing_subnets(ix: Index, resource: Resource, path: str) -> list[str]:
    """The subnet IDs written literally (an existing VPC's) in ``resource``'s property ``path``."""
    texts = (ix.text(resource.key[0], item) for item in _listed(_at(resource.props, path)))
    return [text for text in texts if text.startswith("subnet-")]


def _holds_lifecycle_scripts(ix: Index, bucket: Resource, cluster: Resource) -> bool:
    """Whether ``cluster``'s instance groups run lifecycle scripts from ``bucket``."""
    name = ix.text(bucket.key[0], bucket.props.get("BucketName", ""))
    uris = (
        ix.text(cluster.key[0], group.get("LifeCycleConfig", {}).get("SourceS3Uri", ""))
        for group in cluster.props.get("InstanceGroups", [])
    )
    return bool(name) and any(re.match(rf"s3://{re.escape(name)}(/|$)", uri) for uri in uris)


def _dra_flows(props: dict) -> list[str]:
    """What a data repository association moves: "import" (S3 into the file system), "export" (back), both, none."""
    s3 = props.get("S3", {})
    return [
        kind
        for kind, on in (
            ("import", "AutoImportPolicy" in s3 or props.get("BatchImportMetaDataOnCreate")),
            ("export", "AutoExportPolicy" in s3),
        )
        if on
    ]


def _rules(ix: Index, group: Resource) -> list[Rule]:
    """Every rule of security ``group``, written inline or as resources of their own."""
    found: list[Rule] = []
    for direction, kind, peer_field in (
        ("in", "Ingress", "SourceSecurityGroupId"),
        ("out", "Egress", "DestinationSecurityGroupId"),
    ):
        written = [(group.key[0], rule) for rule in group.props.get(f"SecurityGroup{kind}", [])]
        written += [(r.key[0], r.props) for r in ix.linked(group.key, f"AWS::EC2::SecurityGroup{kind}", "GroupId")]
        for stack, rule in written:
            cidr = rule.get("CidrIp", rule.get("CidrIpv6"))
            peers = ix.resolve(stack, rule.get(peer_field))[1] if cidr is None else []
            other = cidr or rule.get(peer_field, rule.get("SourcePrefixListId", "?"))
            peer = peers[0] if peers else ix.text(stack, other)
            if not (direction == "out" and peer == "255.255.255.255/32"):  # CDK's placeholder for "no egress"
                found.append((direction, _ports(rule), peer))
    return found


def _place(ix: Index, d: Diagram, resource: Resource) -> tuple[str, str | None] | None:
    """(node id, VPC sub-cluster) of the node ``resource`` is drawn in; None if it is left out."""
    (stack, lid), type_ = resource.key, resource.type
    if type_ not in CATEGORIES:
        return None if type_ in HIDDEN or type_.startswith(HIDDEN_PREFIXES) else (_slug(stack, type_), None)
    if type_ == T.ROLE and not any(u.type in CATEGORIES and u.type != T.ROLE for u in ix.referrers[resource.key]):
        return None  # the roles of flow logs, custom resources and the like
    # In a VPC's cluster: what names the VPC (subnets, endpoints, groups), or whose subnet or attachment does.
    others = [ix.resources[s] for s in resource.refs.get("SubnetId", [])]
    others += ix.linked(resource.key, T.ATTACHMENT, "InternetGatewayId")
    vpc = next(
        (
            _slug(*v)
            for r in [resource, *others]
            for v in r.refs.get("VpcId", [])
            if v[0] == r.key[0] and _slug(*v) in d.vpcs
        ),
        None,
    )
    match type_:
        case T.SUBNET:
            return _slug(stack, "subnet", _subnet_kind(ix, resource)), vpc
        case T.NAT | T.IGW:
            return _slug(stack, "NAT gateway" if type_ == T.NAT else "Internet gateway"), vpc
        case T.ENDPOINT:
            return _slug(stack, resource.props.get("VpcEndpointType", "Gateway"), "endpoints"), vpc
        case T.PARAMETER:
            return None if resource.props.get("Value") == KUBECTL_BARRIER else (_slug(stack, "ssm_parameters"), vpc)
        case T.ADDON | T.ACCESS:  # one node per EKS cluster
            clusters = [k for k in resource.refs.get("ClusterName", []) if ix.resources[k].type == T.EKS]
            return _slug(*(clusters[0] if clusters else [stack]), type_), vpc
        case T.DRA:  # one node per file system
            fs = [k for k in resource.refs.get("FileSystemId", []) if ix.resources[k].type == T.FSX]
            return _slug(*(fs[0] if fs else [stack]), "data_repository_associations"), vpc
    return _slug(stack, lid), vpc


def _security_group_label(ix: Index, d: Diagram, key: Key) -> str:
    """What uses the group (endpoints, a file system, EFA: all traffic to and from itself), then its rules."""

    def role(group: Key) -> str:
        if ix.linked(group, T.ENDPOINT, "SecurityGroupIds"):
            return "Endpoint security group"
        if users := ix.linked(group, T.FSX, "SecurityGroupIds"):
            kind = users[0].props.get("FileSystemType", "")
            return f"FSx for {kind.title()} security group" if kind else "FSx security group"
        efa = all((direction, "all traffic", group) in d.rules[group] for direction in ("in", "out"))
        return "EFA security group" if efa else "Security group"

    def name(peer: Key | str) -> str:
        if peer == key or isinstance(peer, str):
            return "self" if peer == key else str(peer)
        return role(peer).replace(" security group", " SG") if peer in d.rules else "?"

    lines = [role(key)]
    for direction, word in (("in", "from"), ("out", "to")):
        by_peer: dict[str, list[str]] = defaultdict(list)
        for _, ports, peer in (rule for rule in d.rules[key] if rule[0] == direction):
            by_peer[name(peer)].append(ports)
        by_ports: dict[str, list[str]] = defaultdict(list)
        for peer, ports in by_peer.items():
            by_ports[_merge_ports(ports)].append(peer)
        lines += [
            f"{direction}: {ports} {word} {', '.join(sorted(peers))}" for ports, peers in sorted(by_ports.items())
        ] or [f"{direction}: none"]
    return "\n".join(lines)


def _label(ix: Index, d: Diagram, node: Node) -> str:
    """The label of ``node``, from the template properties of the resources it stands for."""
    first, count = node.members[0], len(node.members)
    stack, props = first.key[0], first.props
    match first.type:
        case T.SUBNET:
            places = sorted(
                f"{ix.text(stack, s.props.get('AvailabilityZone', '?'))} "
                f"(/{str(s.props.get('CidrBlock', '')).rpartition('/')[2]})"
                for s in node.members
            )
            return _counted(f"{_subnet_kind(ix, first)} subnet", count, places, per_line=2)
        case T.NAT | T.IGW:
            return _counted("NAT gateway" if first.type == T.NAT else "Internet gateway", count)
        case T.ENDPOINT:
            services = sorted(
                re.sub(r"^com\.amazonaws\.[^.]+\.", "", ix.text(stack, e.props.get("ServiceName", "")))
                for e in node.members
            )
            return _counted(f"{props.get('VpcEndpointType', 'Gateway')} endpoint", count, services, ": ", 4)
        case T.SG:
            return _security_group_label(ix, d, first.key)
        case T.FSX:
            kind, lustre = props.get("FileSystemType", ""), props.get("LustreConfiguration", {})
            capacity, per_unit = props.get("StorageCapacity"), lustre.get("PerUnitStorageThroughput")
            compression, version = lustre.get("DataCompressionType", "NONE"), props.get("FileSystemTypeVersion")
            head = [
                f"FSx for {kind.title()}" if kind else "FSx file system",
                lustre.get("DeploymentType"),
                f"{capacity} GiB",
            ]
            details = [
                f"{kind.title()} {version}" if version else "",
                props.get("StorageType", ""),
                f"{compression} compression" if compression != "NONE" else "",
                "EFA-enabled" if lustre.get("EfaEnabled") else "",
            ]
            lines = [
                " ".join(filter(None, head)) + (f", {per_unit} MB/s/TiB" if per_unit else ""),
                ", ".join(filter(None, details)),
            ]
            if per_unit and isinstance(capacity, int):
                lines.append(f"≈{round(capacity / 1024 * per_unit):,} MB/s aggregate")
            return "\n".join(filter(None, lines))
        case T.DRA:
            lines = ["Data repository associations:"]
            for dra in sorted(node.members, key=lambda r: str(r.props.get("FileSystemPath"))):
                flows = tuple(_dra_flows(dra.props))
                arrow = {("import", "export"): "↔", ("import",): "←", ("export",): "→"}.get(flows, "—")
                path = re.sub(r"^s3://[^/]+/?", "", ix.text(dra.key[0], dra.props.get("DataRepositoryPath", "")))
                lines.append(f"{dra.props.get('FileSystemPath', '/')} {arrow} {path or '/'}")
            return "\n".join(lines)
        case T.BUCKET:
            roles = [
                (ix.linked(first.key, T.DRA, "DataRepositoryPath"), "S3 data bucket"),
                (any(_holds_lifecycle_scripts(ix, first, c) for c in ix.of_type(T.HYPERPOD)), "Lifecycle bucket"),
                (ix.linked(first.key, T.BUCKET, "LoggingConfiguration.DestinationBucketName"), "S3 access-log bucket"),
            ]
            features = ["versioned"] if _at(props, "VersioningConfiguration.Status") == "Enabled" else []
            for rule in _at(props, "BucketEncryption.ServerSideEncryptionConfiguration") or []:
                algorithm = _at(rule, "ServerSideEncryptionByDefault.SSEAlgorithm")
                features.append({"AES256": "SSE-S3", "aws:kms": "SSE-KMS"}.get(algorithm, str(algorithm)))
            features += [
                f"expires after {rule['ExpirationInDays']} days"
                for rule in _at(props, "LifecycleConfiguration.Rules") or []
                if rule.get("ExpirationInDays") and rule.get("Status", "Enabled") == "Enabled"
            ]
            name = ix.text(stack, props.get("BucketName", ""))
            for pseudo, readable in (
                ("AccountId", "<account>"),
                ("Region", "<region>"),
                ("Partition", "aws"),
                ("URLSuffix", "amazonaws.com"),
            ):
                name = name.replace("${AWS::" + pseudo + "}", readable)
            role = next((role for found, role in roles if found), "S3 bucket")
            return "\n".join(filter(None, [role, name, ", ".join(features)]))
        case T.PARAMETER:
            names = sorted(ix.text(stack, p.props.get("Name", p.key[1])) for p in node.members)
            return _counted("SSM parameter", count, names)
        case T.KEY:
            return "KMS key" + (" (rotation on)" if props.get("EnableKeyRotation") else "")
        case T.EKS:
            vpc_config = props.get("ResourcesVpcConfig", {})
            endpoint = [
                kind
                for kind, key in (("private", "EndpointPrivateAccess"), ("public", "EndpointPublicAccess"))
                if vpc_config.get(key)
            ]
            logs = [entry.get("Type") for entry in _at(props, "Logging.ClusterLogging.EnabledTypes") or []]
            name = ix.text(stack, props.get("Name", first.key[1]))
            lines = [
                f"EKS cluster {name}, Kubernetes {props.get('Version', '?')}",
                f"endpoint: {' and '.join(endpoint) or 'none'}",
                f"control plane logs: {', '.join(logs)}" if logs else "",
                "secrets encrypted with KMS" if props.get("EncryptionConfig") else "",
            ]
            return "\n".join(filter(None, lines))
        case T.ADDON:
            names = sorted(ix.text(stack, a.props.get("AddonName", a.key[1])) for a in node.members)
            return _counted("EKS add-on", count, names, ", ", 3)
        case T.ACCESS:
            policies = sorted(
                {
                    ix.text(stack, policy.get("PolicyArn", "")).rsplit("/", 1)[-1]
                    for entry in node.members
                    for policy in entry.props.get("AccessPolicies", [])
                }
            )
            return _counted("EKS access entry", count, policies, ": ", 2)
        case T.PROMETHEUS:
            return f"Managed Prometheus workspace {ix.text(stack, props.get('Alias', first.key[1]))}"
        case T.RULES:
            alerts = len(re.findall(r"^\s*- alert:", ix.text(stack, props.get("Data", "")), re.M))
            return f"Alert rules: {alerts} alerts"
        case T.SCRAPER:
            blob = _at(props, "ScrapeConfiguration.ConfigurationBlob")  # the scrape configuration's YAML, as Fn::Base64
            yaml_text = ix.text(stack, blob.get("Fn::Base64", "") if isinstance(blob, dict) else blob or "")
            interval = re.search(r"^\s*scrape_interval: (\d+[smh])$", yaml_text, re.M)
            return "Managed scraper" + (f", every {interval[1]}" if interval else "")
        case T.GRAFANA:
            name = ix.text(stack, props.get("Name", first.key[1]))
            sign_in = ", ".join(_listed(props.get("AuthenticationProviders", [])))
            return f"Managed Grafana {name}, {props.get('GrafanaVersion', '?')}" + (
                f"\nsign-in: {sign_in}" if sign_in else ""
            )
        case T.HYPERPOD:
            orchestrator = ", ".join(sorted(props.get("Orchestrator", {}))) or "no orchestrator"
            lines = [f"HyperPod cluster {ix.text(stack, props.get('ClusterName', first.key[1]))} ({orchestrator})"]
            for group in props.get("InstanceGroups", []):
                ebs = sum(
                    _at(disk, "EbsVolumeConfig.VolumeSizeInGB") or 0 for disk in group.get("InstanceStorageConfigs", [])
                )
                lines.append(
                    f"{group.get('InstanceGroupName')} {group.get('InstanceCount')}× "
                    f"{group.get('InstanceType')}" + (f", {ebs} GB EBS" if ebs else "")
                )
            if props.get("NodeRecovery"):
                lines.append(f"node recovery: {props['NodeRecovery']}")
            return "\n".join(lines)
        case T.ROLE:
            trust = (_at(props, "AssumeRolePolicyDocument.Statement") or [{}])[0]
            principals = sorted(_listed(_at(trust, "Principal.Service") or []))
            actions = [
                statement.get("Action", [])
                for policy in ix.linked(first.key, T.POLICY, "Roles")
                for statement in _at(policy.props, "PolicyDocument.Statement") or []
            ]
            services = {action.split(":")[0] for listed in actions for action in _listed(listed)}
            lines = ["IAM role" + (f" ({', '.join(principals)})" if principals else "")]
            lines += sorted(ix.text(stack, arn).rsplit("/", 1)[-1] for arn in props.get("ManagedPolicyArns", []))
            return "\n".join(lines + (["inline: " + ", ".join(sorted(services))] if services else []))
    return f"{_humanize(first.type.split('::')[-1])} {f'×{count} ' if count > 1 else ''}({first.type})"


def _connect(ix: Index, d: Diagram) -> None:
    """The edges: network paths (routes), references (``REFERENCE_EDGES``), rules between security groups, roles,
    data repositories, and what a HyperPod cluster uses (the file system it mounts, scripts, image, parameters)."""
    for route in ix.of_type(T.ROUTE):
        destination = route.props.get("DestinationCidrBlock", route.props.get("DestinationIpv6CidrBlock", ""))
        for target in d.of(k for name in ROUTE_TARGETS for k in route.refs.get(name, [])):
            for subnet in d.of(_table_subnets(ix, route.refs.get("RouteTableId", []))):
                d.edge(subnet, target, destination, "network")
    for gateway in ix.of_type(T.IGW):
        d.edge(d.node_of[gateway.key], INTERNET, "", "network")
    for endpoint in ix.of_type(T.ENDPOINT):
        for subnet in d.of(_table_subnets(ix, endpoint.refs.get("RouteTableIds", []))):
            d.edge(subnet, d.node_of[endpoint.key], "route", "network")
    for type_, path, label, kind, backwards in REFERENCE_EDGES:
        for resource in ix.of_type(type_):
            others = d.of(resource.refs.get(path, []))
            if (type_, path) in EXISTING_SUBNET_PATHS and _existing_subnets(ix, resource, path):
                others.append(EXISTING_SUBNETS)
            for other in others:
                here = d.node_of[resource.key]
                d.edge(*((other, here) if backwards else (here, other)), label, kind)
    for key, rules in sorted(d.rules.items()):
        by_peer: dict[str, list[str]] = defaultdict(list)
        for direction, ports, peer in rules:
            if direction == "in" and isinstance(peer, tuple) and peer in d.node_of:
                by_peer[d.node_of[peer]].append(ports)
        for peer_node, ports in sorted(by_peer.items()):
            d.edge(peer_node, d.node_of[key], _merge_ports(ports), "wiring")
    for custom in (r for r in ix.resources.values() if r.type.startswith("Custom::")):  # e.g. dashboards' data source
        grafana = [k for k in custom.refs.get("", []) if ix.resources[k].type == T.GRAFANA]
        prometheus = [k for k in custom.refs.get("", []) if ix.resources[k].type == T.PROMETHEUS]
        for source in d.of(prometheus):
            for target in d.of(grafana):
                d.edge(source, target, "queries", "data")
    for role in (r for r in ix.of_type(T.ROLE) if r.key in d.node_of):
        user = next(u for u in ix.referrers[role.key] if u.type in CATEGORIES and u.type != T.ROLE)
        how = "execution role" if "ExecutionRole" in json.dumps(user.props) else "role"
        d.edge(d.node_of[role.key], d.node_of[user.key], how, "wiring")
    flows: dict[tuple[str, str], set[str]] = defaultdict(set)
    for dra in ix.of_type(T.DRA):
        for fs in d.of(k for k in dra.refs.get("FileSystemId", []) if ix.resources[k].type == T.FSX):
            d.edge(fs, d.node_of[dra.key], "", "data", both=True)
        for bucket in d.of(dra.refs.get("DataRepositoryPath", [])):
            flows[(d.node_of[dra.key], bucket)].update(_dra_flows(dra.props))
    for (dra_node, bucket), kinds in flows.items():
        label = "/".join(kind for kind in ("import", "export") if kind in kinds) or "linked"
        d.edge(dra_node, bucket, label, "data", both="export" in kinds)

    file_systems = {group: fs.key for fs in ix.of_type(T.FSX) for group in fs.refs.get("SecurityGroupIds", [])}
    parameters = {ix.text(p.key[0], p.props.get("Name", p.key[1])): p.key for p in ix.of_type(T.PARAMETER)}
    for cluster in ix.of_type(T.HYPERPOD):
        here, groups = d.node_of[cluster.key], cluster.refs.get("VpcConfig.SecurityGroupIds", [])
        for fs_group, fs in sorted(file_systems.items()):  # mounted: its group lets the cluster's groups in
            if ports := [p for direction, p, peer in d.rules.get(fs_group, []) if direction == "in" and peer in groups]:
                d.edge(here, d.node_of[fs], f"Lustre mount\n{_merge_ports(ports)}", "data")
        for bucket in ix.of_type(T.BUCKET):
            if _holds_lifecycle_scripts(ix, bucket, cluster):
                d.edge(d.node_of[bucket.key], here, "lifecycle scripts", "data")
        for image in (node.id for node in d.nodes.values() if node.category == "image"):
            d.edge(image, here, "training image", "data")
        for role in cluster.refs.get("InstanceGroups.ExecutionRole", []):  # parameters its policies let nodes read
            for policy in ix.linked(role, T.POLICY, "Roles"):
                document = ix.text(policy.key[0], policy.props.get("PolicyDocument", {}))
                for name, parameter in parameters.items():
                    if f":parameter{name}" in document:
                        d.edge(d.node_of[parameter], here, "read at boot", "wiring")


def _vpc_clusters(ix: Index) -> dict[str, tuple[str, str]]:
    """Sub-cluster id -> (stack, label) for each VPC; the label shows its CIDR and flow logs."""
    flow_logs: dict[Key, list[str]] = defaultdict(list)
    for log in ix.of_type(T.FLOW_LOG):
        days = [ix.resources[g].props.get("RetentionInDays") for g in log.refs.get("LogGroupName", [])]
        where = {"cloud-watch-logs": "CloudWatch Logs", "s3": "S3"}.get(
            log.props.get("LogDestinationType", "cloud-watch-logs"), "logs"
        )
        for vpc in log.refs.get("ResourceId", []):
            flow_logs[vpc].append(
                f"flow logs: {log.props.get('TrafficType', 'ALL')} → {where}"
                + (f", {days[-1]} days" if days and days[-1] else "")
            )
    return {
        _slug(*vpc.key): (
            vpc.key[0],
            "\n".join([f"VPC {vpc.props.get('CidrBlock', '')}".strip(), *sorted(flow_logs[vpc.key])]),
        )
        for vpc in ix.of_type(T.VPC)
    }


def draw(ix: Index) -> Diagram:
    """The nodes and edges of the indexed app: resources placed in nodes and labelled, then the extra nodes (existing
    subnets, the internet, container images), then the edges."""
    names = sorted({_tag(r.props, TAG_DEPLOYMENT) for r in ix.resources.values()} - {None})
    name = ", ".join(names) or Path.commonprefix([s.name for s in ix.stacks]).rstrip("-") or "app"
    regions = ", ".join(sorted({s.region for s in ix.stacks if s.region and s.region != "unknown-region"}))
    d = Diagram(
        f"moe-cdk architecture: configuration '{name}', region {regions or 'unknown'}",
        _vpc_clusters(ix),
        {group.key: _rules(ix, group) for group in ix.of_type(T.SG)},
    )
    for resource in ix.resources.values():
        if place := _place(ix, d, resource):
            category = CATEGORIES.get(resource.type, "other")
            d.nodes.setdefault(place[0], Node(place[0], category, resource.key[0], place[1])).members.append(resource)
            d.node_of[resource.key] = place[0]
    for node in d.nodes.values():
        node.label = _label(ix, d, node)
    existing = sorted(
        {
            subnet
            for r in ix.resources.values()
            for type_, path in EXISTING_SUBNET_PATHS
            if r.type == type_
            for subnet in _existing_subnets(ix, r, path)
        }
    )
    if existing:
        label = "\n".join([_counted("Existing subnet", len(existing)), *existing])
        d.nodes[EXISTING_SUBNETS] = Node(EXISTING_SUBNETS, "network", label=label)
    if ix.of_type(T.IGW):
        d.nodes[INTERNET] = Node(INTERNET, "external", label="Internet")
    for stack in ix.stacks:
        for _, image in sorted(stack.images.items(), key=lambda item: item[1].get("displayName", item[0])):
            source, name = image.get("source", {}), _humanize(image.get("displayName", "Image").split("/")[0])
            details = ", ".join(filter(None, (source.get("dockerFile"), source.get("platform"))))
            node_id, label = _slug(stack.name, "image", name), "\n".join(filter(None, [f"{name} (ECR asset)", details]))
            d.nodes[node_id] = Node(node_id, "image", stack.name, label=label)
    _connect(ix, d)
    return d


def _dot_label(text: str, left: bool = False) -> str:
    """``text`` as a DOT label: backslashes literal, lines centred (``\\n``) or left-justified (``\\l``)."""
    lines = [graphviz.escape(line) for line in text.split("\n")]
    return graphviz.nohtml("".join(line + "\\l" for line in lines) if left else "\\n".join(lines))


def to_graph(stacks: list[Stack], d: Diagram) -> graphviz.Digraph:
    """``d`` as a Graphviz graph: a cluster per stack (in ``stacks`` order) with its nodes, and one per VPC in it."""
    graph = graphviz.Digraph(
        "architecture",
        graph_attr={"label": _dot_label(d.title), **GRAPH_ATTR},
        node_attr={"fontname": "Helvetica", "fontsize": "11", "margin": "0.15,0.07"},
        edge_attr={"fontname": "Helvetica", "fontsize": "9", "arrowsize": "0.7"},
    )

    def add(graph: graphviz.Digraph, nodes: list[Node]) -> None:
        for node in nodes:
            shape, fill, border = STYLES[node.category]
            style = "rounded,filled" if shape == "box" else "filled"
            graph.node(node.id, _dot_label(node.label), shape=shape, style=style, fillcolor=fill, color=border)

    nodes = sorted(d.nodes.values(), key=lambda n: n.id)
    for index, stack in enumerate(stacks):
        if members := [n for n in nodes if n.stack == stack.name]:
            description = re.sub(r"^moe-cdk:\s*", "", stack.template.get("Description", ""))
            label = f"{stack.name} ({len(stack.template.get('Resources', {}))} resources)\n{description}".strip()
            attributes = {"label": _dot_label(label, left=True), "fillcolor": STACK_FILL[index % len(STACK_FILL)]}
            with graph.subgraph(name="cluster_" + _slug(stack.name), graph_attr={**attributes, **STACK_ATTR}) as sub:
                for vpc_id, (vpc_stack, vpc_label) in sorted(d.vpcs.items()):
                    if vpc_stack == stack.name and (inside := [n for n in members if n.vpc == vpc_id]):
                        attributes = {"label": _dot_label(vpc_label, left=True), **VPC_ATTR}
                        with sub.subgraph(name="cluster_" + vpc_id, graph_attr=attributes) as vpc:
                            add(vpc, inside)
                add(sub, [n for n in members if n.vpc not in d.vpcs])
    add(graph, [n for n in nodes if n.stack is None])
    for (tail, head, label), (kind, both) in sorted(d.edges.items()):
        graph.edge(tail, head, _dot_label(label) if label else None, dir="both" if both else None, **EDGE_STYLES[kind])
    graph.node("legend", LEGEND, shape="box", style="rounded", color="#B0BEC5", fontsize="10")
    return graph


def architecture_graph(cdk_out: Path) -> graphviz.Digraph:
    """The architecture of the app synthesized into ``cdk_out``, as a Graphviz graph."""
    stacks = load_stacks(Path(cdk_out))
    return to_graph(stacks, draw(Index(stacks)))


def architecture_dot(cdk_out: Path) -> str:
    """The DOT source of ``architecture_graph``; the same input gives the same text."""
    return architecture_graph(cdk_out).source


def render_png(graph: graphviz.Digraph | str, out: Path) -> None:
    """Render ``graph`` (or DOT source) to a PNG at ``out``; RuntimeError if ``dot`` is missing or fails."""
    if shutil.which("dot") is None:
        raise RuntimeError(NO_DOT)
    try:
        png = (graphviz.Source(graph) if isinstance(graph, str) else graph).pipe(format="png", quiet=True)
    except graphviz.ExecutableNotFound as error:
        raise RuntimeError(NO_DOT) from error
    except graphviz.CalledProcessError as error:
        message = (error.stderr or b"").decode(errors="replace").strip().splitlines() or ["no message"]
        raise RuntimeError(f"dot -Tpng failed (exit {error.returncode}): {message[-1]}") from error
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_bytes(png)
