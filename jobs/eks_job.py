"""The Kubernetes training job for a HyperPod EKS cluster, rendered from an ``EksJobSpec``.

``render_pytorchjob(spec)`` returns a Kubeflow ``PyTorchJob``; ``render_hyperpod_job(spec)``
the HyperPod training operator's ``HyperPodPyTorchJob`` with log-based hang detection. Both
run one pod per node:

* the pod's own network, or ``hostNetwork`` with ``dnsPolicy: ClusterFirstWithHostNet`` (the
  node's interfaces; the pod still resolves cluster names): ``EksJobSpec.host_network``, by default
  the node's for a job without a team and the pod's own for a team's (see ``POD_NETWORK`` below);
* as unprivileged as training allows: every capability dropped, no privilege escalation, the
  runtime's default seccomp profile (see ``POD_SECURITY_CONTEXT`` below);
* accelerators and ``vpc.amazonaws.com/efa`` requested from the instance catalog: every
  device the node has, never more (a pod asking for more than the node advertises would
  stay Pending forever);
* the FSx claim at ``/fsx`` and a memory-backed ``/dev/shm`` for the data loaders and NCCL;
* the training profile from a ConfigMap rendered beside the job (``render_profile_config_map``),
  mounted read-only at ``/etc/moe-train``: the job runs the profile it was rendered from, not one
  baked into the image;
* ``restartPolicy: ExitCode``: the training operator restarts a pod only for 130, 137, 138
  and 143 and treats every other code as permanent (``training/exit_codes.py``); the
  trainer exits 2 for a bad configuration, 143 after SIGTERM and a checkpoint, 138 after a
  crash. ``nprocPerNode`` makes each pod the node launcher (``training/node_launcher.py``),
  which keeps those codes;
* a startup probe that waits for the first metrics record, a readiness probe on the same
  file, and a liveness probe that fails when no record has been written for
  ``stall_timeout_s`` (the trainer touches the files at every record, on every rank);
* tolerations for exactly the taints the configuration puts on the group.

``charts/moe-training`` renders the same objects from Helm values; ``helm_values(spec)``
gives those values, and the tests check that both agree.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field

import yaml

from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.jobs.profile import PROFILE_FILE, JobProfile, load_job_profile
from moe_cdk.jobs.slurm_job import nsys_wrapper
from moe_cdk.rules import eks as eks_rules
from moe_cdk.rules.eks import KUBERNETES_NAME
from moe_cdk.rules.neuron import moe_train_refusal
from moe_cdk.rules.teams import PRIORITY_LABEL, QUEUE_LABEL, job_team, priority_class, queue_name, team_namespace
from moe_cdk.schema.config import Config, nodes_of

CONTAINER = "pytorch"  # the container name the Kubeflow training operator looks for
FSX_MOUNT = "/fsx"
LIVENESS_FILE = "/tmp/moe-train/alive"
READINESS_FILE = "/tmp/moe-train/ready"
# The trainer's progress line (training/metrics.py), e.g. "step 120/5000 loss 2.3140 tokens/s ...".
PROGRESS_LOG_PATTERN = r".*step \d+/\d+ loss .*"
PROFILE_MOUNT = "/etc/moe-train"
PROFILE_PATH = f"{PROFILE_MOUNT}/{PROFILE_FILE}"
"""Where the pods read the training profile."""
# Kubernetes docs, "ConfigMaps": the data stored in a ConfigMap cannot exceed 1 MiB.
CONFIG_MAP_MAX_BYTES = 1024 * 1024

# POD_NETWORK. EFA does not need the host network: the EFA device plugin advertises the node's EFA devices as
# vpc.amazonaws.com/efa and mounts the ones a pod requests into its container, without privileged mode (EKS User
# Guide, "Run machine learning training on Amazon EKS with Elastic Fabric Adapter",
# awsdocs/amazon-eks-user-guide@4d52b4d:latest/ug/ml/node-efa.adoc; the device plugin's chart,
# aws/eks-charts@5239609:stable/aws-efa-k8s-device-plugin). AWS's own EFA jobs on EKS and HyperPod EKS run on the
# pod network: that guide's nccl-tests MPIJob, the PyTorchJob and HyperPodPyTorchJob examples of
# aws-samples/awsome-distributed-training@7217859 (3.test_cases/megatron/megatron-lm/kubernetes/gpt3/manifests/
# pytorchjob.yaml-template, 3.test_cases/pytorch/FSDP/kubernetes/llama3_1_8b-fsdp-hpto.yaml, NCCL_SOCKET_IFNAME=^lo)
# and aws/sagemaker-hyperpod-cli@011ca92's HyperPodPyTorchJob template
# (hyperpod-pytorch-job-template/hyperpod_pytorch_job_template/v1_1/template.py); none sets hostNetwork, and
# preflight_job.py's nccl-tests MPIJob already runs over EFA on it. What the pod network trades: NCCL's bootstrap
# sockets use the pod's eth0 (NCCL skips lo by itself; the image sets no NCCL_SOCKET_IFNAME, and the nodes'
# ^docker,lo,veth of lifecycle_scripts/efa_env.sh is not needed in a pod); the rendezvous (the training
# operator's MASTER_ADDR, a Service name) and the scraper (kubernetes_sd role pod, the pod's IP and its
# prometheus.io/port) reach the pod's own IP instead of the node's; each pod takes one VPC address. It gains: the
# pod does not share the node's network namespace, and Pod Security "baseline" admits it. It does not by itself
# keep the pod from the instance metadata service: that takes IMDSv2 with a hop limit of 1 on the node.
# A job without a team keeps the host network by default (the project's EKS design); a team's job runs on the pod
# network, which its namespace's Pod Security level requires (constructs/lustre_volume.py).

# POD_SECURITY_CONTEXT. The training image (training/Dockerfile, on the PyTorch DLC) has no USER and runs as root;
# FSx for Lustre has no root squash here and its folders are root's (docs/teams.md), so runAsNonRoot/runAsUser
# are not set: a non-root uid could not write /fsx, nor HOME (/root). Root runs with no capability instead, so it
# cannot override file permissions (DAC_OVERRIDE), change owners, mount a file system or signal another user's
# processes, and cannot regain a capability through a setuid binary (allowPrivilegeEscalation: false). None is
# added back: EFA needs pinned memory, which is the container's RLIMIT_MEMLOCK (set by the node's runtime), not a
# capability; containerd's default set has no IPC_LOCK (containerd/containerd@301026e:pkg/oci/spec.go), so AWS's
# examples above run without it too. Under the runtime's default seccomp profile the NUMA memory-policy calls
# (mbind, get_/set_mempolicy) need SYS_NICE (containerd@301026e:contrib/seccomp/seccomp_default.go); NCCL checks
# for that and falls back to /dev/shm host buffers (NVIDIA/nccl@5067397:src/misc/cudawrap.cc), and nothing in the
# trainer sets a memory policy.
POD_SECURITY_CONTEXT = {"seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclass(frozen=True, kw_only=True)
class EksJobSpec:
    """One MoE training job on a HyperPod EKS cluster."""

    name: str
    """Job name, a Kubernetes name."""
    namespace: str
    """Namespace of the job and of the FSx claim."""
    image: str
    """The training image, e.g. the storage stack's TrainingImageUri output."""
    nodes: int
    """Pods, one per node (1 master, nodes-1 workers)."""
    instance_type: str
    """The ml. instance type the pods run on (node selector)."""
    fallback_instance_types: tuple[str, ...] = ()
    """A flexible group's other types: the pods then select any of them (node affinity) instead of one."""
    devices_per_node: int
    """Accelerators per pod: every one the node has."""
    device_resource: str
    """``nvidia.com/gpu`` or ``aws.amazon.com/neuron``."""
    efa_per_node: int
    """``vpc.amazonaws.com/efa`` per pod: every EFA device of the node, 0 for none."""
    train_profile: str
    """The trainer's YAML configuration itself, which the job's ConfigMap holds."""
    profile_config_map: str
    """Name of that ConfigMap, mounted at ``PROFILE_MOUNT``."""
    train_args: tuple[str, ...] = ()
    """Further trainer arguments, e.g. ``("--max-steps", "100")``."""
    claim_name: str = "fsx-lustre"
    """The FSx PersistentVolumeClaim, mounted at /fsx."""
    node_labels: dict[str, str] = field(default_factory=dict)
    """Labels of the group's nodes the pods must land on (besides the instance type)."""
    tolerations: tuple[dict, ...] = ()
    """Tolerations for the group's taints."""
    shm_size_gib: int = 64
    """Size of the memory-backed /dev/shm, in GiB."""
    metrics_port: int | None = None
    """The trainer's Prometheus port; the pod is annotated for the scraper when set."""
    backoff_limit: int = 10
    """Pod restarts after permanent failures before the job fails (``runPolicy.backoffLimit``)."""
    startup_timeout_s: int = 1800
    """Time allowed until the first metrics record (model build, checkpoint load, first steps), in seconds."""
    stall_timeout_s: int = 900
    """A pod whose trainer wrote no metrics record for this long is restarted (liveness), in seconds."""
    termination_grace_s: int = eks_rules.TERMINATION_GRACE_S
    """Time between SIGTERM and SIGKILL: the trainer saves a checkpoint in it, in seconds."""
    team: str | None = None
    """The team the job runs as: its pods carry the team's task-governance queue (``kueue.x-k8s.io/queue-name``),
    in the team's namespace."""
    host_network: bool | None = None
    """The node's network namespace (``hostNetwork``) instead of the pod's own; EFA works on either
    (``POD_NETWORK``). Default (None): the node's without a team, the pod's own for a team's job, whose namespace
    refuses host networking."""
    qos: str | None = None
    """The QoS tier: its priority class (``kueue.x-k8s.io/priority-class``). Needs ``team``."""
    nsys_rank: int | None = None
    """Run the pod that holds this rank under Nsight Systems (``nsys profile``) where the image has ``nsys``: the
    pod's process is the launcher of its node's ranks, so the report (in ``nsys_dir``) covers all of them. Without
    ``nsys`` the pod says so in one log line and runs as it would have. Default: none."""
    nsys_dir: str = "/fsx/nsys"
    """Where the Nsight Systems report goes: the run's checkpoint folder's ``nsys/``, on the shared file system."""
    preflight: bool = False
    """Check each pod's node first: an init container runs ``moe-preflight node`` (GPUs and EFA devices against
    the catalog) in the image, and the trainer starts only where it passed. The checks across nodes are the
    preflight job of ``moe-cdk verify render``, run before."""

    @property
    def uses_host_network(self) -> bool:
        """Whether the pods run in the node's network namespace: ``host_network``, or its default."""
        return self.team is None if self.host_network is None else self.host_network

    def problems(self) -> list[Problem]:
        found: list[Problem] = []

        def add(name: str, what: str, got: object, allowed: str) -> None:
            found.append(problem(what, got=got, allowed=allowed).at(name))

        ranks = self.nodes * self.devices_per_node
        if self.nsys_rank is not None and not 0 <= self.nsys_rank < ranks:
            add("nsys_rank", "no such rank in this job", self.nsys_rank, f"0 to {ranks - 1}, or null for none")
        if self.team and self.host_network:
            add(
                "host_network",
                f"team {self.team}'s namespace enforces Pod Security baseline, which refuses host networking",
                True,
                "the pod network (EFA does not need the host's)",
            )

        if self.qos and not self.team:
            # Task governance reads the priority class of a job in a team's queue only (rules/teams.py,
            # [TG-LABELS]); a job without a team has no queue, so a tier would be dropped.
            add(
                "qos",
                "on EKS a tier is a task-governance priority class, which applies to a team's jobs only",
                self.qos,
                "--team with --qos, or no --qos",
            )

        if self.preflight and self.fallback_instance_types:
            add(
                "preflight",
                "the node check compares a node with one instance type's figures, and this group's nodes may be "
                "any of several",
                [self.instance_type, *self.fallback_instance_types],
                "no --preflight on a group with fallback_instance_types",
            )

        for key in ("name", "namespace", "claim_name", "profile_config_map"):
            if not KUBERNETES_NAME.match(getattr(self, key)):
                add(
                    key,
                    "not a Kubernetes name",
                    getattr(self, key),
                    "lowercase letters, digits and inner hyphens, at most 63",
                )
        if not self.image or any(c.isspace() for c in self.image):
            add(
                "image",
                "not an image reference",
                self.image,
                "e.g. <account>.dkr.ecr.<region>.amazonaws.com/<repo>:<tag>",
            )
        for key, minimum in (
            ("nodes", 1),
            ("devices_per_node", 1),
            ("shm_size_gib", 1),
            ("backoff_limit", 0),
            ("startup_timeout_s", 60),
            ("stall_timeout_s", 60),
            ("termination_grace_s", 30),
        ):
            if getattr(self, key) < minimum:
                add(key, "too small", getattr(self, key), f"{minimum} or more")
        if self.efa_per_node < 0:
            add("efa_per_node", "negative", self.efa_per_node, "0 or more")
        if len(self.train_profile.encode()) > CONFIG_MAP_MAX_BYTES:
            add("train_profile", "too large for a ConfigMap", len(self.train_profile.encode()), "at most 1 MiB")
        return found


