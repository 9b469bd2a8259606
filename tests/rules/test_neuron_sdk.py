"""The Neuron image is the training image of the SDK AWS tells NxD Training users to stay on
(tests/fixtures/neuron/neuron_sdk.yaml records AWS's notices and the images' contents)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from moe_cdk.rules import neuron

ROOT = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((ROOT / "tests/fixtures/neuron/neuron_sdk.yaml").read_text())
TAG = re.compile(r"/pytorch-training-neuronx:(?P<torch>[\d.]+)-neuronx-py(?P<py>\d+)-sdk(?P<sdk>[\d.]+)-ubuntu[\d.]+$")


def image_tag() -> re.Match:
    found = TAG.search(neuron.NEURON_BASE_IMAGE)
    assert found, neuron.NEURON_BASE_IMAGE
    return found


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_image_is_of_the_sdk_and_pytorch_aws_tells_nxd_training_users_to_stay_on():
    tag = image_tag()
    assert (minor(tag["sdk"]), minor(tag["torch"])) == (FACTS["stay_on"]["sdk"], FACTS["stay_on"]["torch"])


def test_the_image_tag_is_the_one_aws_publishes_for_that_sdk():
    tag = image_tag()
    published = FACTS["training_images"][tag["sdk"]]
    assert neuron.NEURON_BASE_IMAGE.endswith(f"/pytorch-training-neuronx:{published['tag']}")
    assert tag["py"] == published["python"].replace(".", "")


def test_the_nxd_training_version_named_is_the_one_the_image_installs():
    assert neuron.NXDT_VERSION == FACTS["training_images"][image_tag()["sdk"]]["nxdt"]


def test_the_trainium_guide_names_the_image_and_versions_in_use():
    guide = (ROOT / "docs/trainium.md").read_text()
    tag = neuron.NEURON_BASE_IMAGE.rsplit("/", 1)[1]
    assert tag in guide
    assert f"NxD Training {neuron.NXDT_VERSION}" in guide and f"Neuron SDK {neuron.NEURON_SDK}" in guide
