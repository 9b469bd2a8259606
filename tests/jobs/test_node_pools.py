"""The Karpenter objects of autoscaled groups (moe-cdk eks node-pools): NodePools checked against Karpenter's
schema (compiled from its CRD, installed by `make test`), HyperpodNodeClasses against what AWS's guide
documents, and the rendered training pods against the pool they must make Karpenter grow."""

from __future__ import annotations

import copy
import json
import subprocess

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT
from test_eks_job import IMAGE, pods

from moe_cdk.jobs.eks_job import job_spec_from_config, render_hyperpod_job, render_pytorchjob
from moe_cdk.jobs.node_pools import node_class_problems, node_pool_objects, unplaceable_reasons
from moe_cdk.schema.config import load_config, parse_config

CONFIG = ROOT / "config/eks-autoscaling.yaml"
KARPENTER_MODELS = ROOT / ".venv/k8s-models"


def karpenter_schema_errors(*objects: dict) -> list[list[str]]:
    """Each NodePool's messages from Karpenter's schema ([] when valid)."""
    assert (KARPENTER_MODELS / "node_modules/@kubernetes-models/karpenter").is_dir(), "run make test: it installs them"
    done = subprocess.run(
        ["node", str(ROOT / "tests/jobs/karpenter_validate.mjs")],
        input=json.dumps(objects),
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "KARPENTER_MODELS": str(KARPENTER_MODELS)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def config():
    return load_config(CONFIG)


@pytest.fixture(scope="module")
def objects(config):
    node_class, node_pool = node_pool_objects(config)
    return node_class, node_pool


def test_the_node_pool_passes_karpenters_schema(objects):
    assert karpenter_schema_errors(objects[1]) == [[]]


def test_karpenters_schema_refuses_a_bad_node_pool(objects):
    broken = copy.deepcopy(objects[1])
    broken["spec"]["disruption"]["consolidateAfter"] = "10 minutes"
    del broken["spec"]["template"]["spec"]["nodeClassRef"]
    (errors,) = karpenter_schema_errors(broken)
    assert any("consolidateAfter" in e for e in errors) and any("nodeClassRef" in e for e in errors), errors


def test_the_node_class_names_its_group_as_aws_documents(objects):
    node_class, _ = objects
    assert node_class["apiVersion"] == "karpenter.sagemaker.amazonaws.com/v1"
    assert node_class["spec"] == {"instanceGroups": ["gpu"]} and node_class_problems(node_class) == []


def test_a_node_class_of_eleven_groups_is_refused():
    problems = node_class_problems({"spec": {"instanceGroups": [f"g{i}" for i in range(11)]}})
    assert [p.key for p in problems] == ["spec.instanceGroups"]


def test_the_pool_is_limited_to_the_groups_instance_count_and_empties_to_zero(objects):
    spec = objects[1]["spec"]
    # 4 nodes of 8 GPUs; 192 vCPUs on both ml.p5en.48xlarge and ml.p5.48xlarge.
    assert spec["limits"] == {"cpu": "768", "nvidia.com/gpu": "32"}
    assert spec["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "600s"}
    assert spec["template"]["spec"]["expireAfter"] == "Never"


@pytest.mark.parametrize("render", [render_pytorchjob, render_hyperpod_job])
def test_the_rendered_job_pods_are_ones_karpenter_can_place(config, objects, render):
    spec = job_spec_from_config(config, image=IMAGE)
    for pod in pods(render(spec)):
        assert unplaceable_reasons(pod["spec"], objects[1]) == []


def test_a_pod_selecting_a_label_the_pool_lacks_stays_pending(config, objects):
    spec = job_spec_from_config(config, image=IMAGE)
    pod = pods(render_pytorchjob(spec))[0]["spec"]
    pod["nodeSelector"]["moe-cdk/pool"] = "inference"
    (reason,) = unplaceable_reasons(pod, objects[1])
    assert "moe-cdk/pool=inference" in reason


def test_a_pod_asking_for_more_devices_than_any_type_stays_pending(config, objects):
    spec = job_spec_from_config(config, image=IMAGE)
    pod = pods(render_pytorchjob(spec))[0]["spec"]
    pod["containers"][0]["resources"]["requests"]["vpc.amazonaws.com/efa"] = 64
    (reason,) = unplaceable_reasons(pod, objects[1])
    assert reason == "no instance type of the pool has 64 vpc.amazonaws.com/efa"


def test_an_untolerated_pool_taint_keeps_the_pod_pending(config):
    data = yaml.safe_load(CONFIG.read_text())
    data["cluster"]["instance_groups"][1]["taints"] = [{"key": "moe-cdk/training"}]
    tainted = parse_config(data)
    (_, pool) = node_pool_objects(tainted)
    spec = job_spec_from_config(tainted, image=IMAGE)
    pod = pods(render_pytorchjob(spec))[0]["spec"]
    assert unplaceable_reasons(pod, pool) == []
    del pod["tolerations"]
    assert unplaceable_reasons(pod, pool) == ["the pool's taint moe-cdk/training:NoSchedule is not tolerated"]


def test_a_flexible_groups_pods_select_any_of_its_types_and_the_fewest_efa(config):
    spec = job_spec_from_config(config, image=IMAGE)
    pod = pods(render_pytorchjob(spec))[0]
    kubernetes_validate.validate(pod, "1.32.0", strict=True)
    assert "node.kubernetes.io/instance-type" not in pod["spec"]["nodeSelector"]
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"] == ["ml.p5en.48xlarge", "ml.p5.48xlarge"]
    assert spec.efa_per_node == 16  # ml.p5en.48xlarge has 16 EFA devices, ml.p5.48xlarge 32


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / ".venv/bin/moe-cdk"), *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_the_command_writes_the_objects():
    done = _cli("eks", "node-pools", "--config", str(CONFIG))
    assert done.returncode == 0, done.stderr
    assert [d["kind"] for d in yaml.safe_load_all(done.stdout)] == ["HyperpodNodeClass", "NodePool"]


def test_the_command_names_the_key_when_no_group_autoscales():
    done = _cli("eks", "node-pools", "--config", "config/eks-p5en.yaml")
    assert done.returncode != 0 and "cluster.instance_groups: no group is autoscaled" in done.stderr


def test_a_flexible_group_refuses_the_preflight_and_helm_values():
    for option in ("--preflight", "--helm-values"):
        done = _cli("eks", "render", "--config", str(CONFIG), "--image", IMAGE, option)
        assert done.returncode != 0 and "may be any of several" in done.stderr, (option, done.stderr)


@pytest.fixture(scope="module")
def with_fallback():
    """The shipped autoscaling configuration whose Spot group falls back to an autoscaled On-Demand group."""
    data = yaml.safe_load(CONFIG.read_text())
    spot = data["cluster"]["instance_groups"][1]
    od = copy.deepcopy(spot) | {"name": "gpu-od", "capacity": "on-demand", "instance_type": "ml.p5.48xlarge"}
    del od["fallback_instance_types"]
    spot["fallback_groups"] = ["gpu-od"]
    data["cluster"]["instance_groups"].append(od)
    return parse_config(data)


def test_a_spot_group_and_its_fallback_share_one_node_class_and_pool(with_fallback):
    objects = node_pool_objects(with_fallback)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [("HyperpodNodeClass", "gpu"), ("NodePool", "gpu")]
    node_class, pool = objects
    assert node_class["spec"] == {"instanceGroups": ["gpu", "gpu-od"]} and node_class_problems(node_class) == []
    assert pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == "gpu"


def test_the_shared_pool_passes_karpenters_schema_and_keeps_the_spot_groups_limit(with_fallback):
    _, pool = node_pool_objects(with_fallback)
    assert karpenter_schema_errors(pool) == [[]]
    assert pool["spec"]["limits"] == {"cpu": "768", "nvidia.com/gpu": "32"}  # 4 nodes, Spot and On-Demand together
