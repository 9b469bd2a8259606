"""An architecture diagram of a synthesized app, drawn from cdk.out alone.

``python -m moe_cdk.stacks.diagram --cdk-out cdk.out --output docs/architecture.png``
reads the cloud assembly that ``make synth`` (or ``python app.py``) wrote: the manifest,
each stack's template and its asset manifest. It draws one cluster per stack and, inside,
one node per significant kind of resource, grouped and counted where there are many
(subnets, endpoints, parameters); supporting resources (route tables, policies, custom
resource handlers) are only counted. Every label comes from template properties, and
every edge from a reference between resources (``Ref``, ``Fn::GetAtt``, cross-stack
``Fn::GetStackOutput`` / ``Fn::ImportValue``, a shared bucket name), so the picture follows
the configuration without per-configuration code. Standard library only: no CDK import,
so it runs anywhere Python and Graphviz's ``dot`` do.

Exit codes: 0 written, 2 the command line is invalid or ``dot`` is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from moe_cdk.training.schema import problem

EXIT_INVALID = 2
TAG_DEPLOYMENT = "moe-cdk:deployment"
INTERNET = "internet"

# Resource types folded into other nodes or only counted: they carry no information a
# reader of the architecture needs (routing plumbing, policies, CDK's custom-resource
# machinery).
SUPPORTING_TYPES = {
    "AWS::EC2::EIP", "AWS::EC2::Route", "AWS::EC2::RouteTable", "AWS::EC2::SubnetRouteTableAssociation",
    "AWS::EC2::VPCGatewayAttachment", "AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress",
    "AWS::EC2::FlowLog", "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::Lambda::Function",
    "AWS::S3::BucketPolicy", "AWS::CDK::Metadata",
}

# Node styles by category: (shape, fill colour, border colour).
STYLES = {
    "network": ("box", "#E8F5E9", "#2E7D32"),
    "endpoint": ("box", "#F1F8E9", "#558B2F"),
    "security": ("box", "#FDECEA", "#C62828"),
    "storage": ("cylinder", "#FFF3E0", "#E65100"),
    "bucket": ("cylinder", "#FFF8E1", "#FF8F00"),
    "config": ("note", "#FFFDE7", "#9E9D24"),
    "compute": ("box3d", "#E3F2FD", "#1565C0"),
    "image": ("component", "#F3E5F5", "#6A1B9A"),
    "external": ("ellipse", "#ECEFF1", "#455A64"),
    "other": ("box", "#FAFAFA", "#616161"),
}
# Edge styles by kind: data flow, network path, wiring (attachments, permissions, keys).
EDGE_STYLES = {
    "data": 'color="#1565C0", penwidth=2.2, fontcolor="#0D47A1"',
    "network": 'color="#2E7D32", penwidth=1.6, fontcolor="#1B5E20"',
    "wiring": 'color="#757575", style=dashed, fontcolor="#424242"',
}
STACK_FILL = ["#FAFAFA", "#F5F9FF", "#FFFAF5", "#F9F5FF"]


class DiagramError(Exception):
    """The assembly cannot be read, or Graphviz cannot be run; main() exits 2 with the message."""


# ---------------------------------------------------------------------------------------------
# Reading the assembly
# ---------------------------------------------------------------------------------------------


@dataclass
class Stack:
    name: str
    region: str
    template: dict
    docker_images: dict
    order: int = 0

    @property
    def resources(self) -> dict[str, dict]:
        return self.template.get("Resources", {})


def _no_app(cdk_out: Path) -> DiagramError:
    return DiagramError("--cdk-out: " + problem("no synthesized app", got=str(cdk_out), allowed="a folder written by make synth"))


def load_stacks(cdk_out: Path) -> list[Stack]:
    """The stacks of the assembly in ``cdk_out``, dependencies first, then by name."""
    manifest_path = Path(cdk_out) / "manifest.json"
    if not manifest_path.is_file():
        raise _no_app(cdk_out)
    try:
        artifacts = json.loads(manifest_path.read_text()).get("artifacts", {})
    except (OSError, ValueError) as error:
        raise _no_app(cdk_out) from error
    stacks: dict[str, Stack] = {}
    deps: dict[str, list[str]] = {}
    for artifact_id, artifact in artifacts.items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        props = artifact.get("properties", {})
        template = json.loads((Path(cdk_out) / props["templateFile"]).read_text())
        docker: dict = {}
        for dep in artifact.get("dependencies", []):
            dep_artifact = artifacts.get(dep, {})
            if dep_artifact.get("type") == "cdk:asset-manifest":
                asset_file = Path(cdk_out) / dep_artifact.get("properties", {}).get("file", "")
                if asset_file.is_file():
                    docker.update(json.loads(asset_file.read_text()).get("dockerImages", {}))
        region = artifact.get("environment", "").rsplit("/", 1)[-1]
        stacks[artifact_id] = Stack(props.get("stackName", artifact_id), region, template, docker)
        deps[artifact_id] = [d for d in artifact.get("dependencies", []) if artifacts.get(d, {}).get("type") == "aws:cloudformation:stack"]
    if not stacks:
        raise _no_app(cdk_out)

    def depth(artifact_id: str, seen: frozenset = frozenset()) -> int:
        parents = [d for d in deps[artifact_id] if d in stacks and d not in seen]
        return 1 + max((depth(d, seen | {artifact_id}) for d in parents), default=-1)

    ordered = sorted(stacks, key=lambda a: (depth(a), stacks[a].name))
    for index, artifact_id in enumerate(ordered):
        stacks[artifact_id].order = index
    return [stacks[a] for a in ordered]


class Assembly:
    """The stacks plus reference resolution across them."""

    def __init__(self, stacks: list[Stack]):
        self.stacks = stacks
        self.by_name = {s.name: s for s in stacks}
        self.exports: dict[str, tuple[str, object]] = {}
        for stack in stacks:
            for output in stack.template.get("Outputs", {}).values():
                export = output.get("Export", {}).get("Name")
                if export is not None:
                    self.exports[self.text(stack.name, export)] = (stack.name, output.get("Value"))

    def resource(self, key: tuple[str, str]) -> dict:
        return self.by_name[key[0]].resources.get(key[1], {})

    def refs(self, stack: str, value) -> list[tuple[str, str]]:
        """Every resource ``value`` refers to, as (stack name, logical id), in order of appearance."""
        found: list[tuple[str, str]] = []
        self._refs(stack, value, found)
        return list(dict.fromkeys(found))

    def _refs(self, stack: str, value, found: list) -> None:
        resources = self.by_name[stack].resources
        if isinstance(value, list):
            for item in value:
                self._refs(stack, item, found)
        elif isinstance(value, dict):
            if "Ref" in value and len(value) == 1:
                if value["Ref"] in resources:
                    found.append((stack, value["Ref"]))
            elif "Fn::GetAtt" in value and len(value) == 1:
                target = value["Fn::GetAtt"]
                name = target[0] if isinstance(target, list) else str(target).split(".")[0]
                if name in resources:
                    found.append((stack, name))
            elif "Fn::GetStackOutput" in value and len(value) == 1:
                spec = value["Fn::GetStackOutput"]
                other = self.by_name.get(spec.get("StackName"))
                if other is not None:
                    output = other.template.get("Outputs", {}).get(spec.get("OutputName"), {})
                    self._refs(other.name, output.get("Value"), found)
            elif "Fn::ImportValue" in value and len(value) == 1:
                exported = self.exports.get(self.text(stack, value["Fn::ImportValue"]))
                if exported is not None:
                    self._refs(exported[0], exported[1], found)
            elif "Fn::Sub" in value and len(value) == 1:
                spec = value["Fn::Sub"]
                template, variables = (spec[0], spec[1]) if isinstance(spec, list) else (spec, {})
                for name in re.findall(r"\$\{([^}!]+)\}", template):
                    base = name.split(".")[0]
                    if base in variables:
                        self._refs(stack, variables[base], found)
                    elif base in resources:
                        found.append((stack, base))
            else:
                for item in value.values():
                    self._refs(stack, item, found)

    def text(self, stack: str, value) -> str:
        """``value`` as a string, intrinsics written ``${AWS::AccountId}`` / ``${LogicalId}``, so that two
        spellings of one name (``Fn::Join`` in one stack, ``Fn::Sub`` in another) compare equal."""
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float, bool)):
            return json.dumps(value)
        if isinstance(value, list):
            return ",".join(self.text(stack, v) for v in value)
        if isinstance(value, dict) and len(value) == 1:
            (fn, arg), = value.items()
            if fn == "Ref":
                return "${" + str(arg) + "}"
            if fn == "Fn::GetAtt":
                return "${" + (".".join(arg) if isinstance(arg, list) else str(arg)) + "}"
            if fn == "Fn::Join":
                return str(arg[0]).join(self.text(stack, v) for v in arg[1])
            if fn == "Fn::Sub":
                template, variables = (arg[0], arg[1]) if isinstance(arg, list) else (arg, {})
                return re.sub(r"\$\{([^}!]+)\}",
                              lambda m: self.text(stack, variables[m.group(1)]) if m.group(1) in variables else m.group(0),
                              template)
            if fn == "Fn::GetStackOutput":
                other = self.by_name.get(arg.get("StackName"))
                if other is not None:
                    output = other.template.get("Outputs", {}).get(arg.get("OutputName"), {})
                    return self.text(other.name, output.get("Value"))
            if fn == "Fn::ImportValue":
                exported = self.exports.get(self.text(stack, arg))
                if exported is not None:
                    return self.text(exported[0], exported[1])
        return json.dumps(value, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# The graph model
# ---------------------------------------------------------------------------------------------


@dataclass
class Node:
    id: str
    label: str
    category: str
    stack: str | None = None  # None: outside every stack (the internet, existing resources)
    vpc: str | None = None  # the id of the VPC sub-cluster it is drawn in, if any
    members: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Diagram:
    title: str
    stacks: list[Stack]
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (tail, head, label) -> kind
    both_ways: set[tuple[str, str, str]] = field(default_factory=set)
    vpcs: dict[str, tuple[str, str]] = field(default_factory=dict)  # sub-cluster id -> (stack, label)
    index: dict[tuple[str, str], str] = field(default_factory=dict)  # resource -> node id

    def add(self, node: Node) -> Node:
        existing = self.nodes.get(node.id)
        if existing is not None:
            existing.members.extend(node.members)
            node = existing
        else:
            self.nodes[node.id] = node
        for member in node.members:
            self.index[member] = node.id
        return node

    def edge(self, tail: str | None, head: str | None, label: str = "", kind: str = "wiring", both: bool = False) -> None:
        if tail is None or head is None or tail == head or tail not in self.nodes or head not in self.nodes:
            return
        key = (tail, head, label)
        self.edges[key] = kind
        if both:
            self.both_ways.add(key)


def _slug(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9]+", "_", p).strip("_").lower() for p in parts if p)


def _tags(props: dict) -> dict[str, str]:
    tags = props.get("Tags", {})
    if isinstance(tags, dict):
        return {str(k): str(v) for k, v in tags.items()}
    return {t.get("Key"): t.get("Value") for t in tags if isinstance(t, dict) and isinstance(t.get("Value"), str)}


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return singular if count == 1 else (plural or singular + "s") + f" ×{count}"


def _humanize(name: str) -> str:
    """``TrainingImage`` -> ``Training image``."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", name)
    return " ".join([words[0]] + [w.lower() for w in words[1:]]) if words else name


