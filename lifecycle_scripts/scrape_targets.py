#!/usr/bin/env python3
"""The Prometheus agent's scrape targets (file_sd JSON files) for every node of the cluster.

Standard library only, Python 3.8+, like node_info.py. Run on the controller every minute by
moe-cdk-scrape-targets.timer, and once by setup_observability.sh before the agent starts.

    scrape_targets.py --params PARAMS [--resource-config RESOURCE_CONFIG] --out DIR
                      [--slurm-exporter-address HOST:PORT]
                      [--controller-node-exporter-address HOST:PORT]

writes into DIR, each file only when its content changes and then in one rename (the agent
watches the files and must never read half of one):

    node.json          node_exporter, port 9100: every Slurm node, the login nodes, and the
                       controller, at --controller-node-exporter-address (default 127.0.0.1:9100:
                       this script and the agent run there, and its node_exporter takes loopback only)
    dcgm.json          DCGM exporter, port 9400: the Slurm nodes with GPUs
    efa.json           EFA exporter, port 9109: the Slurm nodes with the efa feature
    slurm.json         slurm_exporter.py on this controller (default 127.0.0.1:9341)
    moe-trainer.json   the trainer, port observability.trainer_metrics_port: every Slurm node;
                       removed when that port is null

Every target is labelled node (the Slurm node name) and instance_type. The files are lists
of {"targets": [...], "labels": {...}}, the format of Prometheus's file_sd_configs
(Prometheus docs, "Configuration": file_sd_config).

Where the targets come from:
  * Slurm nodes: `scontrol --details --oneliner show nodes`, parsed by slurm_exporter.py's
    parse_nodes. NodeName is the node label and NodeAddr the address; a node without NodeAddr, in
    the FUTURE state (not yet a node), or powered down or powering up (no instance behind it yet:
    ParallelCluster's dynamic nodes, whose NodeAddr is then their own name) is left out. GPUs: a
    Gres with GPUs, or an instance type of the p or g family (every one has NVIDIA GPUs, and the
    nodes' Gres is HyperPod's to set). EFA: "efa" among the node's features, which
    slurm_features.sh sets only on nodes where an EFA device shows (ParallelCluster sets it on the
    nodes of a queue with EFA on).
  * instance_type: the InstanceType of the resource_config.json group with an instance whose
    CustomerIpAddress is the NodeAddr; else the instance_type the parameters give the worker
    groups of the node's partitions, when they agree; else "unknown".
  * the controller and login nodes (not Slurm nodes on HyperPod): the instances of
    controller_group and login_group in resource_config.json, at their CustomerIpAddress, with
    node label "ip-A-B-C-D", the IP-based hostname EC2 gives an instance with address A.B.C.D
    (EC2 User Guide, "EC2 instance hostname types"), which is how HyperPod names its nodes.
    ParallelCluster has no resource_config.json (--resource-config is then left out): the
    controller is its head node, labelled with this host's short name, and the login nodes are
    not listed (they are no Slurm nodes, and their pool sits behind ParallelCluster's load balancer).

When scontrol fails the files stay as they are and the exit status is 1: a slurmctld that is
busy for a moment must not empty the target lists. Problems with the inputs exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile

from slurm_exporter import SCONTROL_NODES, Slurm, parse_nodes

log = logging.getLogger("scrape_targets")

NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400
EFA_EXPORTER_PORT = 9109
DEFAULT_SLURM_EXPORTER_ADDRESS = "127.0.0.1:9341"
DEFAULT_CONTROLLER_NODE_EXPORTER_ADDRESS = "127.0.0.1:9100"
SCONTROL_TIMEOUT_S = 30.0
# SageMaker instance types whose family letter marks NVIDIA GPUs: ml.p4d, ml.p5, ml.p5en, ml.g5, ml.g6e, ...
GPU_FAMILY_LETTERS = ("p", "g")
# Power-saving flags of nodes with no instance behind them (Slurm's scontrol man page, NODE STATE).
NO_INSTANCE_FLAGS = ("POWERED_DOWN", "POWERING_UP")
EXIT_SLURM_FAILED = 1
EXIT_INVALID = 2


class Invalid(Exception):
    """An input file this script cannot use."""


def load_json(path: str, label: str) -> object:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise Invalid(f"{label}: cannot be read as JSON (got {path!r}: {error})")


def ip_hostname(address: str) -> str:
    """EC2's IP-based host name of an IPv4 address: 10.0.64.12 is ip-10-0-64-12."""
    return "ip-" + address.replace(".", "-")


def host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def has_gpus(instance_type: str) -> bool:
    parts = instance_type.split(".")
    return len(parts) == 3 and parts[1][:1] in GPU_FAMILY_LETTERS


def group_instances(resource_config: object) -> list:
    """(group name, instance type, instance) for each instance in resource_config.json (none when None)."""
    if resource_config is None:
        return []
    groups = resource_config.get("InstanceGroups") if isinstance(resource_config, dict) else None
    if not isinstance(groups, list):
        raise Invalid("resource_config.json: no InstanceGroups list")
    return [
        (group.get("Name"), group.get("InstanceType") or "unknown", instance)
        for group in groups
        if isinstance(group, dict)
        for instance in group.get("Instances") or []
        if isinstance(instance, dict)
    ]


def partition_instance_types(params: dict) -> dict:
    """Partition name -> the instance types of its worker groups."""
    types: dict = {}
    for group in params.get("worker_groups") or []:
        types.setdefault(group.get("partition_name"), set()).add(group.get("instance_type"))
    return types


