#!/usr/bin/env python3
"""Facts about this HyperPod node, and validation of provisioning_parameters.json.

Standard library only, Python 3.8+ (the Python on HyperPod's AMI).

    node_info.py RESOURCE_CONFIG PROVISIONING_PARAMETERS
        Finds this node in HyperPod's resource_config.json and prints
            NODE_GROUP, NODE_ROLE (controller|login|compute on Slurm, worker on EKS),
            PARTITION, FEATURES, INSTANCE_TYPE, INSTANCE_ID, LUSTRE_EFA_INTERFACES
        as KEY=value lines. PARTITION and FEATURES (comma-separated) are empty except on
        Slurm compute nodes; on EKS every node is a worker, PARTITION is always empty and
        FEATURES lists its worker group's features. LUSTRE_EFA_INTERFACES is how many EFA
        interfaces the node sets up for an EFA-enabled file system (fsx_lustre.efa_interfaces
        of its group), 0 for TCP.
    node_info.py --group GROUP PROVISIONING_PARAMETERS
        The same facts for a node told its instance group (ParallelCluster passes it as an argument of the
        node's custom action; there is no resource_config.json). INSTANCE_TYPE is the worker group's, or
        empty on the head and login nodes.
    node_info.py --params PROVISIONING_PARAMETERS
        Prints the cluster-wide settings the scripts need: CLUSTER_MANAGER (hyperpod|parallelcluster),
        WORKLOAD_MANAGER (slurm|eks),
        REGION, FSX_ENABLED (true|false), FSX_DNS_NAME_PARAMETER, FSX_MOUNT_NAME_PARAMETER,
        FSX_MOUNT_POINT, then ENROOT_DATA_DIR and PYXIS (true|false) on Slurm, or
        CONTAINERD_DATA_DIR and CONTAINERD_FALLBACK_DIR on EKS, then OBSERVABILITY_ENABLED
        (true|false), OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER, OBSERVABILITY_SCRAPE_INTERVAL_S
        and OBSERVABILITY_TRAINER_METRICS_PORT (empty when null).
    node_info.py --check PROVISIONING_PARAMETERS
        Validates the file's structure and prints "OK: PATH".

workload_manager "slurm" and "eks" have different rules: on EKS, controller_group,
login_group, fsx_lustre (the FSx CSI driver mounts FSx into pods), observability and every
partition_name are null, and container_runtime holds containerd_data_dir and fallback_data_dir.

observability (setup_observability.sh) is null or
    {"remote_write_url_parameter": SSM name, "scrape_interval_s": 5..300,
     "trainer_metrics_port": 1024..65535 or null}
A file without the key is read as null: it is newer than the other keys, and a bundle generated
before it keeps working.

Every value printed matches [A-Za-z0-9_.,:/@%+=-]*, so a line is both safe to `source` and
safe to read literally (lib.sh's load_kv does the latter). Invalid input exits with status
2 and one line per problem on stderr, in the form
    <key>: <what is wrong> (got <value>; allowed <allowed>)

This node is found by its EC2 instance id (${MOE_LC_ROOT}/sys/devices/virtual/dmi/id/board_asset_tag
on Nitro instances) or, failing that, by one of its IPv4 addresses (MOE_LC_IPS, space-separated,
else `hostname -I`) matching an instance's CustomerIpAddress.

Source: HyperPod writes resource_config.json at /opt/ml/config (its InstanceGroups[].Name and
Instances[].CustomerIpAddress / InstanceId); AWS's reference lifecycle_script.py finds the node
the same way, by matching its address against CustomerIpAddress and its group against
controller_group and login_group (aws-samples/awsome-distributed-training,
1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/lifecycle_script.py at 7217859).
The instance id comes first here because a node has several addresses (EFA, containers).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

EXIT_INVALID = 2
DEFAULT_ENROOT_DATA_DIR = "/opt/dlami/nvme/enroot"
ASSET_TAG = "/sys/devices/virtual/dmi/id/board_asset_tag"

SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:/@%+=-]*$")
# HyperPod's pattern for instance group names.
GROUP_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
PARTITION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
FEATURE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9-]+\.[a-z0-9-]+$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")
SSM_NAME = re.compile(r"^/[A-Za-z0-9_./-]{1,1010}$")
ABSOLUTE_PATH = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")
VERSION = re.compile(r"^1\.[0-9]+\.[0-9]+$")
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{1,32}$")
# The Slurm exporter runs sinfo, squeue and scontrol once per scrape: every 5 s at the most.
# At most 300 s: Prometheus looks back 5 minutes for a series' latest sample (Prometheus docs,
# "Querying basics", staleness), so a longer interval leaves gaps between scrapes.
SCRAPE_INTERVAL_S = (5, 300)
# The trainer runs unprivileged, so not below 1024; and not on a port a compute node's
# exporter holds (node_exporter 9100, DCGM 9400, EFA 9109; setup_observability.sh).
TRAINER_PORTS = (1024, 65535)
EXPORTER_PORTS = (9100, 9109, 9400)

TOP_LEVEL_KEYS = (
    "version",
    "workload_manager",
    "region",
    "controller_group",
    "login_group",
    "worker_groups",
    "fsx_lustre",
    "container_runtime",
)
# Keys a file may lack; a missing one reads as null (cluster_manager as "hyperpod").
OPTIONAL_TOP_LEVEL_KEYS = ("observability", "teams", "cluster_manager")
CLUSTER_MANAGERS = ("hyperpod", "parallelcluster")
WORKER_KEYS = ("instance_group_name", "partition_name", "instance_type", "features")
FSX_KEYS = ("dns_name_parameter", "mount_name_parameter", "mount_point")
FSX_OPTIONAL_KEYS = ("efa_interfaces",)
CONTAINER_KEYS = ("enroot_data_dir", "pyxis")
EKS_CONTAINER_KEYS = ("containerd_data_dir", "fallback_data_dir")
OBSERVABILITY_KEYS = ("remote_write_url_parameter", "scrape_interval_s", "trainer_metrics_port")
WORKLOAD_MANAGERS = ("slurm", "eks")
GROUP_ALLOWED = "an instance group name: letters, digits and hyphens, at most 63 characters"
SSM_ALLOWED = "an SSM parameter name starting with '/'"
# What each key holds, for "missing" problems.
DESCRIPTIONS = {
    "version": "1.x.y",
    "workload_manager": "'slurm' or 'eks'",
    "region": "an AWS region such as 'us-east-2'",
    "controller_group": GROUP_ALLOWED,
    "login_group": GROUP_ALLOWED + " or null",
    "worker_groups": "a non-empty list of worker groups",
    "fsx_lustre": "an object with keys " + ", ".join(FSX_KEYS) + " or null",
    "container_runtime": "an object with keys " + ", ".join(CONTAINER_KEYS),
    "instance_group_name": GROUP_ALLOWED,
    "partition_name": "a Slurm partition name: letters, digits, '_' and '-'",
    "instance_type": "a SageMaker instance type such as 'ml.p5en.48xlarge'",
    "features": "a list of Slurm feature names",
    "dns_name_parameter": SSM_ALLOWED,
    "mount_name_parameter": SSM_ALLOWED,
    "mount_point": "an absolute path other than '/'",
    "efa_interfaces": "an object of worker group names to EFA interface counts (1 to 32)",
    "observability": "an object with keys " + ", ".join(OBSERVABILITY_KEYS) + " or null",
    "teams": "an object with lists qos and teams, or null",
    "remote_write_url_parameter": SSM_ALLOWED,
    "scrape_interval_s": f"an integer number of seconds from {SCRAPE_INTERVAL_S[0]} to {SCRAPE_INTERVAL_S[1]}",
    "trainer_metrics_port": (
        f"a port from {TRAINER_PORTS[0]} to {TRAINER_PORTS[1]} other than the exporters' "
        + ", ".join(map(str, EXPORTER_PORTS)) + ", or null"
    ),
}
# On EKS (workload_manager "eks") these keys hold something else.
EKS_NULL = "null when workload_manager is 'eks'"
EKS_DESCRIPTIONS = {
    **DESCRIPTIONS,
    "controller_group": EKS_NULL,
    "login_group": EKS_NULL,
    "fsx_lustre": EKS_NULL,
    "observability": EKS_NULL,
    "teams": EKS_NULL,
    "container_runtime": "an object with keys " + ", ".join(EKS_CONTAINER_KEYS),
    "partition_name": EKS_NULL,
    "features": "a list of feature names",
    "containerd_data_dir": "an absolute path other than '/'",
    "fallback_data_dir": "an absolute path other than '/'",
}


class Invalid(Exception):
    """Input that the scripts cannot use: one formatted line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def show(value: object) -> str:
    """A value as it appears after "got" in a problem line."""
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "null"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def problem(key: str, what: str, got: str, allowed: str) -> str:
    return f"{key}: {what} (got {got}; allowed {allowed})"