def _readable(name: str) -> str:
    """A rendered name with its pseudo parameters spelled for people."""
    return (name.replace("${AWS::AccountId}", "<account>").replace("${AWS::Region}", "<region>")
            .replace("${AWS::Partition}", "aws").replace("${AWS::URLSuffix}", "amazonaws.com"))


def _wrap(items: list[str], per_line: int) -> str:
    return "\n".join(", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line))


def _ports(rule: dict) -> str:
    protocol = str(rule.get("IpProtocol", "-1"))
    if protocol in ("-1", "all"):
        return "all traffic"
    low, high = rule.get("FromPort"), rule.get("ToPort")
    name = {"6": "tcp", "17": "udp", "1": "icmp"}.get(protocol, protocol).upper()
    if low is None or (low, high) in ((0, 65535), (-1, -1)):
        return f"{name} all"
    return f"{name} {low}" if low == high else f"{name} {low}-{high}"


def _merge_ports(ports: list[str]) -> str:
    """``TCP 988``, ``TCP 1018-1023`` -> ``TCP 988, 1018-1023``."""
    by_protocol: dict[str, list[str]] = defaultdict(list)
    for port in dict.fromkeys(ports):
        protocol, _, rest = port.partition(" ")
        by_protocol[protocol if rest else port].append(rest)
    def order(rest: str) -> tuple[int, str]:
        return (int(rest.split("-")[0]) if rest.split("-")[0].isdigit() else -1, rest)

    return ", ".join(p + (" " + ", ".join(sorted((r for r in rests if r), key=order)) if any(rests) else "")
                     for p, rests in sorted(by_protocol.items()))


# ---------------------------------------------------------------------------------------------
# From templates to nodes and edges
# ---------------------------------------------------------------------------------------------


class Builder:
    def __init__(self, stacks: list[Stack]):
        self.app = Assembly(stacks)
        self.stacks = stacks
        name = self._deployment_name()
        regions = sorted({s.region for s in stacks if s.region and s.region != "unknown-region"})
        self.diagram = Diagram(title=f"moe-cdk architecture: configuration '{name}', region {', '.join(regions) or 'unknown'}",
                               stacks=stacks)

    def _deployment_name(self) -> str:
        names = sorted({_tags(r.get("Properties", {})).get(TAG_DEPLOYMENT) for s in self.stacks
                        for r in s.resources.values()} - {None})
        if names:
            return ", ".join(names)
        prefix = Path.commonprefix([s.name for s in self.stacks]).rstrip("-")
        return prefix or "app"

    def of_type(self, type_: str) -> list[tuple[str, str, dict]]:
        """(stack, logical id, properties) of every resource of ``type_``, in stack then id order."""
        return [(s.name, lid, r.get("Properties", {})) for s in self.stacks
                for lid, r in sorted(s.resources.items()) if r.get("Type") == type_]

    def node_of(self, stack: str, value) -> list[str]:
        """The nodes the resources ``value`` refers to are drawn in."""
        return list(dict.fromkeys(self.diagram.index[r] for r in self.app.refs(stack, value) if r in self.diagram.index))

    # -- the pass order matters: roles (which bucket is the data bucket) come from the
    # resources that point at them, so those are looked at first.
    def build(self) -> Diagram:
        self.vpc_clusters()
        self.subnets()
        self.gateways()
        self.endpoints()
        self.security_groups()
        self.file_systems()
        self.buckets()
        self.parameters()
        self.keys()
        self.clusters()
        self.roles()
        self.images()
        self.other_resources()
        self.routes()
        self.wiring()
        return self.diagram

    def _vpc_of(self, stack: str, props: dict) -> str | None:
        for ref in self.app.refs(stack, props.get("VpcId")):
            if ref[0] == stack and _slug(*ref) in self.diagram.vpcs:
                return _slug(*ref)
        return None

    def vpc_clusters(self) -> None:
        flow_logs: dict[tuple[str, str], list[str]] = defaultdict(list)
        for stack, _, props in self.of_type("AWS::EC2::FlowLog"):
            retention = ""
            for group in self.app.refs(stack, props.get("LogGroupName")):
                days = self.app.resource(group).get("Properties", {}).get("RetentionInDays")
                retention = f", {days} days" if days else ""
                self.diagram.index[group] = ""  # folded into the VPC label
            destination = {"cloud-watch-logs": "CloudWatch Logs", "s3": "S3"}.get(props.get("LogDestinationType", "cloud-watch-logs"), "logs")
            for vpc in self.app.refs(stack, props.get("ResourceId")):
                flow_logs[vpc].append(f"flow logs: {props.get('TrafficType', 'ALL')} → {destination}{retention}")
        for stack, lid, props in self.of_type("AWS::EC2::VPC"):
            lines = [f"VPC {props.get('CidrBlock', '')}".strip()] + sorted(flow_logs.get((stack, lid), []))
            self.diagram.vpcs[_slug(stack, lid)] = (stack, "\n".join(lines))
            self.diagram.index[(stack, lid)] = ""

    def _subnet_kind(self, stack: str, lid: str, props: dict) -> str:
        targets = set()
        for astack, _, assoc in self.of_type("AWS::EC2::SubnetRouteTableAssociation"):
            if astack == stack and (stack, lid) in self.app.refs(stack, assoc.get("SubnetId")):
                for table in self.app.refs(stack, assoc.get("RouteTableId")):
                    for _, _, route in self.of_type("AWS::EC2::Route"):
                        if table in self.app.refs(stack, route.get("RouteTableId")):
                            targets.update(k for k in ("GatewayId", "NatGatewayId", "TransitGatewayId") if k in route)
        if "GatewayId" in targets:
            return "Public"
        if targets:
            return "Private"
        tagged = _tags(props).get("aws-cdk:subnet-type")
        if tagged:
            return tagged
        return "Public" if props.get("MapPublicIpOnLaunch") else "Isolated"

    def subnets(self) -> None:
        groups: dict[tuple[str, str, str | None], list[tuple[str, str, dict]]] = defaultdict(list)
        for stack, lid, props in self.of_type("AWS::EC2::Subnet"):
            groups[(stack, self._subnet_kind(stack, lid, props), self._vpc_of(stack, props))].append((stack, lid, props))
        for (stack, kind, vpc), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")):
            places = sorted(f"{self.app.text(stack, p.get('AvailabilityZone', '?'))} (/{str(p.get('CidrBlock', '')).rpartition('/')[2]})"
                            for _, _, p in members)
            label = (f"{kind} subnet {places[0]}" if len(places) == 1
                     else f"{kind} subnets ×{len(places)}\n" + _wrap(places, 2))
            self.diagram.add(Node(_slug(stack, "subnet", kind), label, "network", stack, vpc,
                                  [(s, lid) for s, lid, _ in members]))
        # Subnets given as IDs (an existing VPC) are drawn once, outside the stacks.
        existing = set()
        for stack, _, props in self.of_type("AWS::SageMaker::Cluster") + self.of_type("AWS::FSx::FileSystem"):
            value = props.get("SubnetIds") or props.get("VpcConfig", {}).get("Subnets", [])
            for item in value if isinstance(value, list) else [value]:
                text = self.app.text(stack, item)
                if text.startswith("subnet-"):
                    existing.add(text)
        if existing:
            ids = sorted(existing)
            self.diagram.add(Node("existing_subnets", f"Existing {_plural(len(ids), 'subnet')}\n" + "\n".join(ids), "network"))

    def gateways(self) -> None:
        for type_, name in (("AWS::EC2::NatGateway", "NAT gateway"), ("AWS::EC2::InternetGateway", "Internet gateway")):
            groups: dict[tuple[str, str | None], list[str]] = defaultdict(list)
            for stack, lid, props in self.of_type(type_):
                vpc = None
                if type_ == "AWS::EC2::NatGateway":
                    for subnet in self.app.refs(stack, props.get("SubnetId")):
                        vpc = self._vpc_of(stack, self.app.resource(subnet).get("Properties", {}))
                else:
                    for astack, _, attach in self.of_type("AWS::EC2::VPCGatewayAttachment"):
                        if astack == stack and (stack, lid) in self.app.refs(stack, attach.get("InternetGatewayId")):
                            vpc = self._vpc_of(stack, attach)
                groups[(stack, vpc)].append(lid)
            for (stack, vpc), lids in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
                self.diagram.add(Node(_slug(stack, name), _plural(len(lids), name), "network", stack, vpc,
                                      [(stack, lid) for lid in lids]))
        if any(self.of_type("AWS::EC2::InternetGateway")):
            self.diagram.add(Node(INTERNET, "Internet", "external"))

    def endpoints(self) -> None:
        groups: dict[tuple[str, str, str | None], list[tuple[str, str]]] = defaultdict(list)
        for stack, lid, props in self.of_type("AWS::EC2::VPCEndpoint"):
            service = re.sub(r"^com\.amazonaws\.[^.]+\.", "", self.app.text(stack, props.get("ServiceName", "")))
            kind = props.get("VpcEndpointType", "Gateway")
            groups[(stack, kind, self._vpc_of(stack, props))].append((service, lid))
        for (stack, kind, vpc), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")):
            services = sorted(s for s, _ in members)
            label = f"{kind} endpoint: {services[0]}" if len(services) == 1 else f"{kind} endpoints ×{len(services)}\n" + _wrap(services, 4)
            self.diagram.add(Node(_slug(stack, kind, "endpoints"), label, "endpoint", stack, vpc,
                                  [(stack, lid) for _, lid in members]))

    def _rules(self, key: tuple[str, str], direction: str) -> list[tuple[dict, str]]:
        """(rule, stack it is written in) for every ingress or egress rule of security group ``key``."""
        stack, lid = key
        inline = "SecurityGroupIngress" if direction == "in" else "SecurityGroupEgress"
        rules = [(r, stack) for r in self.app.resource(key).get("Properties", {}).get(inline, [])]
        type_ = "AWS::EC2::SecurityGroupIngress" if direction == "in" else "AWS::EC2::SecurityGroupEgress"
        for rstack, _, props in self.of_type(type_):
            if key in self.app.refs(rstack, props.get("GroupId")):
                rules.append((props, rstack))
        return rules

    def _peer(self, key: tuple[str, str], rule: dict, stack: str, field_: str) -> tuple[str, tuple[str, str] | None]:
        """A rule's other side: a readable name, and the peer security group if it is one."""
        if "CidrIp" in rule or "CidrIpv6" in rule:
            return self.app.text(stack, rule.get("CidrIp", rule.get("CidrIpv6"))), None
        refs = self.app.refs(stack, rule.get(field_))
        if not refs:
            return self.app.text(stack, rule.get(field_, rule.get("SourcePrefixListId", "?"))), None
        return ("self" if refs[0] == key else "§" + "|".join(refs[0])), refs[0]

    def security_groups(self) -> None:
        roles: dict[tuple[str, str], str] = {}
        for stack, _, props in self.of_type("AWS::EC2::VPCEndpoint"):
            for sg in self.app.refs(stack, props.get("SecurityGroupIds")):
                roles.setdefault(sg, "Endpoint security group")
        for stack, _, props in self.of_type("AWS::FSx::FileSystem"):
            kind = props.get("FileSystemType", "")
            for sg in self.app.refs(stack, props.get("SecurityGroupIds")):
                roles.setdefault(sg, f"FSx for {kind.title()} security group" if kind else "FSx security group")
        self.sg_rules: dict[tuple[str, str], dict[str, list[tuple[str, str]]]] = {}
        for stack, lid, props in self.of_type("AWS::EC2::SecurityGroup"):
            key = (stack, lid)
            rules = {"in": [], "out": []}
            for direction, peer_field in (("in", "SourceSecurityGroupId"), ("out", "DestinationSecurityGroupId")):
                for rule, rstack in self._rules(key, direction):
                    peer, _ = self._peer(key, rule, rstack, peer_field)
                    if direction == "out" and peer == "255.255.255.255/32":
                        continue  # CDK's placeholder for "no egress"
                    rules[direction].append((_ports(rule), peer))
            self.sg_rules[key] = rules
            self_all = ("all traffic", "self") in rules["in"] and ("all traffic", "self") in rules["out"]
            role = roles.get(key) or ("EFA security group" if self_all else "Security group")
            self.diagram.add(Node(_slug(stack, lid), role, "security", stack, self._vpc_of(stack, props), [key]))
        # Labels once every group has a node, so that a rule can name its peer group.
        for key, rules in self.sg_rules.items():
            node = self.diagram.nodes[self.diagram.index[key]]
            lines = [node.label]
            for direction in ("in", "out"):
                by_peer: dict[str, list[str]] = defaultdict(list)
                for ports, peer in rules[direction]:
                    if peer.startswith("§"):
                        peer_key = tuple(peer[1:].split("|"))
                        peer_node = self.diagram.index.get(peer_key)
                        peer = self.diagram.nodes[peer_node].label.split("\n")[0].replace(" security group", " SG") if peer_node else "?"
                    by_peer[peer].append(ports)
                by_ports: dict[str, list[str]] = defaultdict(list)
                for peer, ports in by_peer.items():
                    by_ports[_merge_ports(ports)].append(peer)
                word = "from" if direction == "in" else "to"
                if not by_ports:
                    lines.append(f"{direction}: none")
                for ports, peers in sorted(by_ports.items()):
                    lines.append(f"{direction}: {ports} {word} {', '.join(sorted(peers))}")
            node.label = "\n".join(lines)

    def file_systems(self) -> None:
        for stack, lid, props in self.of_type("AWS::FSx::FileSystem"):
            kind = props.get("FileSystemType", "")
            lustre = props.get("LustreConfiguration", {})
            head = f"FSx for {kind.title()}" if kind else "FSx file system"
            first = " ".join(str(x) for x in (head, lustre.get("DeploymentType"), f"{props.get('StorageCapacity')} GiB") if x)
            per_unit = lustre.get("PerUnitStorageThroughput")
            capacity = props.get("StorageCapacity")
            if per_unit:
                first += f", {per_unit} MB/s/TiB"
            details = [f"{kind.title()} {props['FileSystemTypeVersion']}" if props.get("FileSystemTypeVersion") else "",
                       props.get("StorageType", ""),
                       f"{lustre['DataCompressionType']} compression" if lustre.get("DataCompressionType", "NONE") != "NONE" else "",
                       "EFA-enabled" if lustre.get("EfaEnabled") else ""]
            lines = [first, ", ".join(d for d in details if d)]
            if per_unit and isinstance(capacity, int):
                lines.append(f"≈{round(capacity / 1024 * per_unit):,} MB/s aggregate")
            self.diagram.add(Node(_slug(stack, lid), "\n".join(l for l in lines if l), "storage", stack, None, [(stack, lid)]))
        # Data repository associations, one node per file system.
        by_fs: dict[str, list[tuple[str, str, dict]]] = defaultdict(list)
        for stack, lid, props in self.of_type("AWS::FSx::DataRepositoryAssociation"):
            for fs in self.node_of(stack, props.get("FileSystemId")) or [""]:
                by_fs[fs].append((stack, lid, props))
        self.dra_buckets: dict[str, dict[str, set[str]]] = {}
        for fs, members in sorted(by_fs.items()):
            lines, flows = [], defaultdict(set)
            for stack, lid, props in sorted(members, key=lambda m: str(m[2].get("FileSystemPath"))):
                s3 = props.get("S3", {})
                imports, exports = "AutoImportPolicy" in s3 or props.get("BatchImportMetaDataOnCreate"), "AutoExportPolicy" in s3
                arrow = "↔" if imports and exports else "←" if imports else "→" if exports else "—"
                path = self.app.text(stack, props.get("DataRepositoryPath", ""))
                prefix = re.sub(r"^s3://[^/]+/?", "", path) or "/"
                lines.append(f"{props.get('FileSystemPath', '/')} {arrow} {prefix}")
                for bucket in self.app.refs(stack, props.get("DataRepositoryPath")):
                    flows[bucket].update(["import"] if imports else [])
                    flows[bucket].update(["export"] if exports else [])
            stack = members[0][0]
            node = self.diagram.add(Node(_slug(fs or stack, "data_repository_associations"),
                                         "Data repository associations:\n" + "\n".join(lines), "config", stack, None,
                                         [(s, lid) for s, lid, _ in members]))
            self.dra_buckets[node.id] = flows
            self.diagram.edge(fs or None, node.id, "", "data", both=True)

    def _lifecycle_buckets(self) -> set[str]:
        names = set()
        for stack, _, props in self.of_type("AWS::SageMaker::Cluster"):
            for group in props.get("InstanceGroups", []):
                uri = self.app.text(stack, group.get("LifeCycleConfig", {}).get("SourceS3Uri", ""))
                match = re.match(r"s3://([^/]+)", uri)
                if match:
                    names.add(match.group(1))
        return names

    def buckets(self) -> None:
        data = {b for flows in self.dra_buckets.values() for b in flows}
        lifecycle_names = self._lifecycle_buckets()
        log_targets = set()
        for stack, _, props in self.of_type("AWS::S3::Bucket"):
            log_targets.update(self.app.refs(stack, props.get("LoggingConfiguration", {}).get("DestinationBucketName")))
        self.lifecycle_nodes: dict[str, str] = {}
        for stack, lid, props in self.of_type("AWS::S3::Bucket"):
            key = (stack, lid)
            name = self.app.text(stack, props["BucketName"]) if "BucketName" in props else None
            if key in data:
                role = "S3 data bucket"
            elif name is not None and name in lifecycle_names:
                role = "Lifecycle bucket"
            elif key in log_targets:
                role = "S3 access-log bucket"
            else:
                role = "S3 bucket"
            features = []
            if props.get("VersioningConfiguration", {}).get("Status") == "Enabled":
                features.append("versioned")
            for rule in props.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", []):
                algorithm = rule.get("ServerSideEncryptionByDefault", {}).get("SSEAlgorithm")
                features.append({"AES256": "SSE-S3", "aws:kms": "SSE-KMS"}.get(algorithm, str(algorithm)))
            for rule in props.get("LifecycleConfiguration", {}).get("Rules", []):
                if rule.get("ExpirationInDays") and rule.get("Status", "Enabled") == "Enabled":
                    features.append(f"expires after {rule['ExpirationInDays']} days")
            lines = [role] + ([_readable(name)] if name else []) + ([", ".join(features)] if features else [])
            node = self.diagram.add(Node(_slug(stack, lid), "\n".join(lines), "bucket", stack, None, [key]))
            if name is not None and name in lifecycle_names:
                self.lifecycle_nodes[name] = node.id

    def parameters(self) -> None:
        groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self.parameter_names: dict[str, str] = {}
        for stack, lid, props in self.of_type("AWS::SSM::Parameter"):
            name = self.app.text(stack, props.get("Name", lid))
            groups[stack].append((name, lid))
        for stack, members in sorted(groups.items()):
            names = sorted(n for n, _ in members)
            label = f"SSM parameter {names[0]}" if len(names) == 1 else f"SSM parameters ×{len(names)}\n" + "\n".join(names)
            node = self.diagram.add(Node(_slug(stack, "ssm_parameters"), label, "config", stack, None,
                                         [(stack, lid) for _, lid in members]))
            for name in names:
                self.parameter_names[name] = node.id

    def keys(self) -> None:
        for stack, lid, props in self.of_type("AWS::KMS::Key"):
            rotation = " (rotation on)" if props.get("EnableKeyRotation") else ""
            self.diagram.add(Node(_slug(stack, lid), f"KMS key{rotation}", "security", stack, None, [(stack, lid)]))

    def clusters(self) -> None:
        for stack, lid, props in self.of_type("AWS::SageMaker::Cluster"):
            orchestrator = ", ".join(sorted(props.get("Orchestrator", {}))) or "no orchestrator"
            lines = [f"HyperPod cluster {self.app.text(stack, props.get('ClusterName', lid))} ({orchestrator})"]
            for group in props.get("InstanceGroups", []):
                line = f"{group.get('InstanceGroupName')} {group.get('InstanceCount')}× {group.get('InstanceType')}"
                volumes = [c.get("EbsVolumeConfig", {}).get("VolumeSizeInGB") for c in group.get("InstanceStorageConfigs", [])]
                if any(volumes):
                    line += f", {sum(v for v in volumes if v)} GB EBS"
                lines.append(line)
            if props.get("NodeRecovery"):
                lines.append(f"node recovery: {props['NodeRecovery']}")
            self.diagram.add(Node(_slug(stack, lid), "\n".join(lines), "compute", stack, None, [(stack, lid)]))

    def roles(self) -> None:
        """Roles that a drawn resource uses; the rest (flow logs, custom resources) are supporting."""
        used: dict[tuple[str, str], tuple[str, str]] = {}
        for node in list(self.diagram.nodes.values()):
            for member in node.members:
                props = self.app.resource(member).get("Properties", {})
                for ref in self.app.refs(member[0], props):
                    if self.app.resource(ref).get("Type") == "AWS::IAM::Role":
                        how = "execution role" if "ExecutionRole" in json.dumps(props) else "role"
                        used.setdefault(ref, (node.id, how))
        for (stack, lid), (user, how) in sorted(used.items()):
            props = self.app.resource((stack, lid)).get("Properties", {})
            services = set()
            for pstack, _, policy in self.of_type("AWS::IAM::Policy"):
                if (stack, lid) in self.app.refs(pstack, policy.get("Roles")):
                    for statement in policy.get("PolicyDocument", {}).get("Statement", []):
                        actions = statement.get("Action", [])
                        for action in [actions] if isinstance(actions, str) else actions:
                            services.add(action.split(":")[0])
            managed = sorted(self.app.text(stack, arn).rsplit("/", 1)[-1] for arn in props.get("ManagedPolicyArns", []))
            principals = props.get("AssumeRolePolicyDocument", {}).get("Statement", [{}])[0].get("Principal", {}).get("Service", "")
            principals = [principals] if isinstance(principals, str) else principals
            lines = ["IAM role" + (f" ({', '.join(sorted(principals))})" if principals else "")]
            lines += managed
            if services:
                lines.append("inline: " + ", ".join(sorted(services)))
            node = self.diagram.add(Node(_slug(stack, lid), "\n".join(lines), "security", stack, None, [(stack, lid)]))
            self.diagram.edge(node.id, user, how, "wiring")

    def images(self) -> None:
        self.image_nodes = []
        for stack in self.stacks:
            for _, image in sorted(stack.docker_images.items(), key=lambda kv: kv[1].get("displayName", kv[0])):
                source = image.get("source", {})
                name = _humanize(image.get("displayName", "Image").split("/")[0])
                details = ", ".join(x for x in (source.get("dockerFile"), source.get("platform")) if x)
                label = f"{name} (ECR asset)" + (f"\n{details}" if details else "")
                node = self.diagram.add(Node(_slug(stack.name, "image", name), label, "image", stack.name))
                self.image_nodes.append(node.id)

    def other_resources(self) -> None:
        """Any resource type this module has no view of gets a counted node, so nothing significant is lost."""
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for stack in self.stacks:
            for lid, resource in sorted(stack.resources.items()):
                type_ = resource.get("Type", "")
                if (stack.name, lid) in self.diagram.index or type_ in SUPPORTING_TYPES or type_.startswith("Custom::") \
                        or type_ in ("AWS::IAM::Role", "AWS::Logs::LogGroup") or type_.startswith("AWS::CloudFormation::"):
                    continue
                groups[(stack.name, type_)].append(lid)
        for (stack, type_), lids in sorted(groups.items()):
            short = _humanize(type_.split("::")[-1])
            label = f"{short} ({type_})" if len(lids) == 1 else f"{short} ×{len(lids)} ({type_})"
            self.diagram.add(Node(_slug(stack, type_), label, "other", stack, None, [(stack, lid) for lid in lids]))

    def routes(self) -> None:
        """Default routes as the network path: private subnet -> NAT -> public subnet -> IGW -> internet."""
        d = self.diagram
        for stack, _, route in self.of_type("AWS::EC2::Route"):
            subnets = []
            for table in self.app.refs(stack, route.get("RouteTableId")):
                for astack, _, assoc in self.of_type("AWS::EC2::SubnetRouteTableAssociation"):
                    if astack == stack and table in self.app.refs(stack, assoc.get("RouteTableId")):
                        subnets += self.node_of(stack, assoc.get("SubnetId"))
            destination = route.get("DestinationCidrBlock", route.get("DestinationIpv6CidrBlock", ""))
            for target_field in ("NatGatewayId", "GatewayId", "TransitGatewayId"):
                for target in self.node_of(stack, route.get(target_field)):
                    for subnet in subnets:
                        d.edge(subnet, target, destination, "network")
        for stack, lid, props in self.of_type("AWS::EC2::NatGateway"):
            nat = d.index.get((stack, lid))
            for subnet in self.node_of(stack, props.get("SubnetId")):
                d.edge(nat, subnet, "", "network")
        for stack, lid, _ in self.of_type("AWS::EC2::InternetGateway"):
            d.edge(d.index.get((stack, lid)), INTERNET, "", "network")
        for stack, lid, props in self.of_type("AWS::EC2::VPCEndpoint"):
            endpoint = d.index.get((stack, lid))
            if props.get("VpcEndpointType") == "Interface":
                for subnet in self.node_of(stack, props.get("SubnetIds")):
                    d.edge(subnet, endpoint, "PrivateLink", "network")
            for table in self.app.refs(stack, props.get("RouteTableIds")):
                for astack, _, assoc in self.of_type("AWS::EC2::SubnetRouteTableAssociation"):
                    if astack == stack and table in self.app.refs(stack, assoc.get("RouteTableId")):
                        for subnet in self.node_of(stack, assoc.get("SubnetId")):
                            d.edge(subnet, endpoint, "route", "network")

    def wiring(self) -> None:
        d = self.diagram
        # Security groups and subnets that resources are placed in.
        for type_ in ("AWS::EC2::VPCEndpoint", "AWS::FSx::FileSystem"):
            for stack, lid, props in self.of_type(type_):
                user = d.index.get((stack, lid))
                for sg in self.node_of(stack, props.get("SecurityGroupIds")):
                    d.edge(user, sg, "", "wiring")
                if type_ == "AWS::FSx::FileSystem":
                    for subnet in self._subnet_nodes(stack, props.get("SubnetIds")):
                        d.edge(user, subnet, "in subnet", "wiring")
                    for key in self.node_of(stack, props.get("KmsKeyId")):
                        d.edge(key, user, "encrypts", "wiring")
        fs_groups = {}  # security group node -> file system node
        for stack, lid, props in self.of_type("AWS::FSx::FileSystem"):
            for sg in self.app.refs(stack, props.get("SecurityGroupIds")):
                fs_groups[sg] = (d.index[(stack, lid)], stack, lid)
        for stack, lid, props in self.of_type("AWS::SageMaker::Cluster"):
            cluster = d.index[(stack, lid)]
            vpc = props.get("VpcConfig", {})
            for sg in self.node_of(stack, vpc.get("SecurityGroupIds")):
                d.edge(cluster, sg, "VPC security group", "wiring")
            for subnet in self._subnet_nodes(stack, vpc.get("Subnets")):
                d.edge(cluster, subnet, "ENIs in", "network")
            # The nodes mount a file system whose security group lets the nodes' group in.
            cluster_groups = self.app.refs(stack, vpc.get("SecurityGroupIds"))
            for fs_sg, (fs_node, _, _) in sorted(fs_groups.items()):
                ports = [p for p, peer in self.sg_rules.get(fs_sg, {}).get("in", [])
                         if peer.startswith("§") and tuple(peer[1:].split("|")) in cluster_groups]
                if ports:
                    d.edge(cluster, fs_node, f"Lustre mount\n{_merge_ports(ports)}", "data")
            for name, bucket in sorted(self.lifecycle_nodes.items()):
                uris = {self.app.text(stack, g.get("LifeCycleConfig", {}).get("SourceS3Uri", "")) for g in props.get("InstanceGroups", [])}
                if any(u.startswith(f"s3://{name}/") or u == f"s3://{name}" for u in uris):
                    d.edge(bucket, cluster, "lifecycle scripts", "data")
            for image in self.image_nodes:
                d.edge(image, cluster, "training image", "data")
            # Parameters the nodes read (named in the execution role's policies).
            for role in self.app.refs(stack, [g.get("ExecutionRole") for g in props.get("InstanceGroups", [])]):
                for pstack, _, policy in self.of_type("AWS::IAM::Policy"):
                    if role in self.app.refs(pstack, policy.get("Roles")):
                        text = self.app.text(pstack, policy.get("PolicyDocument", {}))
                        for name, node in sorted(self.parameter_names.items()):
                            if f":parameter{name}" in text:
                                d.edge(node, cluster, "read at boot", "wiring")
        # Security group to security group rules across groups.
        for key, rules in sorted(self.sg_rules.items()):
            ports_by_peer: dict[str, list[str]] = defaultdict(list)
            for ports, peer in rules["in"]:
                if peer.startswith("§"):
                    ports_by_peer[d.index.get(tuple(peer[1:].split("|")))].append(ports)
            for peer, ports in sorted(ports_by_peer.items(), key=lambda kv: str(kv[0])):
                d.edge(peer, d.index[key], _merge_ports(ports), "wiring")
        # File system -> parameters that publish its attributes; data repository flows.
        for stack, lid, props in self.of_type("AWS::SSM::Parameter"):
            for source in self.node_of(stack, props.get("Value")):
                d.edge(source, d.index[(stack, lid)], "", "wiring")
        for dra, flows in sorted(self.dra_buckets.items()):
            for bucket, kinds in sorted(flows.items()):
                d.edge(dra, d.index.get(bucket), "/".join(k for k in ("import", "export") if k in kinds) or "linked", "data", both="export" in kinds)
        for stack, lid, props in self.of_type("AWS::S3::Bucket"):
            for target in self.node_of(stack, props.get("LoggingConfiguration", {}).get("DestinationBucketName")):
                d.edge(d.index[(stack, lid)], target, "access logs", "wiring")

    def _subnet_nodes(self, stack: str, value) -> list[str]:
        nodes = self.node_of(stack, value)
        for item in value if isinstance(value, list) else [value]:
            if self.app.text(stack, item).startswith("subnet-") and "existing_subnets" in self.diagram.nodes:
                nodes.append("existing_subnets")
        return list(dict.fromkeys(nodes))


# ---------------------------------------------------------------------------------------------
# DOT
# ---------------------------------------------------------------------------------------------


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _left(text: str) -> str:
    """A quoted multi-line label whose lines are left-justified (DOT's ``\\l`` line ends)."""
    return '"' + "".join(line.replace("\\", "\\\\").replace('"', '\\"') + "\\l" for line in text.split("\n")) + '"'


def _node_line(node: Node, indent: str) -> str:
    shape, fill, border = STYLES.get(node.category, STYLES["other"])
    style = "filled" if shape in ("cylinder", "note", "component", "box3d", "ellipse") else "rounded,filled"
    return (f'{indent}{_quote(node.id)} [label={_quote(node.label)}, shape={shape}, style="{style}", '
            f'fillcolor="{fill}", color="{border}"];')


def to_dot(diagram: Diagram) -> str:
    lines = [
        "digraph architecture {",
        f"  graph [label={_quote(diagram.title)}, labelloc=t, fontsize=22, fontname=\"Helvetica-Bold\", "
        "rankdir=TB, newrank=true, nodesep=0.3, ranksep=0.6, compound=true, pad=0.3, dpi=96, size=\"18.5,40\"];",
        '  node [fontname="Helvetica", fontsize=11, margin="0.15,0.07"];',
        '  edge [fontname="Helvetica", fontsize=9, arrowsize=0.7];',
    ]
    nodes = sorted(diagram.nodes.values(), key=lambda n: n.id)
    for index, stack in enumerate(diagram.stacks):
        members = [n for n in nodes if n.stack == stack.name]
        if not members:
            continue
        description = re.sub(r"^moe-cdk:\s*", "", stack.template.get("Description", ""))
        label = f"{stack.name} ({len(stack.resources)} resources)" + (f"\n{description}" if description else "")
        lines += [f"  subgraph {_quote('cluster_' + _slug(stack.name))} {{",
                  f"    label={_left(label)}; labeljust=l; fontsize=14; fontname=\"Helvetica-Bold\";",
                  f"    style=\"rounded,filled\"; fillcolor=\"{STACK_FILL[index % len(STACK_FILL)]}\"; color=\"#90A4AE\";"]
        for vpc_id, (vpc_stack, vpc_label) in sorted(diagram.vpcs.items()):
            inside = [n for n in members if n.vpc == vpc_id]
            if vpc_stack != stack.name or not inside:
                continue
            lines += [f"    subgraph {_quote('cluster_' + vpc_id)} {{",
                      f"      label={_left(vpc_label)}; labeljust=l; fontsize=12; fontname=\"Helvetica\";",
                      '      style="dashed,rounded"; color="#2E7D32"; fillcolor="#FFFFFF";']
            lines += [_node_line(n, "      ") for n in inside]
            lines.append("    }")
        lines += [_node_line(n, "    ") for n in members if n.vpc is None or n.vpc not in diagram.vpcs]
        lines.append("  }")
    lines += [_node_line(n, "  ") for n in nodes if n.stack is None]
    for (tail, head, label), kind in sorted(diagram.edges.items()):
        attributes = [EDGE_STYLES[kind]]
        if label:
            attributes.append(f"label={_quote(label)}")
        if (tail, head, label) in diagram.both_ways:
            attributes.append("dir=both")
        lines.append(f"  {_quote(tail)} -> {_quote(head)} [{', '.join(attributes)}];")
    legend = ('<<table border="0" cellborder="0" cellspacing="2">'
              '<tr><td align="left"><b>Edges</b></td></tr>'
              '<tr><td align="left"><font color="#1565C0">━━ data flow</font></td></tr>'
              '<tr><td align="left"><font color="#2E7D32">━━ network path</font></td></tr>'
              '<tr><td align="left"><font color="#757575">╌╌ wiring: security groups, roles, keys, parameters</font></td></tr>'
              '</table>>')
    lines.append(f'  legend [shape=box, style="rounded", color="#B0BEC5", fontsize=10, label={legend}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def architecture_dot(cdk_out: Path) -> str:
    """The Graphviz DOT source of the app synthesized into ``cdk_out``; the same input gives the same text."""
    return to_dot(Builder(load_stacks(Path(cdk_out))).build())


def render_png(dot: str, out: Path) -> None:
    """Render ``dot`` to a PNG at ``out`` with Graphviz; DiagramError if ``dot`` is missing or fails."""
    executable = shutil.which("dot")
    if executable is None:
        raise DiagramError("the `dot` command (Graphviz) is not installed; install it with: apt-get install graphviz")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([executable, "-Tpng", "-o", str(out)], input=dot.encode(), capture_output=True, check=False)
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip().splitlines()
        raise DiagramError(f"dot -Tpng failed (exit {result.returncode}): {message[-1] if message else 'no message'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_cdk.stacks.diagram",
                                     description="Draw the architecture of a synthesized app (cdk.out) with Graphviz.")
    parser.add_argument("--cdk-out", default="cdk.out", help="the synthesized app (default: cdk.out)")
    parser.add_argument("--output", default="docs/architecture.png", help="the PNG to write (default: docs/architecture.png)")
    parser.add_argument("--dot", default=None, help="also write the DOT source here (e.g. docs/architecture.dot)")
    args = parser.parse_args(argv)
    try:
        dot = architecture_dot(Path(args.cdk_out))
        if args.dot:
            Path(args.dot).parent.mkdir(parents=True, exist_ok=True)
            Path(args.dot).write_text(dot)
            print(f"wrote {args.dot}")
        render_png(dot, Path(args.output))
    except DiagramError as error:
        print(error, file=sys.stderr)
        return EXIT_INVALID
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
