#!/usr/bin/env python3
"""A Prometheus exporter for the cluster's Slurm state, run on the controller as a systemd service.

Standard library only, Python 3.8+ (the Python on HyperPod's AMI), like node_info.py.

    slurm_exporter.py [--listen-address HOST:PORT] [--command-timeout-s SECONDS]
        Serves GET /metrics in the Prometheus text format 0.0.4 (default address 127.0.0.1:9341:
        the agent on the same node is its only reader). Each scrape runs the three commands below,
        one after the other, within --command-timeout-s (default 8, under Prometheus's default
        scrape timeout of 10 s), and never two scrapes at once.

Every metric is a gauge:

    moe_slurm_up                              1 when sinfo, squeue and scontrol all succeeded in
                                              this scrape, else 0
    moe_slurm_nodes{partition,state}          nodes per partition and state; a node in two
                                              partitions counts in both
    moe_slurm_jobs{partition,state}           jobs per partition and state; a pending job that may
                                              run in several partitions counts in each, so the sum
                                              over partitions can exceed the number of jobs.
                                              "pending" and "running" are 0, not absent, for every
                                              partition sinfo lists
    moe_slurm_node_gpus_total{node}           GPUs of the node (its Gres)
    moe_slurm_node_gpus_allocated{node}       GPUs allocated to jobs (AllocTRES, else GresUsed)
    moe_slurm_account_gpus{account,state}     GPUs of the running and pending jobs of each account (a
                                              team's, with teams), nodes x GPUs per node (%b)

A family whose command failed is sent with its HELP and TYPE lines and no samples, beside
moe_slurm_up 0, so a failing Slurm shows as 0, never as stale numbers.

The commands and their formats (Slurm's sinfo, squeue and scontrol man pages, 22.05 and later):

    sinfo --noheader --Node --format=%N|%R|%T
        One line per node and partition: node name, partition name (%R has no "*" for the
        default partition, which %P adds), long state. The state's suffixes ("*" not
        responding, "~" powered off, "#" powering up, "!", "%", "$", "@", "^", "-") are
        dropped and it is lowercased: "down*" counts as "down", "idle~" as "idle".
    squeue --noheader --all --format=%P|%T|%a|%D|%b
        One line per job (by default only jobs that have not finished): partition (comma-separated
        for a job submitted to several), long state, lowercased ("RUNNING" becomes "running"),
        account, node count, and the generic resources asked per node ("gres:gpu:8", or "N/A").
    scontrol --details --oneliner show nodes
        One line per node of KEY=value fields. Gres ("gpu:8(S:0-1)", "gpu:h100:4",
        "(null)") gives the total; AllocTRES's "gres/gpu=N" the allocated count, which Slurm
        only tracks with AccountingStorageTRES=gres/gpu, and otherwise --details's GresUsed
        ("gpu:h100:2(IDX:0-1)"). scrape_targets.py reads the same lines for NodeAddr.

Port 9341 is the port of the Slurm exporter AWS's reference scripts install, which its
collector configuration scrapes (aws-samples/awsome-distributed-training,
1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/observability/
otel_config/config-head-template.yaml at 7217859). That exporter is built from source with Go at
boot; this one needs nothing that is not on the node.
"""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("slurm_exporter")

DEFAULT_LISTEN_ADDRESS = "127.0.0.1:9341"
DEFAULT_COMMAND_TIMEOUT_S = 8.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

SINFO = ("sinfo", "--noheader", "--Node", "--format=%N|%R|%T")
SQUEUE = ("squeue", "--noheader", "--all", "--format=%P|%T|%a|%D|%b")
SCONTROL_NODES = ("scontrol", "--details", "--oneliner", "show", "nodes")

# sinfo's node state suffixes (sinfo(1), "NODE STATE CODES").
STATE_SUFFIXES = "*~#!%$@^-+"
# Job states every partition reports, as 0 when no job is in them.
ZERO_FILLED_JOB_STATES = ("pending", "running")
# A KEY= at the start of a field of `scontrol --oneliner` output; values may hold spaces (OS=, Reason=).
FIELD_START = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=")
PARENTHESISED = re.compile(r"\([^)]*\)")

FAMILIES = (
    ("moe_slurm_up", "1 when sinfo, squeue and scontrol all succeeded in this scrape, else 0."),
    ("moe_slurm_nodes", "Slurm nodes per partition and state (sinfo; a node in two partitions counts in both)."),
    ("moe_slurm_jobs", "Slurm jobs per partition and state (squeue; unfinished jobs only)."),
    ("moe_slurm_node_gpus_total", "GPUs of the Slurm node (its Gres)."),
    ("moe_slurm_node_gpus_allocated", "GPUs of the Slurm node allocated to jobs (AllocTRES gres/gpu, else GresUsed)."),
    ("moe_slurm_account_gpus", "GPUs of running and pending jobs per account (a team) and state (squeue)."),
)
# The GPUs in squeue's %b (tres_per_node: "gres:gpu:8", "gres/gpu:h100:8", "gpu:8", "N/A").
GPUS_PER_NODE = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?[:=](\d+)")


