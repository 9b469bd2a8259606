"""The accelerator and head-node instance types moe-cdk knows, with the figures every construct validates against.

Each entry is looked up by its EC2 name (``p5en.48xlarge``) or its SageMaker name
(``ml.p5en.48xlarge``). This module is plain data: it imports nothing from CDK, so the
configuration loader, the planner and the trainer can all use it.

Sources (checked 2026-11-30):

- [EC2-ACC] Amazon EC2 "Accelerated computing instance specifications" and
  DescribeInstanceTypes ``NetworkInfo.EfaInfo.MaximumEfaInterfaces``.
- [EC2-EFA] Amazon EC2 User Guide, "Maximize network bandwidth on accelerated
  instances" (efa-acc-inst-types): P5 has 32 EFA devices and one ENA device.
- [NEURON] AWS Neuron documentation, "Amazon EC2 Trn2 Architecture": trn2.48xlarge has
  16 Trainium2 chips, 192 vCPUs, 2,048 GiB host memory and 1,536 GiB device memory.
- [NEURON-LNC] AWS Neuron documentation, "Logical NeuronCore configuration" (aws-neuron/aws-neuron-sdk,
  about-neuron/arch/neuron-features/logical-neuroncore-config.rst at ee7d6e0): a Trainium2 chip has 8 physical
  NeuronCores, grouped by the default LNC=2 into 4 logical NeuronCores, so a trn2.48xlarge presents 64;
  ``neuron-ls -j`` reports each chip's ``memory_size`` as 103079215104 bytes (96 GiB).
- [SM-API] SageMaker API reference, ``ClusterInstanceGroupDetails.InstanceType`` valid
  values (ml.p4de.24xlarge, ml.p5.48xlarge, ml.p5en.48xlarge, ml.trn2.48xlarge, ml.m5.*).
- [EC2-GP] Amazon EC2 "General purpose instance specifications" (m5 family).

It also holds each accelerator's dense BF16 peak (``PEAK_BF16_TFLOPS``), the one table that
``moe-cdk plan`` (by the catalog's ``accelerator_model``) and the trainer's MFU (by the CUDA
device name) both read, so the two cannot disagree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from moe_cdk.core.problems import Problem, problem


class AcceleratorKind(enum.Enum):
    """What does the heavy arithmetic on an instance."""

    NVIDIA_GPU = "nvidia-gpu"
    TRAINIUM = "trainium"
    NONE = "none"


@dataclass(frozen=True, kw_only=True)
class InstanceSpec:
    """Figures for one instance type, as AWS publishes them: accelerator memory in GB
    (10**9 bytes, the datasheets' unit), host memory in GiB."""

    ec2_name: str
    """The EC2 name, e.g. ``p5en.48xlarge``."""
    accelerator_kind: AcceleratorKind
    """GPU, Trainium or none."""
    accelerator_model: str
    """Marketing name of the accelerator, e.g. ``H200``; empty for CPU-only types."""
    accelerator_count: int
    """Accelerators (GPUs or Trainium chips) per instance."""
    accelerator_memory_gb: float
    """Memory per accelerator, in GB (10**9 bytes): an H200's 141 GB is 131.3 GiB."""
    efa_interfaces: int
    """Maximum EFA interfaces per instance; 0 when the type has no EFA."""
    vcpus: int
    """vCPUs per instance."""
    memory_gib: int
    """Host memory per instance, in GiB."""
    network_gbps: int
    """Aggregate network bandwidth, in Gbit/s."""
    ranks_per_accelerator: int = 1
    """Training processes per accelerator: 1 per GPU; per Trainium2 chip, its logical NeuronCores at the default
    logical-NeuronCore setting (4 at LNC=2)."""

    @property
    def ranks_per_node(self) -> int:
        """Training processes per instance: one per GPU or logical NeuronCore (64 on a trn2.48xlarge)."""
        return self.accelerator_count * self.ranks_per_accelerator

    @property
    def sagemaker_name(self) -> str:
        """The SageMaker (HyperPod, Training Jobs) name, e.g. ``ml.p5en.48xlarge``."""
        return f"ml.{self.ec2_name}"

    @property
    def accelerator_memory_gib(self) -> float:
        """Memory per accelerator in GiB (2**30 bytes), the unit the allocator and ``moe-cdk plan`` count in."""
        return self.accelerator_memory_gb * 1e9 / 2**30

    @property
    def supports_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def is_accelerated(self) -> bool:
        return self.accelerator_kind is not AcceleratorKind.NONE


def _gpu(name: str, model: str, count: int, mem: int, efa: int, vcpus: int, host: int, gbps: int) -> InstanceSpec:
    return InstanceSpec(
        ec2_name=name,
        accelerator_kind=AcceleratorKind.NVIDIA_GPU,
        accelerator_model=model,
        accelerator_count=count,
        accelerator_memory_gb=mem,
        efa_interfaces=efa,
        vcpus=vcpus,
        memory_gib=host,
        network_gbps=gbps,
    )


def _cpu(name: str, vcpus: int, host: int, gbps: int) -> InstanceSpec:
    return InstanceSpec(
        ec2_name=name,
        accelerator_kind=AcceleratorKind.NONE,
        accelerator_model="",
        accelerator_count=0,
        accelerator_memory_gb=0,
        efa_interfaces=0,
        vcpus=vcpus,
        memory_gib=host,
        network_gbps=gbps,
    )


_SPECS: tuple[InstanceSpec, ...] = (
    # [EC2-ACC]: 8x H200 with 141 GB HBM3e each (NVIDIA H200 datasheet: 141 GB, which is
    # 131.3 GiB), 192 vCPUs, 2,048 GiB, 3,200 Gbps EFAv3 over 16 network cards, one EFA
    # interface each.
    _gpu("p5en.48xlarge", "H200", 8, 141, 16, 192, 2048, 3200),
    # [EC2-ACC], [EC2-EFA]: 8x H100 80 GB, 192 vCPUs, 2,048 GiB, 3,200 Gbps over 32 EFA devices.
    _gpu("p5.48xlarge", "H100", 8, 80, 32, 192, 2048, 3200),
    # [EC2-ACC]: 8x A100 80 GB, 96 vCPUs, 1,152 GiB, 400 Gbps over 4 EFA interfaces.
    _gpu("p4de.24xlarge", "A100", 8, 80, 4, 96, 1152, 400),
    # [NEURON]: 16 Trainium2 chips, 1,536 GiB device memory (96 GiB each, which is 103.1 GB: AWS states
    # this one in GiB), 192 vCPUs, 2,048 GiB host memory; [EC2-ACC]: 3.2 Tbps EFAv3 over 16 EFA
    # interfaces; [NEURON-LNC]: 4 logical NeuronCores per chip at the default LNC=2.
    InstanceSpec(
        ec2_name="trn2.48xlarge",
        accelerator_kind=AcceleratorKind.TRAINIUM,
        accelerator_model="Trainium2",
        accelerator_count=16,
        accelerator_memory_gb=96 * 2**30 / 1e9,
        efa_interfaces=16,
        vcpus=192,
        memory_gib=2048,
        network_gbps=3200,
        ranks_per_accelerator=4,
    ),
    # [EC2-GP]: head and login nodes. Bandwidth is the "up to" figure for the smaller sizes.
    _cpu("m5.xlarge", 4, 16, 10),
    _cpu("m5.2xlarge", 8, 32, 10),
    _cpu("m5.4xlarge", 16, 64, 10),
    _cpu("m5.8xlarge", 32, 128, 10),
    _cpu("m5.12xlarge", 48, 192, 12),
    _cpu("m5.16xlarge", 64, 256, 20),
    _cpu("m5.24xlarge", 96, 384, 25),
)

_BY_NAME: dict[str, InstanceSpec] = {
    **{spec.ec2_name: spec for spec in _SPECS},
    **{spec.sagemaker_name: spec for spec in _SPECS},
}


def lookup(instance_type: str) -> InstanceSpec | None:
    """The spec for an EC2 or ``ml.`` name, or None when the catalog does not know it."""
    return _BY_NAME.get(instance_type)


def known_instance_types() -> list[str]:
    """Every name the catalog accepts, sorted: EC2 names and ``ml.`` names."""
    return sorted(_BY_NAME)


def unknown_instance_type(instance_type: str) -> Problem:
    """The one wording used wherever an instance type is not in the catalog."""
    return problem(
        "unknown instance type",
        got=instance_type,
        allowed=f"{', '.join(spec.sagemaker_name for spec in _SPECS)} or their EC2 names",
    )


# Dense (no sparsity) BF16 tensor-core peak per accelerator, TFLOP/s, keyed by ``accelerator_model``:
# - H100 SXM and H200 SXM: 989 (NVIDIA H100 Tensor Core GPU datasheet and NVIDIA H200
#   datasheet list 1,979 TFLOPS BF16 "with sparsity"; dense is half).
# - H100 NVL and H200 NVL: 835; H100 PCIe: 756 (the same datasheets' NVL and PCIe columns, dense
#   half of the sparsity figure). These parts have lower clocks and power than the SXM part of
#   the same name; no catalog instance has them, but a trainer may run on one.
# - A100 SXM: 312 (NVIDIA A100 Tensor Core GPU datasheet, BF16 312 TFLOPS dense, 624 with sparsity).
# - Trainium2: 667 (AWS Trainium2 / Amazon EC2 Trn2 product page: 667 TFLOPS dense BF16 per chip).
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H200 NVL": 835.0,
    "H100": 989.0,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "A100": 312.0,
    "Trainium2": 667.0,
}

