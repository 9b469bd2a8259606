"""The EKS stack's device plugins as a configuration asks for them: on the fallback types as on the first choice,
and, on a cluster with teams, Trainium chips registered under the name task governance's queues count."""

from __future__ import annotations

import json

import yaml
from conftest import ROOT, resources_of_type, with_staged_chart

from moe_cdk.schema.config import parse_config
from moe_cdk.stacks.deployment import build_app


def _charts(data: dict, tmp_path) -> dict[str, dict]:
    config = with_staged_chart(parse_config(data))
    assembly = build_app(config, outdir=str(tmp_path / "cdk.out"), cloudformation_validation=False).synth()
    template = assembly.get_stack_by_name(f"{config.name}-eks").template
    return {
        r["Properties"]["Release"]: json.loads(r["Properties"]["Values"])
        for r in resources_of_type(template, "Custom::AWSCDK-EKS-HelmChart").values()
        if "Values" in r["Properties"]
    }


def _config(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


def _affinity_types(values: dict) -> list[str]:
    (term,) = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return term["matchExpressions"][0]["values"]


def test_a_fallback_types_nodes_get_the_gpu_plugin(tmp_path):
    charts = _charts(_config("eks-autoscaling.yaml"), tmp_path)
    assert "ml.p5.48xlarge" in _affinity_types(charts["nvidia-device-plugin"])


def test_a_teams_cluster_registers_trainium_chips_as_neurondevice(tmp_path):
    data = _config("eks-trn2.yaml")
    data["teams"] = _config("eks-teams.yaml")["teams"]
    plugin = _charts(data, tmp_path)["neuron-device-plugin"]["devicePlugin"]
    assert plugin["image"] == {"tag": "2.19.16.0"}