@dataclass(frozen=True)
class SlurmNode:
    """One node of `scontrol --details --oneliner show nodes`. (Frozen, but not kw_only: that
    needs Python 3.10, and the AMI's Python may be 3.8.)"""

    name: str
    """NodeName, the node's Slurm name."""
    address: str
    """NodeAddr: where the node's exporters listen."""
    partitions: tuple
    """Partitions the node is in (empty when none)."""
    state: str
    """State, e.g. "IDLE" or "MIXED+DRAIN", as scontrol prints it."""
    features: tuple
    """ActiveFeatures, plus those recorded in Extra by slurm_features.sh ("moe-cdk-features:a,b")."""
    gpus_total: int
    """GPUs in the node's Gres."""
    gpus_allocated: int
    """GPUs allocated to jobs."""


def fields(line: str) -> dict:
    """The KEY=value fields of one `scontrol --oneliner` line; a value runs to the next KEY=."""
    starts = list(FIELD_START.finditer(line))
    found = {}
    for index, match in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(line)
        found[match.group(1)] = line[match.end() : end].strip()
    return found


def gres_gpus(gres: str) -> int:
    """GPUs in a Gres or GresUsed value: "gpu:8(S:0-1)" is 8, "gpu:h100:2(IDX:0,2),gpu:a100:1" is 3,
    "gpu" alone is 1, "(null)" and "N/A" are 0."""
    total = 0
    for item in PARENTHESISED.sub("", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            continue
        count = parts[-1] if len(parts) > 1 else "1"
        total += int(count) if count.isdigit() else 1  # "gpu:h100" (a type, no count) is one GPU
    return total


def tres_gpus(tres: str) -> int | None:
    """GPUs in a TRES list such as AllocTRES "cpu=4,mem=8G,gres/gpu=2,gres/gpu:h100=2" (the untyped
    count, else the sum of the typed ones); None when the list names no GPU at all."""
    untyped = None
    typed = 0
    found_typed = False
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if key == "gres/gpu":
            untyped = int(value)
        elif key.startswith("gres/gpu:"):
            typed += int(value)
            found_typed = True
    if untyped is not None:
        return untyped
    return typed if found_typed else None


def parse_nodes(text: str) -> list:
    """The SlurmNode of each line of `scontrol --details --oneliner show nodes`."""
    nodes = []
    for line in text.splitlines():
        found = fields(line)
        if "NodeName" not in found:
            continue
        partitions = found.get("Partitions", "")
        features = [f for f in found.get("ActiveFeatures", "").split(",") if f and f != "(null)"]
        extra = found.get("Extra", "")
        if extra.startswith("moe-cdk-features:"):
            features += [f for f in extra[len("moe-cdk-features:") :].split(",") if f and f not in features]
        allocated = tres_gpus(found.get("AllocTRES", ""))
        if allocated is None:
            allocated = gres_gpus(found.get("GresUsed", ""))
        nodes.append(
            SlurmNode(
                name=found["NodeName"],
                address=found.get("NodeAddr", ""),
                partitions=tuple(p for p in partitions.split(",") if p and p != "(null)"),
                state=found.get("State", ""),
                features=tuple(features),
                gpus_total=gres_gpus(found.get("Gres", "")),
                gpus_allocated=allocated,
            )
        )
    return nodes


def node_state(state: str) -> str:
    """sinfo's long state without its suffix flags, lowercased: "down*" is "down"."""
    return state.strip().rstrip(STATE_SUFFIXES).lower() or "unknown"


def count_nodes(text: str) -> dict:
    """(partition, state) -> nodes, from the sinfo lines."""
    counts: dict = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3:
            continue
        key = (parts[1], node_state(parts[2]))
        counts[key] = counts.get(key, 0) + 1
    return counts


def count_account_gpus(text: str) -> dict:
    """(account, state) -> GPUs of its running and pending jobs (nodes x GPUs per node), from the squeue lines;
    0 for an account whose jobs ask for none, so every account with a job shows."""
    counts: dict = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        state, account, nodes, tres = parts[1].strip().lower(), parts[2].strip(), parts[3].strip(), parts[4]
        if state not in ZERO_FILLED_JOB_STATES or account in ("", "(null)"):
            continue
        found = GPUS_PER_NODE.search(tres)
        gpus = int(found.group(1)) * (int(nodes) if nodes.isdigit() else 1) if found else 0
        counts[(account, state)] = counts.get((account, state), 0) + gpus
    return counts


def count_jobs(text: str, partitions: tuple) -> dict:
    """(partition, state) -> jobs, from the squeue lines, with 0 for the zero-filled states of
    every partition in ``partitions``."""
    counts: dict = {(p, s): 0 for p in partitions for s in ZERO_FILLED_JOB_STATES}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2:
            continue
        state = parts[1].strip().lower()
        for partition in parts[0].split(","):
            key = (partition, state)
            counts[key] = counts.get(key, 0) + 1
    return counts


def label_value(value: str) -> str:
    """A label value escaped as the text format requires (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample(name: str, labels: dict, value: float) -> str:
    rendered = ",".join(f'{key}="{label_value(str(v))}"' for key, v in labels.items())
    return f"{name}{{{rendered}}} {value:g}\n" if rendered else f"{name} {value:g}\n"


class Slurm:
    """Runs the Slurm commands of one scrape within a shared time budget."""

    def __init__(self, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s

    def run(self, argv: tuple) -> str | None:
        """The command's stdout, or None (logged) when it fails, cannot start or runs out of time."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            log.warning("%s not run: the scrape's time budget is spent", argv[0])
            return None
        try:
            done = subprocess.run(
                list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                timeout=remaining, check=False,
            )
        except (OSError, subprocess.SubprocessError) as error:
            log.warning("%s failed: %s", " ".join(argv), error)
            return None
        if done.returncode != 0:
            log.warning("%s exited with %d: %s", " ".join(argv), done.returncode, done.stderr.strip()[-500:])
            return None
        return done.stdout


def collect(timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S) -> str:
    """One scrape's exposition: every family's HELP and TYPE lines, and the samples that could be read."""
    slurm = Slurm(timeout_s)
    sinfo = slurm.run(SINFO)
    squeue = slurm.run(SQUEUE)
    scontrol = slurm.run(SCONTROL_NODES)
    samples: dict = {name: [] for name, _ in FAMILIES}
    up = sinfo is not None and squeue is not None and scontrol is not None
    samples["moe_slurm_up"].append(sample("moe_slurm_up", {}, 1 if up else 0))
    partitions: tuple = ()
    if sinfo is not None:
        nodes = count_nodes(sinfo)
        partitions = tuple(sorted({p for p, _ in nodes}))
        for (partition, state), count in sorted(nodes.items()):
            samples["moe_slurm_nodes"].append(sample("moe_slurm_nodes", {"partition": partition, "state": state}, count))
    if squeue is not None:
        for (partition, state), count in sorted(count_jobs(squeue, partitions).items()):
            samples["moe_slurm_jobs"].append(sample("moe_slurm_jobs", {"partition": partition, "state": state}, count))
        for (account, state), gpus in sorted(count_account_gpus(squeue).items()):
            samples["moe_slurm_account_gpus"].append(
                sample("moe_slurm_account_gpus", {"account": account, "state": state}, gpus))
    if scontrol is not None:
        for node in sorted(parse_nodes(scontrol), key=lambda n: n.name):
            samples["moe_slurm_node_gpus_total"].append(
                sample("moe_slurm_node_gpus_total", {"node": node.name}, node.gpus_total))
            samples["moe_slurm_node_gpus_allocated"].append(
                sample("moe_slurm_node_gpus_allocated", {"node": node.name}, node.gpus_allocated))
    out = []
    for name, help_text in FAMILIES:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
        out.extend(samples[name])
    return "".join(out)


class Handler(BaseHTTPRequestHandler):
    """GET /metrics; a lock keeps two scrapes from running the commands at once."""

    lock = threading.Lock()
    timeout_s = DEFAULT_COMMAND_TIMEOUT_S

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.reply(404, "text/plain; charset=utf-8", b"moe-cdk Slurm exporter: see /metrics\n")
            return
        with self.lock:
            body = collect(self.timeout_s).encode()
        self.reply(200, CONTENT_TYPE, body)

    def reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def parse_address(text: str) -> tuple:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host or "0.0.0.0", int(port)


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description="Prometheus exporter for Slurm (moe_slurm_* gauges).")
    parser.add_argument("--listen-address", type=parse_address, default=parse_address(DEFAULT_LISTEN_ADDRESS),
                        help=f"HOST:PORT to serve /metrics on (default {DEFAULT_LISTEN_ADDRESS})")
    parser.add_argument("--command-timeout-s", type=float, default=DEFAULT_COMMAND_TIMEOUT_S,
                        help="seconds the three Slurm commands of one scrape may take together (default 8)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    Handler.timeout_s = args.command_timeout_s
    server = ThreadingHTTPServer(args.listen_address, Handler)
    log.info("serving Slurm metrics on http://%s:%d/metrics", *server.server_address[:2])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