def path_is_sane(path: str) -> bool:
    return bool(ABSOLUTE_PATH.match(path)) and not any(part in (".", "..") for part in path.split("/"))


class Checker:
    def __init__(self, descriptions: dict = DESCRIPTIONS) -> None:
        self.problems: list[str] = []
        self.descriptions = descriptions

    def add(self, key: str, what: str, got: str, allowed: str) -> None:
        self.problems.append(problem(key, what, got, allowed))

    def keys(self, obj: dict, key: str, required: tuple, optional: tuple = ()) -> None:
        for name in required:
            if name not in obj:
                self.add(f"{key}{name}", "missing", "nothing", self.descriptions.get(name, "a value"))
        for name in obj:
            if name not in required and name not in optional:
                self.add(key.rstrip(".") or "provisioning_parameters.json", "unknown key", show(name),
                         ", ".join(required + optional))

    def string(self, obj: dict, key: str, name: str, pattern: re.Pattern, allowed: str,
               nullable: bool = False) -> str | None:
        if name not in obj:
            return None
        value = obj[name]
        if value is None and nullable:
            return None
        if not isinstance(value, str) or not pattern.match(value):
            self.add(f"{key}{name}", "invalid", show(value), allowed + (" or null" if nullable else ""))
            return None
        return value


def validate(params: object) -> dict:
    """Checks the structure of provisioning_parameters.json; raises Invalid listing every problem."""
    if not isinstance(params, dict):
        raise Invalid([problem("provisioning_parameters.json", "not a JSON object", show(params), "a JSON object")])
    # An unknown or missing workload_manager is reported below and checked with Slurm's rules.
    eks = params.get("workload_manager") == "eks"
    check = Checker(EKS_DESCRIPTIONS if eks else DESCRIPTIONS)
    check.keys(params, "", TOP_LEVEL_KEYS, OPTIONAL_TOP_LEVEL_KEYS)

    version = params.get("version")
    if "version" in params and (not isinstance(version, str) or not VERSION.match(version)):
        check.add("version", "unsupported", show(version), "1.x.y")
    manager = params.get("cluster_manager", "hyperpod")
    if manager not in CLUSTER_MANAGERS or (manager == "parallelcluster" and eks):
        check.add("cluster_manager", "unsupported", show(manager),
                  "'hyperpod', or 'parallelcluster' with workload_manager 'slurm'")
    if "workload_manager" in params and params["workload_manager"] not in WORKLOAD_MANAGERS:
        check.add("workload_manager", "unsupported", show(params["workload_manager"]), DESCRIPTIONS["workload_manager"])
    check.string(params, "", "region", REGION, DESCRIPTIONS["region"])
    if eks:
        # EKS has no Slurm controller or login nodes: every instance group is a worker group.
        controller = login = None
        for name in ("controller_group", "login_group"):
            if params.get(name) is not None:
                check.add(name, "not used on EKS", show(params[name]), EKS_NULL)
    else:
        controller = check.string(params, "", "controller_group", GROUP_NAME, GROUP_ALLOWED)
        login = check.string(params, "", "login_group", GROUP_NAME, GROUP_ALLOWED, nullable=True)
        if controller is not None and controller == login:
            check.add("login_group", "same as controller_group", show(login), "a different instance group or null")
    feature_kind = "feature" if eks else "Slurm feature"

    workers = params.get("worker_groups")
    if "worker_groups" in params:
        if not isinstance(workers, list) or not workers:
            check.add("worker_groups", "invalid", show(workers), DESCRIPTIONS["worker_groups"])
            workers = []
        seen: set = set()
        for index, group in enumerate(workers):
            key = f"worker_groups[{index}]."
            if not isinstance(group, dict):
                check.add(key.rstrip("."), "invalid", show(group), "an object with keys " + ", ".join(WORKER_KEYS))
                continue
            check.keys(group, key, WORKER_KEYS)
            name = check.string(group, key, "instance_group_name", GROUP_NAME, GROUP_ALLOWED)
            if not eks:
                check.string(group, key, "partition_name", PARTITION_NAME, DESCRIPTIONS["partition_name"])
            elif group.get("partition_name") is not None:
                check.add(f"{key}partition_name", "not used on EKS", show(group["partition_name"]), EKS_NULL)
            check.string(group, key, "instance_type", INSTANCE_TYPE, DESCRIPTIONS["instance_type"])
            if name is not None:
                if name in seen:
                    check.add(f"{key}instance_group_name", "duplicate", show(name), "each worker group once")
                if name in (controller, login):
                    check.add(f"{key}instance_group_name", "also the controller or login group", show(name),
                              "a group that only runs compute nodes")
                seen.add(name)
            features = group.get("features")
            if "features" in group:
                if not isinstance(features, list):
                    check.add(f"{key}features", "invalid", show(features), f"a list of {feature_kind} names")
                else:
                    for position, feature in enumerate(features):
                        if not isinstance(feature, str) or not FEATURE.match(feature):
                            check.add(f"{key}features[{position}]", "invalid", show(feature),
                                      f"a {feature_kind} name: letters, digits, '_', '.' and '-'")
                    if len(set(map(str, features))) != len(features):
                        check.add(f"{key}features", "duplicate feature", show(features), "each feature once")

    fsx = params.get("fsx_lustre")
    if fsx is not None and eks:
        check.add("fsx_lustre", "not used on EKS", show(fsx),
                  EKS_NULL + ": the FSx CSI driver mounts FSx for Lustre into pods")
    elif fsx is not None:
        if not isinstance(fsx, dict):
            check.add("fsx_lustre", "invalid", show(fsx), DESCRIPTIONS["fsx_lustre"])
        else:
            check.keys(fsx, "fsx_lustre.", FSX_KEYS, FSX_OPTIONAL_KEYS)
            efa = fsx.get("efa_interfaces", {})
            names = {w.get("instance_group_name") for w in (workers or []) if isinstance(w, dict)}
            if not isinstance(efa, dict) or any(
                    g not in names or type(n) is not int or not 1 <= n <= 32 for g, n in efa.items()):
                check.add("fsx_lustre.efa_interfaces", "invalid", show(efa), DESCRIPTIONS["efa_interfaces"])
            check.string(fsx, "fsx_lustre.", "dns_name_parameter", SSM_NAME, SSM_ALLOWED)
            check.string(fsx, "fsx_lustre.", "mount_name_parameter", SSM_NAME, SSM_ALLOWED)
            mount_point = fsx.get("mount_point")
            if "mount_point" in fsx and (not isinstance(mount_point, str) or not path_is_sane(mount_point)):
                check.add("fsx_lustre.mount_point", "invalid", show(mount_point), "an absolute path other than '/'")

    runtime = params.get("container_runtime")
    if "container_runtime" in params and eks:
        if not isinstance(runtime, dict):
            check.add("container_runtime", "invalid", show(runtime), EKS_DESCRIPTIONS["container_runtime"])
        else:
            check.keys(runtime, "container_runtime.", EKS_CONTAINER_KEYS)
            for name in EKS_CONTAINER_KEYS:
                if name in runtime and (not isinstance(runtime[name], str) or not path_is_sane(runtime[name])):
                    check.add(f"container_runtime.{name}", "invalid", show(runtime[name]),
                              "an absolute path other than '/'")
    elif "container_runtime" in params:
        if not isinstance(runtime, dict):
            check.add("container_runtime", "invalid", show(runtime), DESCRIPTIONS["container_runtime"])
        else:
            check.keys(runtime, "container_runtime.", (), CONTAINER_KEYS)
            data_dir = runtime.get("enroot_data_dir", DEFAULT_ENROOT_DATA_DIR)
            if not isinstance(data_dir, str) or not path_is_sane(data_dir):
                check.add("container_runtime.enroot_data_dir", "invalid", show(data_dir), "an absolute path other than '/'")
            if not isinstance(runtime.get("pyxis", True), bool):
                check.add("container_runtime.pyxis", "invalid", show(runtime["pyxis"]), "true or false")

    observability = params.get("observability")
    if observability is not None and eks:
        check.add("observability", "not used on EKS", show(observability), EKS_NULL)
    elif observability is not None:
        check_observability(check, observability)

    teams = params.get("teams")
    if teams is not None and eks:
        check.add("teams", "not used on EKS (task governance holds the teams there)", show(teams), EKS_NULL)
    elif teams is not None:
        check_teams(check, teams)

    if check.problems:
        raise Invalid(check.problems)
    return params


