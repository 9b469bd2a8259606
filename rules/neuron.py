"""Trainium2 and the Neuron training stack moe-cdk renders jobs for: which stack, which image, which settings, and
the layouts it cannot run. Plain data and checks, no CDK: the configuration, the job renderers and ``plan`` read it.

Sources (read 2026-12-04, [DLC] and [EOS] 2026-12-05; the files themselves are not copied here):

- [NXDT] aws-neuron/neuronx-distributed-training at 9169aa0 (Neuron SDK 2.26.0): ``examples/train.sh`` and
  ``examples/train_setup.sh`` (the launch), ``examples/training_orchestrator.py`` (``process_config``: which
  configuration keys become which environment variables), ``examples/conf/megatron_mixtral_8x7b_config.yaml``
  and its ``_dropless`` twin (the MoE keys), ``examples/conf/hf_llama3_70B_trn2_config.yaml`` (the trn2 settings).
- [NXD] aws-neuron/neuronx-distributed at fecfe75 (its 2.26.0 release): ``parallel_layers/parallel_state.py``
  (expert-parallel groups are drawn from the data-parallel ranks; the trn2 replica-group ordering used at
  TP 32 with LNC 2 "does not support expert parallelism"), ``modules/moe/expert_mlps_v2.py`` (the dropless,
  blockwise path handles expert parallelism only outside training).
- [DLC] aws/deep-learning-containers ``docs/src/data/pytorch-training-neuronx/2.9-neuronx-sdk2.28.0.yml`` @ 851256d
  (the 2.28.0 training image's tag) and aws-neuron/deep-learning-containers at its tag 2.28.0 (6776548):
  ``pytorch/training/2.9.0/Dockerfile.neuronx`` installs ``neuronx_distributed_training`` 1.7.0 on Python 3.12 and
  torch 2.9.0, ``common/nxdt_requirements.txt`` keeps ``omegaconf>=2.2,<2.3``. The 2.27.0 to 2.30.0 images all pin
  1.7.0; 2.30.0 is the last training image (aws-neuron-sdk ``announce-no-longer-publish-pytorch-training-dlc.rst``).
- [EOS] aws-neuron/aws-neuron-sdk @ 81ce03a, ``about-neuron/announcements/neuron2.x/``: 2025-12-16
  ``announcement-end-of-support-nxdt-nxd-core.rst`` (PyTorch 2.9 is the last with NxD Training),
  2026-02-26 ``announce-eos-nxdt-nxd-core-training.rst`` (2.28 is the last release to include it; "Existing
  NxDT/NxD Core users should stay on Neuron SDK 2.28 (PyTorch 2.9)"), 2026-05-20
  ``announce-maintenance-nxdt-nxd-core-training.rst`` (maintenance mode from 2.30); ``release-notes/components/
  containers.rst`` 2026-04-09 (2.29.0: the training image "pinned to include neuronx_distributed_training-1.7.0");
  ``archive/nxd-training/index.rst`` (date-modified 2026-07-24, published with 2.32.0 on 2026-08-17): "reached
  end-of-support as of Neuron 2.32". ``announce-eos-pytorch-2-7-2-8-v229.rst``: PyTorch 2.8 unsupported from 2.29.
- [TITAN] TorchTitan Neuron's documentation: its expert-parallel backend "does not run on Trn2".
- [NEURON-K8S] aws-neuron-sdk ``deploy/includes/k8s-neuron-device-plugin.rst`` and ``deploy/infrastructure/
  scheduler.rst``: the device plugin registers ``aws.amazon.com/neuron`` (whole chips); the scheduler extension
  is needed only for pods that take part of a node ("requesting one or all Neuron cores or devices is always
  valid").
- [NCCOM] aws-neuron-sdk ``tools/neuron-sys-tools/nccom-test.rst`` and ``neuron-ls.rst``.
"""

from __future__ import annotations

import enum

from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError, problem

NXDT_REPOSITORY = "https://github.com/aws-neuron/neuronx-distributed-training.git"
NXDT_COMMIT = "9169aa03f39efd4eb02da63891a7ed98defb1714"
"""The launch scripts, entry point and example configurations the Neuron image and these rules follow: Neuron
SDK 2.26.0 (NxD Training 1.6.0), the last release the repository publishes. NxD Training 1.7.0's source and
examples are not published, so its ``examples/`` folder comes from here."""
NEURON_SDK = "2.28.0"
"""The Neuron SDK of the image: 2.28 is the last release to include NxD Training, and AWS tells its users to stay
on it ([EOS] 2026-02-26 and 2026-05-20). 2.28.1 (2026-03-13) fixed host packages only and has no training image."""
NEURON_TORCH = "2.9.0"
"""The image's PyTorch: 2.9, the last Neuron PyTorch with NxD Training ([EOS] 2025-12-16); 2.8, which the SDK
2.26 image had, is unsupported from Neuron 2.29."""
NXDT_VERSION = "1.7.0"
"""The ``neuronx_distributed_training`` the SDK 2.28 image installs ([DLC] Dockerfile.neuronx at 2.28.0)."""
NEURON_BASE_IMAGE = (
    "763104351884.dkr.ecr.us-west-2.amazonaws.com/"
    f"pytorch-training-neuronx:{NEURON_TORCH}-neuronx-py312-sdk{NEURON_SDK}-ubuntu24.04"
)
"""AWS's PyTorch Neuron training container of SDK 2.28.0 ([DLC] 2.9-neuronx-sdk2.28.0.yml). Not 2.29 or 2.30,
which carry the same NxD Training 1.7.0: AWS names 2.28 for NxD Training users, and 2.30's runtime needs a host
Neuron driver newer than 2.26 (aws-neuron-sdk ``release-notes/components/containers.rst``, 2.30.0 known issues)."""
NXDT_DIR = "/opt/nxdt"
"""Where the Neuron image holds NxD Training's ``examples`` folder (``training_orchestrator.py``)."""

