"""The parallel layout: one place that decides how the world is split and sets megatron up for it.

``plan_layout`` turns a configuration and a world size into a ``Layout`` (or a
``ConfigError`` naming every key that does not fit), without torch, so ``moe-cdk plan`` uses
the same arithmetic as the trainer. ``initialize`` creates megatron's process groups for a
layout, and ``wrap`` puts each model chunk under megatron's ``DistributedDataParallel``.

The sizes follow megatron-core 0.16.1's ``parallel_state.initialize_model_parallel``:
the dense layers are data-parallel over world / (tensor x pipeline) ranks, the experts over
world / (expert x expert_tensor x pipeline) ranks, so both products must divide the world.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_cdk.core import catalog
from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.training.config import TrainConfig

# The largest tensor-parallel size on GPUs: one node's 8 GPUs, the NVLink domain of every supported
# instance. The vocabulary padding (model.py) is shard-aligned for every divisor of it.
MAX_TENSOR_PARALLEL = 8


@dataclass(frozen=True, kw_only=True)
class TensorLimit:
    """The tensor-parallel sizes an accelerator's nodes can run: divisors of one node's ranks (its fast
    interconnect), less the sizes its software cannot group there."""

    ranks: int
    """Ranks one tensor-parallel group may span: one node's."""
    domain: str
    """Names those ranks in an error."""
    refused: tuple[tuple[int, str], ...] = ()
    """(size, why) for divisors of ``ranks`` that are refused all the same."""

    def allowed(self) -> list[int]:
        refused = {size for size, _ in self.refused}
        return [n for n in range(1, self.ranks + 1) if self.ranks % n == 0 and n not in refused]


GPU_TENSOR_LIMIT = TensorLimit(ranks=MAX_TENSOR_PARALLEL, domain="one node's 8 GPUs, its NVLink domain")

# neuronx-distributed builds a trn2 node's tensor-parallel groups from its 64 ranks at LNC 2 and lists the
# layouts that work and those that do not (aws-neuron/neuronx-distributed@fecfe75, the 2.26.0 release,
# src/neuronx_distributed/parallel_layers/parallel_state.py, get_logic_chosen's docstring, lines 348-362; the
# same text at 2.29, fbac349, lines 356-370): TP x DP per node of 4x16, 16x4, 32x2 (its "Logic 2") and 64x1
# work; "VNC2: 1. 8x8 ... doesnt work" (line 360 at fecfe75, 368 at fbac349).
_TRN2_LNC2_TENSOR_8 = (
    "neuronx-distributed lists tensor 8 on a trn2 node at LNC 2 (8x8) as not supported "
    "(parallel_layers/parallel_state.py@fecfe75, line 360)"
)