# The names slurm_teams.sh passes to sacctmgr and useradd, and uses in paths (rules/teams.py checks the same).
TEAM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
QOS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,52}[a-z0-9])?$")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def check_teams(check: Checker, teams: object) -> None:
    """The teams object: QoS tiers and teams with names that are safe in commands and paths, integer figures."""
    if not isinstance(teams, dict) or not all(isinstance(teams.get(k), list) for k in ("qos", "teams")):
        check.add("teams", "invalid", show(teams), DESCRIPTIONS["teams"])
        return
    for i, tier in enumerate(teams["qos"]):
        key = f"teams.qos[{i}]"
        if not isinstance(tier, dict) or not QOS_NAME.match(str(tier.get("name", ""))):
            check.add(key, "invalid", show(tier), "an object with a QoS name: lowercase letters, digits, inner '-'")
        elif not is_int(tier.get("priority")) or not all(QOS_NAME.match(str(p)) for p in tier.get("preempts", [])):
            check.add(key, "invalid", show(tier), "an integer priority and a list of QoS names to preempt")
    for i, team in enumerate(teams["teams"]):
        key = f"teams.teams[{i}]"
        if not isinstance(team, dict) or not TEAM_NAME.match(str(team.get("name", ""))):
            check.add(key, "invalid", show(team), "an object with a team name: lowercase letters, digits, inner '-'")
            continue
        if not is_int(team.get("share_percent")):
            check.add(f"{key}.share_percent", "invalid", show(team.get("share_percent")), "an integer")
        for j, member in enumerate(team.get("members", [])):
            if not (isinstance(member, dict) and USER_NAME.match(str(member.get("name", "")))
                    and is_int(member.get("uid"))):
                check.add(f"{key}.members[{j}]", "invalid", show(member), "an object with a login name and an integer uid")