_PROBE_PERIOD_S = 30


def _probes(spec: EksJobSpec) -> dict:
    """moe-train's probes: the first metrics record, then a record at least every ``stall_timeout_s``."""
    return {
        "startupProbe": {
            "exec": {"command": ["test", "-f", LIVENESS_FILE]},
            "periodSeconds": _PROBE_PERIOD_S,
            "failureThreshold": -(-spec.startup_timeout_s // _PROBE_PERIOD_S),
        },
        "readinessProbe": {"exec": {"command": ["test", "-f", READINESS_FILE]}, "periodSeconds": _PROBE_PERIOD_S},
        "livenessProbe": {
            "exec": {
                "command": [
                    "sh",
                    "-c",
                    f"test $(( $(date +%s) - $(stat -c %Y {LIVENESS_FILE}) )) -lt {spec.stall_timeout_s}",
                ]
            },
            "periodSeconds": _PROBE_PERIOD_S,
            "failureThreshold": 2,
        },
    }


def pod_template(
    spec: EksJobSpec,
    command: list[str],
    args: list[str],
    extra_ports: list[dict] = (),
    *,
    probes: bool = True,
    host_network: bool | None = None,
    env: dict[str, str] | None = None,
    restricted: bool = False,
) -> dict:
    """One pod of ``spec``'s job running ``command`` with ``args``. ``probes``: moe-train's startup, readiness
    and liveness files; ``host_network``: the node's network namespace (default: ``spec.uses_host_network``);
    ``env``: container variables; ``restricted``: the security contexts of ``POD_SECURITY_CONTEXT`` (the training
    jobs; not the nccl-tests workers, whose sshd needs root's capabilities)."""
    if host_network is None:
        host_network = spec.uses_host_network

    def security() -> dict:
        return {"securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT)} if restricted else {}

    resources = {spec.device_resource: spec.devices_per_node}
    if spec.efa_per_node:
        resources[eks_rules.EFA_RESOURCE] = spec.efa_per_node
    annotations = {}
    ports = list(extra_ports)
    if spec.metrics_port is not None:
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.metrics_port)}
        ports.append({"name": "metrics", "containerPort": spec.metrics_port})
    container = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": args,
        **({"env": [{"name": k, "value": v} for k, v in env.items()]} if env else {}),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        **security(),
        "volumeMounts": [
            {"name": "fsx", "mountPath": FSX_MOUNT},
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "profile", "mountPath": PROFILE_MOUNT, "readOnly": True},
        ],
        **(_probes(spec) if probes else {}),
    }
    if ports:
        container["ports"] = ports
    pod_spec = {
        **({"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"} if host_network else {}),
        **({"securityContext": copy.deepcopy(POD_SECURITY_CONTEXT)} if restricted else {}),
        "nodeSelector": {
            **({} if spec.fallback_instance_types else {eks_rules.INSTANCE_TYPE_LABEL: spec.instance_type}),
            **spec.node_labels,
        },
        "terminationGracePeriodSeconds": spec.termination_grace_s,
        "containers": [container],
        "volumes": [
            {"name": "fsx", "persistentVolumeClaim": {"claimName": spec.claim_name}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_size_gib}Gi"}},
            {"name": "profile", "configMap": {"name": spec.profile_config_map}},
        ],
    }
    if spec.fallback_instance_types:
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": eks_rules.INSTANCE_TYPE_LABEL,
                                    "operator": "In",
                                    "values": [spec.instance_type, *spec.fallback_instance_types],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    if spec.preflight:
        # An init container gets the node's devices too: a pod's requests are the larger of its init
        # containers' and its containers' (Kubernetes docs, "Init Containers", resource sharing).
        pod_spec["initContainers"] = [
            {
                "name": "preflight",
                "image": spec.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["moe-preflight", "node", "--instance-type", spec.instance_type],
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                **security(),
            }
        ]
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    metadata = {"labels": labels(spec)}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