def tensor_limit(spec: catalog.InstanceSpec) -> TensorLimit:
    """The tensor-parallel sizes nodes of ``spec`` can run."""
    if spec.accelerator_kind is not catalog.AcceleratorKind.TRAINIUM:
        return GPU_TENSOR_LIMIT
    lnc2 = spec.ranks_per_node == 64  # trn2.48xlarge at LNC 2: 16 chips x 4 logical NeuronCores
    return TensorLimit(
        ranks=spec.ranks_per_node,
        domain=f"one {spec.sagemaker_name}'s {spec.ranks_per_node} logical NeuronCores, its NeuronLink domain",
        refused=((8, _TRN2_LNC2_TENSOR_8),) if lnc2 else (),
    )


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How ``world_size`` ranks train one configuration."""

    world_size: int
    tensor: int
    pipeline: int
    virtual_pipeline: int | None
    expert: int
    expert_tensor: int
    sequence_parallel: bool
    data: int
    """Data-parallel size of the dense layers."""
    expert_data: int
    """Data-parallel size of the experts (world / (expert x expert_tensor x pipeline))."""
    num_microbatches: int
    """Micro-batches per optimizer step on each data-parallel rank."""

    @property
    def model_chunks(self) -> int:
        """Model chunks each rank holds: the virtual pipeline size, or 1."""
        return self.virtual_pipeline or 1

    def describe(self) -> str:
        """One line for the log: ``TP2 PP1 EP2 ETP1 DP2 (expert DP1) SP``."""
        vpp = f"x{self.virtual_pipeline}" if self.virtual_pipeline else ""
        return (
            f"TP{self.tensor} PP{self.pipeline}{vpp} EP{self.expert} ETP{self.expert_tensor} DP{self.data} "
            f"(expert DP{self.expert_data}){' SP' if self.sequence_parallel else ''} on {self.world_size} ranks, "
            f"{self.num_microbatches} micro-batches per step"
        )


def plan_layout(config: TrainConfig, world_size: int, *, limit: TensorLimit = GPU_TENSOR_LIMIT) -> Layout:
    """The layout of ``config`` on ``world_size`` ranks of nodes whose tensor-parallel sizes ``limit`` bounds
    (default: GPU nodes); raises ``ConfigError`` with every problem."""
    p, o, errors = config.parallel, config.optim, []
    dense = p.tensor * p.pipeline
    expert = p.expert * p.expert_tensor_size * p.pipeline
    if world_size % dense:
        errors.append(
            problem(
                "tensor x pipeline must divide the world size",
                got=f"{p.tensor} x {p.pipeline} for {world_size} processes",
                allowed=f"a product dividing {world_size}",
            ).at("parallel")
        )
    if world_size % expert:
        errors.append(
            problem(
                "expert x expert_tensor x pipeline must divide the world size",
                got=f"{p.expert} x {p.expert_tensor_size} x {p.pipeline} for {world_size} processes",
                allowed=f"a product dividing {world_size}",
            ).at("parallel.expert")
        )
    if config.model.ffn_hidden_size % p.expert_tensor_size:
        errors.append(
            problem(
                "must divide model.ffn_hidden_size",
                got=p.expert_tensor_size,
                allowed=f"a divisor of {config.model.ffn_hidden_size}",
            ).at("parallel.expert_tensor")
        )
    allowed = ", ".join(map(str, limit.allowed()))
    if limit.ranks % p.tensor:
        errors.append(
            problem(f"must divide the largest tensor-parallel size, {limit.domain}", got=p.tensor, allowed=allowed).at(
                "parallel.tensor"
            )
        )
    for size, why in limit.refused:
        if p.tensor == size:
            errors.append(problem(why, got=p.tensor, allowed=allowed).at("parallel.tensor"))
    groups = config.model.num_query_groups or config.model.num_attention_heads
    if groups % p.tensor:
        errors.append(
            problem(
                "must divide the key/value heads (model.num_query_groups)",
                got=p.tensor,
                allowed=f"a divisor of {groups}",
            ).at("parallel.tensor")
        )
    data = max(world_size // dense, 1)
    per_step = o.micro_batch_size * data
    num_microbatches = o.global_batch_size // per_step if per_step else 0
    if o.global_batch_size % per_step:
        errors.append(
            problem(
                f"must be a multiple of micro_batch_size x data-parallel size ({o.micro_batch_size} x {data})",
                got=o.global_batch_size,
                allowed=f"a multiple of {per_step}",
            ).at("optim.global_batch_size")
        )
    elif p.virtual_pipeline and num_microbatches < p.pipeline:
        # megatron/core/pipeline_parallel/schedules.py: the interleaved schedule needs at
        # least one micro-batch group of pipeline-size micro-batches.
        errors.append(
            problem(
                "the interleaved pipeline schedule needs at least parallel.pipeline micro-batches per step",
                got=f"{num_microbatches} micro-batches",
                allowed=f"global_batch_size >= {p.pipeline * per_step}",
            ).at("optim.global_batch_size")
        )
    if errors:
        raise ConfigError(errors)
    return Layout(
        world_size=world_size,
        tensor=p.tensor,
        pipeline=p.pipeline,
        virtual_pipeline=p.virtual_pipeline,
        expert=p.expert,
        expert_tensor=p.expert_tensor_size,
        sequence_parallel=p.sequence_parallel,
        data=data,
        expert_data=world_size // expert,
        num_microbatches=num_microbatches,
    )


def initialize(layout: Layout, *, timeout_minutes: int = 30) -> None:
    """Create megatron's process groups for ``layout`` (the default process group must exist)."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tensor,
        pipeline_model_parallel_size=layout.pipeline,
        virtual_pipeline_model_parallel_size=layout.virtual_pipeline,
        expert_model_parallel_size=layout.expert,
        expert_tensor_parallel_size=layout.expert_tensor,
        distributed_timeout_minutes=timeout_minutes,
    )


def destroy() -> None:
    """Megatron's process groups, and the MoE loss tracker it keeps beside them: that holds one
    tensor per loss sized by the first model's layer count (moe_utils.save_to_aux_losses_tracker),
    so a second model with more layers in the same process would index past it."""
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    parallel_state.destroy_model_parallel()
    get_moe_layer_wise_logging_tracker().clear()


def data_parallel_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank()


def wrap(chunks, transformer_config, *, overlap: bool, distributed_optimizer: bool) -> list:
    """Each model chunk under megatron's DistributedDataParallel: gradients accumulate in fp32
    buckets and are averaged over the data-parallel group (dense) or the expert-data-parallel
    group (experts), both divided by the data-parallel size, as megatron's own training does."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=overlap,
        overlap_param_gather=overlap and distributed_optimizer,
        use_distributed_optimizer=distributed_optimizer,
        check_for_nan_in_grad=True,
        bucket_size=None if not overlap else 40_000_000,
    )
    return [
        DistributedDataParallel(
            config=transformer_config,
            ddp_config=ddp_config,
            module=chunk,
            # Only the first chunk's buckets start reducing early, as in megatron's training.py.
            disable_bucketing=index > 0,
        )
        for index, chunk in enumerate(chunks)
    ]