def is_int(value: object) -> bool:
    return type(value) is int  # not bool, which JSON's true would give


def check_observability(check: Checker, observability: object) -> None:
    """The observability object: the SSM name of the remote-write URL, the scrape interval, the trainer's port."""
    if not isinstance(observability, dict):
        check.add("observability", "invalid", show(observability), DESCRIPTIONS["observability"])
        return
    check.keys(observability, "observability.", OBSERVABILITY_KEYS)
    check.string(observability, "observability.", "remote_write_url_parameter", SSM_NAME, SSM_ALLOWED)
    interval = observability.get("scrape_interval_s")
    low, high = SCRAPE_INTERVAL_S
    if "scrape_interval_s" in observability and not (is_int(interval) and low <= interval <= high):
        check.add("observability.scrape_interval_s", "invalid", show(interval), DESCRIPTIONS["scrape_interval_s"])
    port = observability.get("trainer_metrics_port")
    low, high = TRAINER_PORTS
    if port is not None and not (is_int(port) and low <= port <= high and port not in EXPORTER_PORTS):
        check.add("observability.trainer_metrics_port", "invalid", show(port), DESCRIPTIONS["trainer_metrics_port"])


def load_json(path: str, label: str) -> object:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as error:
        raise Invalid([problem(label, "cannot be read", f"{path!r}, {error.strerror}", "a readable JSON file")])
    except ValueError as error:
        raise Invalid([problem(label, "not valid JSON", f"{path!r}, {error}", "a JSON document")])