def labels(spec: EksJobSpec) -> dict[str, str]:
    """The job's and its pods' labels: its name, and with a team its task-governance queue and priority class
    (rules/teams.py), which task governance reads from both."""
    return {
        "app.kubernetes.io/name": "moe-training",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/managed-by": "moe-cdk",
        **({QUEUE_LABEL: queue_name(spec.team)} if spec.team else {}),
        **({PRIORITY_LABEL: priority_class(spec.qos)} if spec.team and spec.qos else {}),
    }


def suffixed_name(job_name: str, suffix: str) -> str:
    """``<job>-<suffix>``, cut to a Kubernetes name (63 characters, no trailing hyphen): the names of the
    objects that go with a job, its profile's ConfigMap and its preflight jobs."""
    return f"{job_name}-{suffix}"[:63].rstrip("-")


def render_profile_config_map(spec: EksJobSpec) -> dict:
    """The ConfigMap that holds the job's training profile (``v1``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": spec.profile_config_map, "namespace": spec.namespace, "labels": labels(spec)},
        "data": {PROFILE_FILE: spec.train_profile},
    }


def _trainer_args(spec: EksJobSpec) -> list[str]:
    # The probe files are set here, so the probes and the trainer cannot disagree.
    return [
        "--config",
        PROFILE_PATH,
        "--set",
        f"metrics.readiness_file={READINESS_FILE}",
        "--set",
        f"metrics.liveness_file={LIVENESS_FILE}",
        *spec.train_args,
    ]


class _Dumper(yaml.SafeDumper):
    """Writes repeated pod templates out in full: kubectl and reviewers read no YAML anchors; a script
    of several lines as a literal block, line by line."""

    def ignore_aliases(self, data) -> bool:
        return True


def _literal_scripts(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _literal_scripts)


def to_yaml(*documents: dict) -> str:
    """The documents as one YAML stream for ``kubectl apply -f``."""
    return "---\n".join(yaml.dump(document, Dumper=_Dumper, sort_keys=False) for document in documents)


def render_pytorchjob(spec: EksJobSpec) -> dict:
    """A Kubeflow ``PyTorchJob`` (kubeflow.org/v1) that runs moe-train."""
    command = _nsys_command(spec, ["moe-train"])
    return pytorchjob(spec, pod_template(spec, command, _trainer_args(spec), restricted=True))


def _nsys_command(spec: EksJobSpec, command: list[str]) -> list[str]:
    """``command``, run through the Nsight Systems wrapper when ``nsys_rank`` is set: the pod of that rank's node
    (the operator's ``PET_NODE_RANK``) runs under ``nsys profile``, as AWS's Nsight on EKS sample profiles whole
    pods (aws-samples/awsome-distributed-training, 4.validation_and_observability/5.nsight/EKS)."""
    if spec.nsys_rank is None:
        return command
    node = spec.nsys_rank // spec.devices_per_node
    report = shlex.quote(f"{spec.nsys_dir}/node-{node}-") + '"${HOSTNAME:-pod}"'
    script = nsys_wrapper(f'[[ "${{PET_NODE_RANK:-0}}" == {node} ]]', spec.nsys_rank, report)
    return ["bash", "-c", script, "nsys-wrapper", *command]


def pytorchjob(
    spec: EksJobSpec, template: dict, *, restart_policy: str = "ExitCode", nproc_per_node: int | None = None
) -> dict:
    """A ``PyTorchJob`` of ``spec.nodes`` pods on ``template``, each a launcher of ``nproc_per_node`` ranks
    (``nprocPerNode``; default: one per device)."""
    replica_specs = {"Master": {"replicas": 1, "restartPolicy": restart_policy, "template": template}}
    if spec.nodes > 1:
        replica_specs["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": restart_policy, "template": template}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels(spec)},
        "spec": {
            "nprocPerNode": str(nproc_per_node or spec.devices_per_node),
            "runPolicy": {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replica_specs,
        },
    }


def render_hyperpod_job(spec: EksJobSpec) -> dict:
    """A ``HyperPodPyTorchJob`` (sagemaker.amazonaws.com/v1) with log-based hang detection.

    The HyperPod training operator starts ranks through ``hyperpodrun`` (the HyperPod elastic
    agent, installed in the image) and restarts the job when the trainer's progress line
    stops appearing (SageMaker Developer Guide, "Use the training operator to run jobs").
    """
    # Flags as in the guide's sample entry point: the agent's server for the operator, and the
    # ranks' output teed to /tmp/hyperpod, where the log monitoring reads it.
    command = [
        "hyperpodrun",
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.devices_per_node}",
        "--server-host=0.0.0.0",
        "--server-port=8080",
        "--tee=3",
        "--log_dir=/tmp/hyperpod",
        "-m",
        "moe_cdk.cli.train",
    ]
    template = pod_template(
        spec, command, _trainer_args(spec), extra_ports=[{"name": "agent", "containerPort": 8080}], restricted=True
    )
    return {
        "apiVersion": "sagemaker.amazonaws.com/v1",
        "kind": "HyperPodPyTorchJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels(spec)},
        "spec": {
            "nprocPerNode": str(spec.devices_per_node),
            "replicaSpecs": [{"name": "pods", "replicas": spec.nodes, "template": template}],
            "runPolicy": {
                "jobMaxRetryCount": spec.backoff_limit,
                "cleanPodPolicy": "None",
                "logMonitoringConfiguration": [
                    {
                        "name": "JobStart",
                        "logPattern": PROGRESS_LOG_PATTERN,
                        "expectedStartCutOffInSeconds": spec.startup_timeout_s,
                    },
                    {
                        "name": "JobHangingDetection",
                        "logPattern": PROGRESS_LOG_PATTERN,
                        "expectedStartCutOffInSeconds": spec.startup_timeout_s,
                        "expectedRecurringFrequencyInSeconds": spec.stall_timeout_s,
                    },
                ],
            },
        },
    }


def helm_values(spec: EksJobSpec, *, hyperpod: bool = False) -> dict:
    """The values for ``charts/moe-training`` that render the same job."""
    return {
        "name": spec.name,
        "kind": "HyperPodPyTorchJob" if hyperpod else "PyTorchJob",
        "image": spec.image,
        "nodes": spec.nodes,
        "instanceType": spec.instance_type,
        "devicesPerNode": spec.devices_per_node,
        "deviceResource": spec.device_resource,
        "efaPerNode": spec.efa_per_node,
        "trainProfile": spec.train_profile,
        "trainArgs": list(spec.train_args),
        "claimName": spec.claim_name,
        "nodeLabels": dict(spec.node_labels),
        "tolerations": [dict(t) for t in spec.tolerations],
        "shmSizeGiB": spec.shm_size_gib,
        "metricsPort": spec.metrics_port,
        "backoffLimit": spec.backoff_limit,
        "startupTimeoutSeconds": spec.startup_timeout_s,
        "stallTimeoutSeconds": spec.stall_timeout_s,
        "terminationGraceSeconds": spec.termination_grace_s,
        "hostNetwork": spec.uses_host_network,
    }


def job_spec_from_config(
    config: Config,
    *,
    profile: JobProfile | None = None,
    image: str,
    group: str | None = None,
    name: str | None = None,
    nodes: int | None = None,
    train_args: tuple[str, ...] = (),
    backoff_limit: int = 10,
    stall_timeout_s: int = 900,
    startup_timeout_s: int = 1800,
    preflight: bool = False,
    team: str | None = None,
    qos: str | None = None,
    termination_grace_s: int = eks_rules.TERMINATION_GRACE_S,
    host_network: bool | None = None,
    nsys_rank: int | None = None,
) -> EksJobSpec:
    """The job for a compute group of ``config`` (a ``stacks.config.Config``): node count,
    devices, EFA, node selector and tolerations come from the configuration and the instance
    catalog, the metrics port from ``profile`` (default: the configuration's ``training.profile``),
    which the job carries in its ConfigMap;
    nothing is typed twice. Raises ``ConfigError`` naming the option when the group does not
    exist or has no accelerators."""
    profile = profile or load_job_profile(config, None, train_args)
    chosen = config.cluster.compute_group(group)
    nodes = nodes_of(chosen, nodes)
    spec = catalog.lookup(chosen.instance_type)
    if refusal := moe_train_refusal(spec):
        raise refusal
    if not spec.is_accelerated:
        raise ConfigError(
            [
                problem(
                    f"group {chosen.name} has no accelerators to train on",
                    got=spec.sagemaker_name,
                    allowed="a GPU or Trainium compute group",
                ).at("--group")
            ]
        )
    name = name or profile.name
    fallbacks = chosen.specs[1:]
    team, qos = job_team(config.teams, team, qos)
    return EksJobSpec(
        name=name,
        namespace=team_namespace(team) if team else config.eks.namespace,
        image=image,
        nodes=nodes,
        instance_type=spec.sagemaker_name,
        fallback_instance_types=tuple(f.sagemaker_name for f in fallbacks),
        # Every type of a flexible group has as many accelerators (rules/hyperpod_capacity.py); the EFA
        # devices asked for are the fewest any of them has, so a node of any type can take the pod.
        devices_per_node=spec.accelerator_count,
        device_resource=eks_rules.device_resource(spec),
        efa_per_node=min(s.efa_interfaces for s in [spec, *fallbacks]),
        train_profile=profile.text,
        profile_config_map=suffixed_name(name, "profile"),
        train_args=tuple(train_args),
        node_labels=dict(chosen.labels),
        tolerations=tuple(t.toleration() for t in chosen.taints),
        metrics_port=profile.config.metrics.prometheus_port,
        backoff_limit=backoff_limit,
        startup_timeout_s=startup_timeout_s,
        stall_timeout_s=stall_timeout_s,
        preflight=preflight,
        team=team,
        qos=qos,
        termination_grace_s=termination_grace_s,
        host_network=host_network,
        nsys_rank=nsys_rank,
        nsys_dir=f"{profile.config.checkpoint.dir}/nsys",
    )
