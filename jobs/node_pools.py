"""``moe-cdk eks node-pools``: the Karpenter objects of an EKS configuration's autoscaled groups, and
the check that a rendered training pod can make Karpenter add a node to its group.

For each group with ``autoscale: true`` that is no other group's fallback:
- a ``HyperpodNodeClass`` (karpenter.sagemaker.amazonaws.com/v1) naming the group, then its
  ``fallback_groups``. AWS publishes no schema for it; the developer guide ("Autoscaling on SageMaker
  HyperPod EKS", node class page) gives ``spec.instanceGroups``, a list of at most 10 instance group
  names, which ``node_class_problems`` checks. With a Spot group and its On-Demand fallbacks in one
  class, Karpenter adds Spot nodes first and On-Demand nodes when the Spot group cannot grow ("Spot
  instances in SageMaker HyperPod": "Create HyperpodNodeClass", "Managing Node Interruption"); the
  order of the list is not what decides, the groups' capacity types are
  (``rules.hyperpod_capacity.fallback_group_problems``);
- a ``NodePool`` (karpenter.sh/v1) on that class: the group's instance types, labels and taints, so
  a pending pod that selects them is one Karpenter can place (a fallback group has the same labels and
  taints, and some of the same types); ``limits`` of the group's ``instance_count`` nodes (their CPUs
  and accelerators), the class's groups together; and ``WhenEmpty`` consolidation after
  ``empty_node_timeout_s``, so nodes go back to zero once no pod runs on them, and a running training
  pod is never moved to pack nodes tighter (``WhenEmptyOrUnderutilized`` would). Nodes never expire
  (``expireAfter: Never``, as AWS's example): a node replaced mid-run costs a restart from the last
  checkpoint. The tests validate it against Karpenter's NodePool schema.

HyperPod installs the node class's CRD once the cluster's autoscaling is in service, so the objects
are applied after the deployment (docs/capacity.md), not by it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from moe_cdk.core import catalog
from moe_cdk.core.problems import Problem, problem
from moe_cdk.rules import eks as eks_rules
from moe_cdk.rules.hyperpod_capacity import MAX_NODE_CLASS_GROUPS
from moe_cdk.schema.config import Config, InstanceGroupConfig

NODE_CLASS_GROUP = "karpenter.sagemaker.amazonaws.com"
NODE_CLASS_KIND = "HyperpodNodeClass"
NODE_POOL_API = "karpenter.sh/v1"


def node_class(group: InstanceGroupConfig) -> dict:
    """The node class of ``group`` and its fallback groups, the group first."""
    return {
        "apiVersion": f"{NODE_CLASS_GROUP}/v1",
        "kind": NODE_CLASS_KIND,
        "metadata": {"name": group.name},
        "spec": {"instanceGroups": [group.name, *group.fallback_groups]},
    }


def node_pool(group: InstanceGroupConfig) -> dict:
    specs = group.specs
    # At most instance_count nodes of the largest type; the accelerator limit is exact, since every
    # type of a training group has as many.
    limits = {"cpu": str(group.instance_count * max(s.vcpus for s in specs))}
    if device := eks_rules.device_resource(specs[0]):
        limits[device] = str(group.instance_count * specs[0].accelerator_count)
    template_spec = {
        "nodeClassRef": {"group": NODE_CLASS_GROUP, "kind": NODE_CLASS_KIND, "name": group.name},
        "expireAfter": "Never",
        "requirements": [
            {"key": eks_rules.INSTANCE_TYPE_LABEL, "operator": "In", "values": [s.sagemaker_name for s in specs]}
        ],
    }
    if group.taints:
        template_spec["taints"] = [
            {"key": t.key, "effect": t.effect.value, **({"value": t.value} if t.value is not None else {})}
            for t in group.taints
        ]
    template = {"spec": template_spec}
    if group.labels:
        template = {"metadata": {"labels": dict(group.labels)}, **template}
    return {
        "apiVersion": NODE_POOL_API,
        "kind": "NodePool",
        "metadata": {"name": group.name},
        "spec": {
            "template": template,
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": f"{group.empty_node_timeout_s}s"},
            "limits": limits,
        },
    }


def node_pool_objects(config: Config) -> list[dict]:
    """A HyperpodNodeClass and a NodePool for each autoscaled group, in that order; a fallback group is in
    the class of the group it backs, and has none of its own."""
    fallbacks = config.cluster.fallback_group_names
    return [
        obj
        for g in config.cluster.instance_groups
        if g.autoscale and g.name not in fallbacks
        for obj in (node_class(g), node_pool(g))
    ]


def node_class_problems(obj: Mapping) -> list[Problem]:
    """What AWS's guide says a HyperpodNodeClass holds, checked: ``spec.instanceGroups``, 1 to 10 names."""
    groups = obj.get("spec", {}).get("instanceGroups")
    if not isinstance(groups, list) or not 1 <= len(groups) <= MAX_NODE_CLASS_GROUPS:
        return [
            problem("not a list of 1 to 10 instance group names", got=groups, allowed="the groups Karpenter scales").at(
                "spec.instanceGroups"
            )
        ]
    return [
        problem("not an instance group name", got=name, allowed="a string").at(f"spec.instanceGroups[{i}]")
        for i, name in enumerate(groups)
        if not isinstance(name, str) or not name
    ]