# Longest model first, so that "NVIDIA H100 PCIe" finds "H100 PCIe" before "H100" (the SXM part's 989).
_MODELS_BY_SPECIFICITY: tuple[str, ...] = tuple(sorted(PEAK_BF16_TFLOPS, key=len, reverse=True))


def peak_bf16_tflops(accelerator_model: str) -> float | None:
    """Dense BF16 peak of one accelerator, by ``InstanceSpec.accelerator_model``; None when not known."""
    return PEAK_BF16_TFLOPS.get(accelerator_model)


def peak_bf16_tflops_for_device(device_name: str) -> float | None:
    """Dense BF16 peak for a CUDA device name (``torch.cuda.get_device_name()``), or None when
    no known model is in the name.

    CUDA names carry the model amid other words ("NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB"), so the name is searched for each model, the most specific first.
    """
    for model in _MODELS_BY_SPECIFICITY:
        if model in device_name:
            return PEAK_BF16_TFLOPS[model]
    return None


# Fabric floors: the least multi-node nccl-tests bus bandwidth (busbw, GB/s as nccl-tests prints it)
# the preflight accepts at the largest message of an all_reduce_perf or alltoall_perf run, per GPU type.
#
# [ADT-NCCL] aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md, "Results"
#   (commit 7217859f67bc693c52ff175ccc6082c41dbd7a1b): all_reduce_perf on 2x p5.48xlarge, 8 B to 16 GiB,
#   busbw 487.09 GB/s out-of-place at 17179869184 B; on 2x p4de.24xlarge, 8 B to 2 GiB, 78.33 GB/s at
#   2147483648 B. Both outputs are fixtures (tests/fixtures/fabric/, SOURCES.md).
# [ADT-TOPO] the same repository, micro-benchmarks/nccl-tests/slurm/topology-aware-nccl-tests/README.md,
#   "Performance Output Format": all_reduce_perf on p5en.48xlarge, 8 B to 16 GiB, busbw 369.86 GB/s
#   out-of-place at 17179869184 B (the node count is not stated; the README's example NODE_COUNTS are
#   8, 16 and 32).
# [ADT-HC] the same repository, 4.validation_and_observability/2.gpu-cluster-healthcheck/checks/
#   5-nccl-allreduce.sh, get_min_bus_bw: 800 GB/s for p5, p5e and p5en and 300 for p4d, "conservative
#   defaults" that only warn. They are above every busbw AWS publishes for these types (above), so
#   they are not used here.
# [NCCL-A2A] NVIDIA/nccl-tests issue #130 (sjeaugey): alltoall busbw across N nodes is N/(N-1) times
#   the network bandwidth per GPU, tending to 1x as N grows; issue #267: alltoall sees one NIC's
#   bandwidth per GPU (aws-ofi-nccl presents each GPU's EFA devices as one multi-rail NIC).
#
# all_reduce: 75% of the published busbw at the largest message. The published p5 and p4de runs are
# 2-node results on AWS's reference stack; the 25% margin allows for more nodes and run-to-run spread,
# while a fabric on the Socket network, or with EFA devices missing, lands far below it.
# alltoall: AWS publishes no alltoall figure for these types, so the floor is derived from the EFA line
# rate, 50% of the network bandwidth per GPU (network_gbps / 8 bits / GPUs, [EC2-ACC]), the N->infinity
# bound of [NCCL-A2A], the half for SRD and multi-rail overheads that no published run measures.
_ALL_REDUCE_FLOOR_FRACTION = 0.75
_ALLTOALL_FLOOR_FRACTION = 0.5


