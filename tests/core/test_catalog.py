"""The instance catalog: both names, the published figures, and unknown types."""

from __future__ import annotations

import pytest

from moe_cdk.core import catalog
from moe_cdk.core.catalog import AcceleratorKind


@pytest.mark.parametrize("name", ["p5en.48xlarge", "p5.48xlarge", "p4de.24xlarge", "trn2.48xlarge"])
def test_ec2_and_sagemaker_names_give_the_same_spec(name):
    assert catalog.lookup(name) is catalog.lookup(f"ml.{name}") is not None


@pytest.mark.parametrize(
    ("name", "figures"),
    [
        ("ml.p5en.48xlarge", (AcceleratorKind.NVIDIA_GPU, 8, 141, 16, 192)),
        ("ml.p5.48xlarge", (AcceleratorKind.NVIDIA_GPU, 8, 80, 32, 192)),
        ("ml.p4de.24xlarge", (AcceleratorKind.NVIDIA_GPU, 8, 80, 4, 96)),
    ],
)
def test_accelerator_figures(name, figures):
    spec = catalog.lookup(name)
    assert (
        spec.accelerator_kind,
        spec.accelerator_count,
        spec.accelerator_memory_gb,
        spec.efa_interfaces,
        spec.vcpus,
    ) == figures


def test_trainium2_chip_memory_is_96_gib_as_neuron_ls_reports_it():
    # neuron-ls -j: memory_size 103079215104 bytes per trn2 chip (AWS states it in GiB, not GB).
    spec = catalog.lookup("ml.trn2.48xlarge")
    assert (spec.accelerator_kind, spec.accelerator_count, spec.efa_interfaces, spec.vcpus) == (
        AcceleratorKind.TRAINIUM,
        16,
        16,
        192,
    )
    assert spec.accelerator_memory_gib * 2**30 == 103079215104


def test_trainium2_node_runs_one_rank_per_logical_neuroncore():
    assert catalog.lookup("ml.trn2.48xlarge").ranks_per_node == 64
    assert catalog.lookup("ml.p5en.48xlarge").ranks_per_node == 8


def test_accelerator_memory_in_gib_converts_the_published_gigabytes():
    assert round(catalog.lookup("ml.p5en.48xlarge").accelerator_memory_gib, 1) == 131.3


def test_head_node_types_have_no_efa_or_accelerator():
    spec = catalog.lookup("ml.m5.2xlarge")
    assert (spec.supports_efa, spec.is_accelerated) == (False, False)


def test_unknown_type_is_none_and_its_message_lists_the_known_ones():
    assert catalog.lookup("ml.p9.96xlarge") is None
    message = str(catalog.unknown_instance_type("ml.p9.96xlarge"))
    assert message.startswith("unknown instance type (got 'ml.p9.96xlarge'; allowed ml.p5en.48xlarge,")


# What torch.cuda.get_device_name() says on each catalog GPU type.
CUDA_NAMES = {"H200": "NVIDIA H200", "H100": "NVIDIA H100 80GB HBM3", "A100": "NVIDIA A100-SXM4-80GB"}
ACCELERATED = sorted(
    {
        spec.ec2_name: spec for name in catalog.known_instance_types() if (spec := catalog.lookup(name)).is_accelerated
    }.values(),
    key=lambda spec: spec.ec2_name,
)


@pytest.mark.parametrize("spec", ACCELERATED, ids=lambda spec: spec.ec2_name)
def test_device_name_and_model_lookups_give_the_same_peak(spec):
    # moe-cdk plan looks the peak up by model, the trainer's MFU by CUDA device name: one figure for both.
    # Trainium has no CUDA name; its model name stands in.
    device_name = (
        CUDA_NAMES[spec.accelerator_model]
        if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU
        else spec.accelerator_model
    )
    peak = catalog.peak_bf16_tflops(spec.accelerator_model)
    assert peak is not None and catalog.peak_bf16_tflops_for_device(device_name) == peak


def test_unknown_accelerators_have_no_peak():
    assert catalog.peak_bf16_tflops("T4") is None and catalog.peak_bf16_tflops_for_device("Tesla T4") is None


GPU_TYPES = [spec for spec in ACCELERATED if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU]


@pytest.mark.parametrize("spec", GPU_TYPES, ids=lambda spec: spec.ec2_name)
def test_every_gpu_type_has_one_fabric_floor_under_both_names(spec):
    assert catalog.fabric_floor(spec.ec2_name) is catalog.fabric_floor(spec.sagemaker_name) is not None


@pytest.mark.parametrize("name", ["trn2.48xlarge", "ml.trn2.48xlarge", "ml.m5.2xlarge", "ml.p9.96xlarge"])
def test_trainium_cpu_and_unknown_types_have_no_fabric_floor(name):
    assert catalog.fabric_floor(name) is None


@pytest.mark.parametrize(
    ("name", "published_gb_s", "floor_gb_s"),
    [
        # awsome-distributed-training nccl-tests READMEs: busbw at the largest message (core/catalog.py).
        ("p5en.48xlarge", "369.86", 277.39),
        ("p5.48xlarge", "487.09", 365.32),
        ("p4de.24xlarge", "78.33", 58.75),
    ],
)
def test_all_reduce_floor_is_three_quarters_of_the_figure_its_source_names(name, published_gb_s, floor_gb_s):
    floor = catalog.fabric_floor(name)
    assert floor.all_reduce_busbw_gb_s == floor_gb_s
    assert f"75% of {published_gb_s} GB/s" in floor.source


@pytest.mark.parametrize(
    ("name", "floor_gb_s"), [("p5en.48xlarge", 25.0), ("p5.48xlarge", 25.0), ("p4de.24xlarge", 3.125)]
)
def test_alltoall_floor_is_half_the_efa_line_rate_per_gpu(name, floor_gb_s):
    # network_gbps / 8 bits / GPUs: 3200 Gbps over 8 GPUs is 50 GB/s each, 400 Gbps over 8 is 6.25.
    assert catalog.fabric_floor(name).alltoall_busbw_gb_s == floor_gb_s


def test_alltoall_floor_source_says_no_figure_was_published_and_gives_the_formula():
    source = catalog.fabric_floor("p5.48xlarge").source
    assert (
        "alltoall: no published figure, 50% of the EFA line rate per GPU (3200 Gbps / 8 / 8 GPUs = 50 GB/s)" in source
    )