def _matches(requirement: Mapping, values: set[str]) -> bool:
    """Whether a node the pool makes can carry one of ``values`` under ``requirement``
    (Karpenter's requirement operators, "NodePools" page)."""
    operator, allowed = requirement["operator"], set(requirement.get("values", ()))
    return {
        "In": bool(values & allowed),
        "NotIn": bool(values - allowed),
        "Exists": True,
        "DoesNotExist": False,
    }.get(operator, False)


def unplaceable_reasons(pod_spec: Mapping, pool: Mapping) -> list[str]:
    """Why Karpenter would leave a pod with ``pod_spec`` pending rather than add a node from ``pool``;
    empty when it can place it. Follows Karpenter's scheduling rules ("Scheduling" page): every
    nodeSelector key and required node-affinity expression must be met by the pool's template labels
    or its requirements (a key the pool does not know keeps the pod pending), every taint tolerated,
    and the extended resources (accelerators, EFA devices) its containers request within one node of
    the pool's types."""
    template = pool["spec"]["template"]
    labels = template.get("metadata", {}).get("labels", {})
    requirements = {r["key"]: r for r in template["spec"]["requirements"]}
    reasons = []

    def satisfiable(key: str, values: set[str]) -> bool:
        if key in labels:
            return labels[key] in values
        return key in requirements and _matches(requirements[key], values)

    for key, value in pod_spec.get("nodeSelector", {}).items():
        if not satisfiable(key, {value}):
            reasons.append(f"nodeSelector {key}={value} is neither a label nor a requirement of the pool")
    terms = (
        pod_spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    if terms and not any(
        all(e["operator"] == "In" and satisfiable(e["key"], set(e["values"])) for e in term["matchExpressions"])
        for term in terms
    ):
        reasons.append("no required node-affinity term is met by the pool")
    tolerations = pod_spec.get("tolerations", [])
    for taint in template["spec"].get("taints", []):
        if not any(
            t.get("key") == taint["key"]
            and t.get("effect") in (None, taint["effect"])
            and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
            for t in tolerations
        ):
            reasons.append(f"the pool's taint {taint['key']}:{taint['effect']} is not tolerated")
    types = requirements.get(eks_rules.INSTANCE_TYPE_LABEL, {}).get("values", [])
    capacity = _capacities([catalog.lookup(t) for t in types])
    extended = {eks_rules.EFA_RESOURCE, eks_rules.GPU_RESOURCE, eks_rules.NEURON_RESOURCE}
    requests: dict[str, int] = {}
    # A pod asks for the larger of its init containers' and its containers' requests ("Init Containers").
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        for resource, amount in container.get("resources", {}).get("requests", {}).items():
            if resource in extended:
                requests[resource] = max(requests.get(resource, 0), int(amount))
    for resource, amount in requests.items():
        if not any(node.get(resource, 0) >= amount for node in capacity):
            reasons.append(f"no instance type of the pool has {amount} {resource}")
    return reasons


def _capacities(specs: Sequence[catalog.InstanceSpec | None]) -> list[dict[str, int]]:
    """The extended resources one node of each type advertises (device plugins, EFA plugin)."""
    nodes = []
    for spec in specs:
        if spec is None:
            continue
        node = {eks_rules.EFA_RESOURCE: spec.efa_interfaces}
        if device := eks_rules.device_resource(spec):
            node[device] = spec.accelerator_count
        nodes.append(node)
    return nodes