@dataclass(frozen=True, kw_only=True)
class FabricFloor:
    """The least nccl-tests bus bandwidth an instance type's fabric may show across nodes, at the largest
    message of a run that goes as high as the published one (2 GiB on p4de, 16 GiB on p5 and p5en)."""

    all_reduce_busbw_gb_s: float
    """all_reduce_perf busbw floor at the largest message, GB/s (10**9 bytes/s, as nccl-tests prints it)."""
    alltoall_busbw_gb_s: float
    """alltoall_perf busbw floor at the largest message, GB/s."""
    source: str
    """Where the figures come from, and how the floor was derived from them."""


def _alltoall_floor_gb_s(ec2_name: str) -> float:
    spec = _BY_NAME[ec2_name]
    per_gpu_gb_s = spec.network_gbps / 8 / spec.accelerator_count
    return _ALLTOALL_FLOOR_FRACTION * per_gpu_gb_s


def _floor(ec2_name: str, published_all_reduce_gb_s: float, all_reduce_source: str) -> FabricFloor:
    spec = _BY_NAME[ec2_name]
    return FabricFloor(
        all_reduce_busbw_gb_s=round(_ALL_REDUCE_FLOOR_FRACTION * published_all_reduce_gb_s, 2),
        alltoall_busbw_gb_s=_alltoall_floor_gb_s(ec2_name),
        source=(
            f"all_reduce: {_ALL_REDUCE_FLOOR_FRACTION:.0%} of {published_all_reduce_gb_s} GB/s, {all_reduce_source}; "
            f"alltoall: no published figure, {_ALLTOALL_FLOOR_FRACTION:.0%} of the EFA line rate per GPU "
            f"({spec.network_gbps} Gbps / 8 / {spec.accelerator_count} GPUs = "
            f"{spec.network_gbps / 8 / spec.accelerator_count:g} GB/s)"
        ),
    )


