"""The instance catalog: both names, the published figures, and unknown types."""

from __future__ import annotations

import pytest

from moe_cdk.constructs import instance_catalog
from moe_cdk.constructs.instance_catalog import AcceleratorKind


@pytest.mark.parametrize("name", ["p5en.48xlarge", "p5.48xlarge", "p4de.24xlarge", "trn2.48xlarge"])
def test_ec2_and_sagemaker_names_give_the_same_spec(name):
    assert instance_catalog.lookup(name) is instance_catalog.lookup(f"ml.{name}") is not None


@pytest.mark.parametrize(("name", "figures"), [
    ("ml.p5en.48xlarge", (AcceleratorKind.NVIDIA_GPU, 8, 141, 16, 192)),
    ("ml.p5.48xlarge", (AcceleratorKind.NVIDIA_GPU, 8, 80, 32, 192)),
    ("ml.p4de.24xlarge", (AcceleratorKind.NVIDIA_GPU, 8, 80, 4, 96)),
    ("ml.trn2.48xlarge", (AcceleratorKind.TRAINIUM, 16, 96, 16, 192)),
])
def test_accelerator_figures(name, figures):
    spec = instance_catalog.lookup(name)
    assert (spec.accelerator_kind, spec.accelerator_count, spec.accelerator_memory_gb,
            spec.efa_interfaces, spec.vcpus) == figures


def test_accelerator_memory_in_gib_converts_the_published_gigabytes():
    assert round(instance_catalog.lookup("ml.p5en.48xlarge").accelerator_memory_gib, 1) == 131.3


def test_head_node_types_have_no_efa_or_accelerator():
    spec = instance_catalog.lookup("ml.m5.2xlarge")
    assert (spec.supports_efa, spec.is_accelerated) == (False, False)


def test_unknown_type_is_none_and_its_message_lists_the_known_ones():
    assert instance_catalog.lookup("ml.p9.96xlarge") is None
    message = instance_catalog.unknown_instance_type_message("ml.p9.96xlarge")
    assert message.startswith("unknown instance type (got 'ml.p9.96xlarge'; allowed ml.p5en.48xlarge,")