LOGICAL_NC_CONFIG = 2
"""Physical NeuronCores per logical NeuronCore: trn2's default, which NxD Training's trn2 configurations use
(``trainer.lnc: 2``); one rank per logical core (catalog ``ranks_per_accelerator``)."""
MASTER_PORT = 41000
"""The rendezvous port ``train_setup.sh`` uses, and reserves from the ephemeral range on each node."""

# Exported by train_setup.sh for every launch (its Slurm and its Kubernetes/MPI branches alike).
LAUNCH_ENV: dict[str, str] = {
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_PROVIDER": "efa",
    "FI_EFA_FORK_SAFE": "1",
    "XLA_DISABLE_FUNCTIONALIZATION": "0",
    "HYDRA_FULL_ERROR": "1",
    "MALLOC_ARENA_MAX": "128",
    "CREATE_TB_LOGGER": "True",
    "CHECKPOINT_CALLBACK": "True",
}
# train_setup.sh's Kubernetes branch: the collectives' socket on the pod's own interface.
KUBERNETES_ENV: dict[str, str] = {"CCOM_SOCKET_IFNAME": "eth0"}

# The runtime and compiler settings of NxD Training's trn2 configurations ([NXDT] hf_llama3_70B_trn2_config.yaml);
# training_orchestrator.py turns each into an environment variable.
TRN2_RUNTIME_KEYS: dict[str, object] = {
    "compiler_flags": "--model-type transformer",
    "aync_exec_max_inflight_requests": 5,  # sic: NxD Training's spelling
    "bucket_size_collectives": 1024,
    "neuron_rt_exec_timeout": 100,
    "neuron_experimental_compress_rg": False,
}

# neuronx-distributed's trn2 replica-group ordering ("LOGIC2") is used at these tensor-parallel sizes with LNC 2,
# and it builds no expert-parallel groups that match ([NXD] parallel_state.py).
TRN2_TENSOR_SIZES_WITHOUT_EXPERT_PARALLEL = (32, 64)


class TrainingStack(enum.Enum):
    """The software that trains the profile on the cluster's accelerators."""

    AUTO = "auto"
    """megatron-core on NVIDIA GPUs, NxD Training on Trainium."""
    MEGATRON = "megatron"
    """moe-train: megatron-core on CUDA (NVIDIA GPUs only)."""
    NXDT = "neuronx-distributed-training"
    """AWS's NeuronX Distributed Training (Trainium), its megatron model path."""
    TORCHTITAN_NEURON = "torchtitan-neuron"
    """TorchTitan on Neuron: named so that a choice of it is refused with its reason, not rendered."""


NEURON_PATH = "training.stack: neuronx-distributed-training (docs/trainium.md)"
"""How the documentation and the errors name the Trainium path."""


def resolve(stack: TrainingStack, kind: catalog.AcceleratorKind) -> TrainingStack:
    """The stack ``auto`` stands for on accelerators of ``kind``."""
    if stack is not TrainingStack.AUTO:
        return stack
    return TrainingStack.NXDT if kind is catalog.AcceleratorKind.TRAINIUM else TrainingStack.MEGATRON


def stack_problem(stack: TrainingStack, kind: catalog.AcceleratorKind) -> str | None:
    """Why ``stack`` cannot train on accelerators of ``kind``, or None when it can. Each reason names the path
    that does."""
    stack = resolve(stack, kind)
    if kind is catalog.AcceleratorKind.TRAINIUM:
        if stack is TrainingStack.MEGATRON:
            return f"moe-train runs megatron-core on CUDA, which Trainium does not have: use {NEURON_PATH}"
        if stack is TrainingStack.TORCHTITAN_NEURON:
            return (
                "TorchTitan Neuron's expert-parallel backend does not run on Trn2 [TITAN], so it cannot spread an "
                f"MoE's experts (parallel.expert), and moe-cdk renders no TorchTitan Neuron job: use {NEURON_PATH}"
            )
    elif stack in (TrainingStack.NXDT, TrainingStack.TORCHTITAN_NEURON):
        return f"{stack.value} runs on Trainium only: use training.stack megatron (or auto) on GPUs"
    return None


def moe_train_refusal(spec: catalog.InstanceSpec) -> ConfigError | None:
    """The error for a moe-train job on ``spec``'s accelerators, named at ``--group``; None where moe-train runs."""
    if reason := stack_problem(TrainingStack.MEGATRON, spec.accelerator_kind):
        return ConfigError([problem(reason, got=spec.sagemaker_name, allowed="a GPU compute group").at("--group")])
    return None


__all__ = [
    "KUBERNETES_ENV",
    "LAUNCH_ENV",
    "LOGICAL_NC_CONFIG",
    "MASTER_PORT",
    "NEURON_BASE_IMAGE",
    "NEURON_PATH",
    "NEURON_SDK",
    "NEURON_TORCH",
    "NXDT_COMMIT",
    "NXDT_DIR",
    "NXDT_REPOSITORY",
    "NXDT_VERSION",
    "TRN2_RUNTIME_KEYS",
    "TRN2_TENSOR_SIZES_WITHOUT_EXPERT_PARALLEL",
    "TrainingStack",
    "moe_train_refusal",
    "resolve",
    "stack_problem",
]