_FABRIC_FLOORS: dict[str, FabricFloor] = {
    # [ADT-TOPO]: 369.86 GB/s at 16 GiB on p5en.48xlarge.
    "p5en.48xlarge": _floor(
        "p5en.48xlarge",
        369.86,
        "the p5en.48xlarge all_reduce_perf busbw at 16 GiB in aws-samples/awsome-distributed-training "
        "micro-benchmarks/nccl-tests/slurm/topology-aware-nccl-tests/README.md",
    ),
    # [ADT-NCCL]: 487.09 GB/s at 16 GiB on 2x p5.48xlarge.
    "p5.48xlarge": _floor(
        "p5.48xlarge",
        487.09,
        "the 2x p5.48xlarge all_reduce_perf busbw at 16 GiB in aws-samples/awsome-distributed-training "
        "micro-benchmarks/nccl-tests/README.md",
    ),
    # [ADT-NCCL]: 78.33 GB/s at 2 GiB on 2x p4de.24xlarge.
    "p4de.24xlarge": _floor(
        "p4de.24xlarge",
        78.33,
        "the 2x p4de.24xlarge all_reduce_perf busbw at 2 GiB in aws-samples/awsome-distributed-training "
        "micro-benchmarks/nccl-tests/README.md",
    ),
}


def fabric_floor(instance_type: str) -> FabricFloor | None:
    """The fabric floor for an EC2 or ``ml.`` name; None for types without one (Trainium, CPU-only)
    and for names the catalog does not know."""
    spec = lookup(instance_type)
    return None if spec is None else _FABRIC_FLOORS.get(spec.ec2_name)