def load_params(path: str) -> dict:
    return validate(load_json(path, "provisioning_parameters.json"))


def instance_groups(resource_config: object) -> list:
    """The InstanceGroups of resource_config.json, after checking what this script relies on."""
    groups = resource_config.get("InstanceGroups") if isinstance(resource_config, dict) else None
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("Name"), str) and isinstance(g.get("Instances", []), list)
        for g in groups
    ):
        raise Invalid([problem("resource_config.json InstanceGroups", "invalid", show(groups),
                               "a list of objects with Name and Instances")])
    return groups


def own_instance_id() -> str:
    path = os.environ.get("MOE_LC_ROOT", "") + ASSET_TAG
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            tag = handle.read().strip()
    except OSError:
        return ""
    return tag if INSTANCE_ID.match(tag) else ""


def own_ips() -> list:
    if "MOE_LC_IPS" in os.environ:
        return os.environ["MOE_LC_IPS"].split()
    try:
        result = subprocess.run(["hostname", "-I"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                universal_newlines=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return result.stdout.split()


def find_node(groups: list) -> tuple:
    """(group, instance) of this node."""
    instances = [(g, i) for g in groups for i in g.get("Instances", []) if isinstance(i, dict)]
    instance_id = own_instance_id()
    if instance_id:
        matches = [(g, i) for g, i in instances if i.get("InstanceId") == instance_id]
        if len(matches) == 1:
            return matches[0]
    ips = own_ips()
    matches = [(g, i) for g, i in instances if i.get("CustomerIpAddress") in ips]
    if len(matches) == 1:
        return matches[0]
    got = f"instance id {instance_id or 'unknown'!r}, addresses {' '.join(ips) or 'none'}"
    if matches:
        names = ", ".join(str(i.get("InstanceName")) for _, i in matches)
        raise Invalid([problem("node", "matches several instances in resource_config.json", got,
                               f"exactly one; matched {names}")])
    known = ", ".join(f"{i.get('InstanceId')}/{i.get('CustomerIpAddress')}" for _, i in instances[:20])
    raise Invalid([problem("node", "not found in resource_config.json", got,
                           f"an instance id or CustomerIpAddress listed there: {known or 'none'}")])


def node_facts(resource_config_path: str, params_path: str) -> dict:
    params = load_params(params_path)
    group, instance = find_node(instance_groups(load_json(resource_config_path, "resource_config.json")))
    return group_facts(params, group, instance)


def told_node_facts(name: str, params_path: str) -> dict:
    """The facts of a node of instance group ``name``, as its launcher says (--group)."""
    params = load_params(params_path)
    if not GROUP_NAME.match(name):
        raise Invalid([problem("--group", "not an instance group name", show(name), GROUP_ALLOWED)])
    return group_facts(params, {"Name": name}, {"InstanceId": own_instance_id()})


def group_facts(params: dict, group: dict, instance: dict) -> dict:
    name = group["Name"]
    workers = {w["instance_group_name"]: w for w in params["worker_groups"]}
    facts = {"NODE_GROUP": name, "NODE_ROLE": "", "PARTITION": "", "FEATURES": ""}
    if params["workload_manager"] == "eks":
        # Every EKS node is a Kubernetes worker; there are no partitions.
        if name not in workers:
            raise Invalid([problem("instance group", "not in provisioning_parameters.json", show(name),
                                   ", ".join(workers))])
        facts["NODE_ROLE"] = "worker"
        facts["FEATURES"] = ",".join(workers[name]["features"])
    elif name == params["controller_group"]:
        facts["NODE_ROLE"] = "controller"
    elif name == params["login_group"]:
        facts["NODE_ROLE"] = "login"
    elif name in workers:
        facts["NODE_ROLE"] = "compute"
        facts["PARTITION"] = workers[name]["partition_name"]
        facts["FEATURES"] = ",".join(workers[name]["features"])
    else:
        allowed = [params["controller_group"]] + ([params["login_group"]] if params["login_group"] else [])
        allowed += list(workers)
        raise Invalid([problem("instance group", "not in provisioning_parameters.json", show(name), ", ".join(allowed))])
    instance_type = group.get("InstanceType") or workers.get(name, {}).get("instance_type", "")
    if name in workers and instance_type != workers[name]["instance_type"]:
        print(f"WARNING: instance group {name!r} runs {instance_type!r} but provisioning_parameters.json "
              f"says {workers[name]['instance_type']!r}", file=sys.stderr)
    facts["INSTANCE_TYPE"] = instance_type
    facts["INSTANCE_ID"] = instance.get("InstanceId", "")
    facts["LUSTRE_EFA_INTERFACES"] = str(((params["fsx_lustre"] or {}).get("efa_interfaces") or {}).get(name, 0))
    return facts


def cluster_settings(params_path: str) -> dict:
    params = load_params(params_path)
    fsx = params["fsx_lustre"] or {}
    runtime = params["container_runtime"]
    settings = {
        "CLUSTER_MANAGER": params.get("cluster_manager", "hyperpod"),
        "WORKLOAD_MANAGER": params["workload_manager"],
        "REGION": params["region"],
        "FSX_ENABLED": "true" if fsx else "false",
        "FSX_DNS_NAME_PARAMETER": fsx.get("dns_name_parameter", ""),
        "FSX_MOUNT_NAME_PARAMETER": fsx.get("mount_name_parameter", ""),
        "FSX_MOUNT_POINT": fsx.get("mount_point", ""),
    }
    if params["workload_manager"] == "eks":
        settings["CONTAINERD_DATA_DIR"] = runtime["containerd_data_dir"]
        settings["CONTAINERD_FALLBACK_DIR"] = runtime["fallback_data_dir"]
    else:
        settings["ENROOT_DATA_DIR"] = runtime.get("enroot_data_dir", DEFAULT_ENROOT_DATA_DIR)
        settings["PYXIS"] = "true" if runtime.get("pyxis", True) else "false"
    observability = params.get("observability") or {}
    port = observability.get("trainer_metrics_port")
    settings["OBSERVABILITY_ENABLED"] = "true" if observability else "false"
    settings["OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER"] = observability.get("remote_write_url_parameter", "")
    settings["OBSERVABILITY_SCRAPE_INTERVAL_S"] = str(observability.get("scrape_interval_s", ""))
    settings["OBSERVABILITY_TRAINER_METRICS_PORT"] = "" if port is None else str(port)
    return settings


def emit(values: dict) -> None:
    bad = [problem(key, "contains characters that are not shell-safe", show(value), "[A-Za-z0-9_.,:/@%+=-]")
           for key, value in values.items() if not SAFE_VALUE.match(str(value))]
    if bad:
        raise Invalid(bad)
    sys.stdout.write("".join(f"{key}={value}\n" for key, value in values.items()))


USAGE = (
    "usage: node_info.py RESOURCE_CONFIG PROVISIONING_PARAMETERS\n"
    "       node_info.py --group GROUP PROVISIONING_PARAMETERS\n"
    "       node_info.py --params PROVISIONING_PARAMETERS\n"
    "       node_info.py --check PROVISIONING_PARAMETERS\n"
)


def main(argv: list) -> int:
    try:
        if len(argv) == 2 and argv[0] == "--check":
            load_params(argv[1])
            print(f"OK: {argv[1]}")
        elif len(argv) == 2 and argv[0] == "--params":
            emit(cluster_settings(argv[1]))
        elif len(argv) == 3 and argv[0] == "--group":
            emit(told_node_facts(argv[1], argv[2]))
        elif len(argv) == 2 and not argv[0].startswith("-"):
            emit(node_facts(argv[0], argv[1]))
        else:
            sys.stderr.write(USAGE)
            return EXIT_INVALID
    except Invalid as error:
        for line in error.problems:
            print(line, file=sys.stderr)
        return EXIT_INVALID
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