def entry(address: str, port: int, node: str, instance_type: str) -> dict:
    return {"targets": [host_port(address, port)], "labels": {"instance_type": instance_type, "node": node}}


def build_targets(
    slurm_nodes: list,
    params: dict,
    resource_config: object,
    slurm_exporter_address: str,
    controller_node_exporter_address: str = DEFAULT_CONTROLLER_NODE_EXPORTER_ADDRESS,
    controller_node: str = "",
) -> dict:
    """File name -> the file_sd list to write there (None: remove the file). The controller's node
    exporter is scraped at ``controller_node_exporter_address`` (where it listens), labelled with the
    controller's own node name: its IP-based name from ``resource_config``, else ``controller_node``
    (ParallelCluster, whose ``resource_config`` is None)."""
    instances = group_instances(resource_config)
    by_address = {i.get("CustomerIpAddress"): itype for _, itype, i in instances if i.get("CustomerIpAddress")}
    by_partition = partition_instance_types(params)
    observability = params.get("observability") or {}
    trainer_port = observability.get("trainer_metrics_port")

    node_targets, dcgm, efa, trainer = [], [], [], []
    for name in (params.get("controller_group"), params.get("login_group")):
        for group, itype, instance in instances:
            address = instance.get("CustomerIpAddress")
            if not (name and group == name and address):
                continue
            if name == params.get("controller_group"):
                labels = {"instance_type": itype, "node": ip_hostname(address)}
                node_targets.append({"targets": [controller_node_exporter_address], "labels": labels})
            else:
                node_targets.append(entry(address, NODE_EXPORTER_PORT, ip_hostname(address), itype))
    if resource_config is None:
        labels = {"instance_type": "unknown", "node": controller_node}
        node_targets.append({"targets": [controller_node_exporter_address], "labels": labels})
    for node in sorted(slurm_nodes, key=lambda n: n.name):
        state = node.state.upper()
        if not node.address or "FUTURE" in state or any(f in state.split("+") for f in NO_INSTANCE_FLAGS):
            continue
        itype = by_address.get(node.address)
        if itype is None:
            candidates: set = set()
            for partition in node.partitions:
                candidates |= by_partition.get(partition, set())
            itype = candidates.pop() if len(candidates) == 1 else "unknown"
        node_targets.append(entry(node.address, NODE_EXPORTER_PORT, node.name, itype))
        if node.gpus_total > 0 or has_gpus(itype):
            dcgm.append(entry(node.address, DCGM_EXPORTER_PORT, node.name, itype))
        if "efa" in node.features:
            efa.append(entry(node.address, EFA_EXPORTER_PORT, node.name, itype))
        if trainer_port:
            trainer.append(entry(node.address, trainer_port, node.name, itype))

    controllers = [(i.get("CustomerIpAddress"), t) for g, t, i in instances if g == params.get("controller_group")]
    address, itype = controllers[0] if controllers and controllers[0][0] else ("", "unknown")
    node = ip_hostname(address) if address else controller_node or "controller"
    slurm = [{"targets": [slurm_exporter_address], "labels": {"instance_type": itype, "node": node}}]
    return {
        "node.json": node_targets,
        "dcgm.json": dcgm,
        "efa.json": efa,
        "slurm.json": slurm,
        "moe-trainer.json": trainer if trainer_port else None,
    }


def write_if_changed(path: str, content: object) -> bool:
    """Write content as JSON to path in one rename; False (and nothing written) when it is already there."""
    text = json.dumps(content, indent=2, sort_keys=True) + "\n"
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except OSError:
        pass
    handle, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description="Write the Prometheus agent's file_sd target lists.")
    parser.add_argument("--params", required=True, help="provisioning_parameters.json")
    parser.add_argument("--resource-config", help="HyperPod's resource_config.json (none on ParallelCluster)")
    parser.add_argument("--out", required=True, help="folder of the target files")
    parser.add_argument("--slurm-exporter-address", default=DEFAULT_SLURM_EXPORTER_ADDRESS,
                        help=f"HOST:PORT of slurm_exporter.py (default {DEFAULT_SLURM_EXPORTER_ADDRESS})")
    parser.add_argument("--controller-node-exporter-address", default=DEFAULT_CONTROLLER_NODE_EXPORTER_ADDRESS,
                        help="HOST:PORT of this controller's node_exporter "
                        f"(default {DEFAULT_CONTROLLER_NODE_EXPORTER_ADDRESS})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        params = load_json(args.params, "provisioning_parameters.json")
        resource_config = None if args.resource_config is None else load_json(args.resource_config,
                                                                               "resource_config.json")
        if not isinstance(params, dict):
            raise Invalid("provisioning_parameters.json: not a JSON object")
        output = Slurm(SCONTROL_TIMEOUT_S).run(SCONTROL_NODES)
        if output is None:
            log.error("scontrol failed; the target files in %s are left as they are", args.out)
            return EXIT_SLURM_FAILED
        targets = build_targets(
            parse_nodes(output), params, resource_config, args.slurm_exporter_address,
            args.controller_node_exporter_address, socket.gethostname().split(".")[0],
        )
    except Invalid as error:
        log.error("%s", error)
        return EXIT_INVALID
    os.makedirs(args.out, exist_ok=True)
    for name, content in sorted(targets.items()):
        path = os.path.join(args.out, name)
        if content is None:
            if os.path.exists(path):
                os.unlink(path)
                log.info("removed %s", path)
        elif write_if_changed(path, content):
            log.info("wrote %s: %d targets", path, len(content))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
