"""moe-cdk diff on a ParallelCluster cluster: whether ParallelCluster applies a change of its configuration to the
running cluster, in ParallelCluster 3.16.1's own words (its ConfigPatch, run in .venv-pcluster)."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import ROOT, synth

from moe_cdk.schema.config import load_config
from moe_cdk.tools import synth_diff

STACK = "moe-pc-cluster"

if not (ROOT / synth_diff.PARALLELCLUSTER_PYTHON).exists():  # pragma: no cover - make test builds it
    pytest.skip("ParallelCluster's own code is set up by make test (make parallelcluster)", allow_module_level=True)


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, dict]:
    return synth(load_config(ROOT / "config/parallelcluster.yaml"), tmp_path_factory.mktemp("cdk.out"))


def notes_after(templates: dict[str, dict], change, repo=ROOT) -> list[str]:
    """The diff's notes on the cluster resource after ``change(ClusterConfiguration)`` of a copy."""
    new = copy.deepcopy(templates)
    (resource,) = [r for r in new[STACK]["Resources"].values() if r["Type"] == synth_diff.PARALLELCLUSTER]
    change(resource["Properties"]["ClusterConfiguration"])
    diff = synth_diff.diff_templates(templates, new)
    synth_diff.parallelcluster_notes(diff, templates, new, repo)
    (stack,) = diff.stacks
    (cluster,) = [r for r in stack.resources if r.type == synth_diff.PARALLELCLUSTER]
    return cluster.notes


def test_a_larger_capacity_block_applies_to_the_running_cluster(templates):
    def grow(config):
        resource = config["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]
        resource["MinCount"] = resource["MaxCount"] = 4

    assert notes_after(templates, grow) == ["ParallelCluster applies this change to the running cluster"]


def test_another_head_node_type_needs_a_new_cluster_in_parallelclusters_words(templates):
    notes = notes_after(templates, lambda config: config["HeadNode"].update(InstanceType="m5.4xlarge"))
    assert notes[0].startswith("ParallelCluster refuses this change to the running cluster")
    assert notes[1].startswith(
        "HeadNode.InstanceType: FAILED (Update actions are not currently supported for the 'InstanceType' parameter)"
    )


def test_without_parallelclusters_code_the_note_says_how_to_set_it_up(templates, tmp_path):
    notes = notes_after(templates, lambda config: config["HeadNode"].update(InstanceType="m5.4xlarge"), repo=tmp_path)
    assert notes == ["ParallelCluster's update check did not run: `make parallelcluster` sets up its code"]


def test_a_new_lifecycle_bundle_applies_to_the_running_cluster(templates):
    # A changed script or parameter changes the bundle's key, which the head and login nodes' OnNodeUpdated and the
    # queue's OnNodeConfigured name; ParallelCluster refuses changes to the head and login nodes' OnNodeConfigured.
    def new_bundle(config):
        key = config["HeadNode"]["CustomActions"]["OnNodeUpdated"]["Args"][0]["Fn::Sub"].rsplit("/", 1)[-1]
        text = json.dumps(config).replace(key, "0" * 64 + ".zip")
        assert text != json.dumps(config)
        config.clear()
        config.update(json.loads(text))

    assert notes_after(templates, new_bundle) == ["ParallelCluster applies this change to the running cluster"]
