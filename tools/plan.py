"""``moe-cdk plan``: will the training profile fit the cluster, what will it cost, and where to run it.

Everything here is arithmetic on the two configurations and the instance catalog: no CDK
constructs are built and nothing is deployed. The parameter counts and FLOPs come from
``moe_cdk.training.step.sizes``, the figures the trainer uses, without torch.

Memory model (per device, GiB = 2**30 bytes): what moe-train does on a GPU, stage by stage
(``memory_per_device``); the activation formula is checked against the trainer's saved
tensors on CPU (tests/test_activation_memory.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from moe_cdk.core import catalog
from moe_cdk.core.names import project_root
from moe_cdk.core.problems import ConfigError, Problem, problem
from moe_cdk.rules.eks import TERMINATION_GRACE_S
from moe_cdk.rules.hyperpod_capacity import CapacityType
from moe_cdk.rules.neuron import TrainingStack
from moe_cdk.schema.config import Config, InstanceGroupConfig, NodeRole, Orchestrator
from moe_cdk.training.config import RecomputeGranularity, RecomputeModule, Spec, TrainConfig, load_train_config
from moe_cdk.training.step import sizes
from moe_cdk.training.step.parallel import GPU_TENSOR_LIMIT, Layout, TensorLimit, plan_layout, tensor_limit

GIB = 2**30
PRICES_PATH = Path(__file__).resolve().parent / "prices.yaml"

# Bytes per parameter a device holds, megatron's mixed precision (its distributed optimizer
# guide, megatron/core/optimizer/distrib_optimizer.py): the weight, the fp32 gradient buffer
# (DDP's grad_reduce_in_fp32) and the optimizer state -- fp32 main weights (bf16 only) and
# Adam's two moments. The distributed optimizer shards the optimizer state over the
# data-parallel group (experts: the expert-data-parallel group); weights and gradients are
# not sharded.
BF16_BYTES = {"weight": 2, "gradient": 4, "optimizer": 12}
FP32_BYTES = {"weight": 4, "gradient": 4, "optimizer": 8}

DEFAULT_RESERVE = 0.10
"""Share of device memory kept back for the CUDA context, NCCL buffers, the caching
allocator's fragmentation and temporaries the formula does not count."""

DEFAULT_MFU = 0.35
"""Model FLOPs utilisation assumed for throughput: a typical figure for a well-tuned MoE
run with megatron-core on H100-class GPUs; an estimate, not a measurement."""

BYTE_TOKENIZER_VOCAB = 257  # 256 byte values + end-of-document (training/data/tokenizers.py ByteTokenizer)
ASSUMED_VOCAB = 32000  # Mixtral/Llama-2 size, used when the tokenizer.json is not on this machine

TRAINING_JOB_MAX_HOURS = 24.0  # prototypes and short runs: under a day...
TRAINING_JOB_MAX_NODES = 4  # ...on a few nodes
TRAINING_JOB_LIMIT_HOURS = 28 * 24  # SageMaker Training Jobs: MaxRuntimeInSeconds is at most 28 days


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory per device, in GiB, on the most loaded pipeline stage, and what it was sized for."""

    layout: Layout
    precision: str
    """``bf16`` (bf16 weights, fp32 gradients and main weights) or ``fp32``."""
    distributed_optimizer: bool
    attention: str
    """``unfused`` (the local spec materialises the s x s scores) or ``fused`` (Transformer Engine)."""
    recompute: tuple[str, ...]
    """Modules recomputed in the backward pass (megatron's ``recompute_modules``)."""
    parameters: float
    """Weights this device holds (bf16 or fp32)."""
    gradients: float
    """fp32 gradient buffers of those weights."""
    optimizer: float
    """fp32 main weights (bf16 only) and Adam moments, after the distributed optimizer's sharding."""
    activations: float
    """Activations kept for the backward pass by the micro-batches in flight, plus the fp32 logits."""
    optimizer_step: float
    """The optimizer step's fp32 temporary, one per parameter it updates: torch's foreach AdamW, which
    megatron falls back to without Transformer Engine or Apex, holds it while the step runs, after the
    activations are freed. 0 under the ``transformer_engine`` spec (its fused Adam updates in place)."""
    total: float
    """Weights, gradients and optimizer state, plus the larger of the activations and the optimizer step."""
    capacity: float
    """Device memory less the reserve."""
    fits: bool
    parameters_per_device: int
    """Parameter count this device holds."""
    device_memory_gib: float
    reserve_fraction: float
    checkpoint_gb: float
    """One checkpoint of the whole model: weights, fp32 main weights (bf16) and Adam moments, in GB."""


@dataclass(frozen=True)
class Plan:
    """A sized training run on a configured cluster."""

    config_name: str
    region: str
    profile: str
    instance_type: str
    """The compute group's instance type (the first, if there are several)."""
    nodes: int
    """Compute nodes with accelerators."""
    world_size: int
    """Training processes across those nodes: one per GPU, or per logical NeuronCore on Trainium."""
    accelerators: int
    """GPUs or Trainium chips across those nodes."""
    stack: str
    """What trains the profile (``training.stack`` resolved): ``megatron`` or ``neuronx-distributed-training``."""
    accelerator: str
    vocab_size: int
    total_parameters: int
    active_parameters: int
    memory: MemoryEstimate
    cost_per_hour_usd: float | None
    """The whole cluster (every instance group, controller and login included); None without a price."""
    mfu: float
    tokens_per_second: float
    cost_per_billion_tokens_usd: float | None
    run_tokens: int
    """max_steps x global_batch_size x seq_length."""
    estimated_run_hours: float
    storage_throughput_mb_s: float
    """The FSx file system's throughput: capacity in TiB x its per-TiB tier, in MB/s."""
    checkpoint_save_s: float
    """One checkpoint (``memory.checkpoint_gb``) written at ``storage_throughput_mb_s``."""
    stop_s: float
    """What a stop signal costs before the process may end: the rest of a step (a whole one, at
    ``tokens_per_second``) and then one checkpoint save. A grace period must cover it."""
    recommendation: str
    """training-job, slurm or eks."""
    reasons: tuple[str, ...]
    notes: tuple[str, ...]
    problems: tuple[Problem, ...] = ()
    prices: tuple[Price, ...] = ()
    """The prices ``cost_per_hour_usd`` is summed from, each with its source, date and confirmation."""
    """Why the run cannot go ahead as sized: empty when it fits in device memory."""


def termination_grace_s(stop_s: float) -> int:
    """A pod's grace period for a stop that takes ``stop_s``: a quarter more, in whole minutes, and
    at least ``TERMINATION_GRACE_S``."""
    return max(TERMINATION_GRACE_S, math.ceil(stop_s * 1.25 / 60) * 60)


def grace_period_note(grace_s: float, stop_s: float, what: str) -> str | None:
    """A warning when ``grace_s`` seconds between a stop signal and the kill cannot hold the rest of a
    step and a checkpoint save (``stop_s``); None when they can."""
    if stop_s <= grace_s:
        return None
    return (
        f"{what} is {grace_s:,.0f} s, and a stop needs about {stop_s:,.0f} s (the rest of a step, then a "
        "checkpoint save): the save on SIGTERM will not finish and the run resumes from its last periodic "
        "checkpoint; raise it above the stop time"
    )


def _in_profile(problems: list[Problem]) -> list[Problem]:
    """A trainer profile's problems, named as the profile's own keys inside ``training.profile``."""
    return [dataclasses.replace(p, key=f"training.profile: {p.key}" if p.key else "training.profile") for p in problems]


# ---------------------------------------------------------------------------------- memory


def activation_bytes_per_layer(
    train: TrainConfig,
    layout: Layout,
    *,
    bytes_per_element: int,
    fused_attention: bool,
    on_gpu: bool = True,
    dense: bool = False,
) -> float:
    """Bytes one transformer layer keeps for the backward pass of one micro-batch, per device.

    Counted from what megatron-core 0.16.1 saves (the tensors ``saved_tensors_hooks`` sees in
    tests/test_activation_memory.py), with T = seq x micro-batch tokens, h hidden, a heads,
    d_kv the key/value width (groups x head size), f the expert FFN width, k top-k, E experts,
    t tensor parallel (sequence parallel whenever t > 1, so every token-wise tensor is split
    t ways) and e the activation element size (2 bf16, 4 fp32):

    - residual stream and norms: 8 x T*h (norm inputs and outputs, the attention output
      projection's input, the MoE layer's input and combine);
    - attention: the fused QKV output T*(q + 2 d_kv), rotated q and k (T*q each), v expanded
      to every head under grouped-query attention (T*q when d_kv < q), with q the query width
      (h unless ``model.kv_channels`` is set); ``qk_layernorm`` adds its norms' T*(q + d_kv) twice;
    - unfused scores: the softmax output a*s^2*b, and with dropout its mask and output;
      fused attention keeps only its fp32 softmax statistics (a*s*b); ``core_attn``
      recompute keeps neither (the checkpoint keeps q, k and v, counted above);
    - experts: each device runs (T/t) x k x ETP routed tokens (balanced routing, after the
      all-to-all and the expert-tensor all-gather): their permuted input (h each) and the
      SwiGLU's intermediates, 6 x f/ETP each (fc1's 2f output and four f-wide tensors);
      ``moe_act`` recompute drops the activation's f-wide output (not measurable here: it
      needs grouped GEMM, which needs a GPU); a shared expert adds T x 6 x its width / t;
    - router bookkeeping, fp32 and int64: T x (13 E + 20 k) bytes; norm statistics 2T x 4;
      rotary tables 4 x s x head size x 4.
    """
    m, moe, o = train.model, train.moe, train.optim
    s, b, h, a, f, k, E = (
        m.seq_length,
        o.micro_batch_size,
        m.hidden_size,
        m.num_attention_heads,
        m.ffn_hidden_size,
        moe.top_k,
        moe.num_experts,
    )
    t, etp, e = layout.tensor, layout.expert_tensor, bytes_per_element
    head = m.head_size
    d_kv = (m.num_query_groups or a) * head
    tokens = s * b
    recompute = set(train.recompute.modules)
    mask_bytes = 1 if on_gpu else e  # torch's dropout keeps a bool mask on CUDA, one of the input's dtype on CPU
    q = a * head  # the query width: h unless model.kv_channels says otherwise
    if m.multi_latent_attention:
        # Fitted to the tensors autograd saves on CPU (tests/activation_probe.py, varying each width
        # in turn at hidden 64 and 128): 2 per query/key/value head element, 3 per latent element
        # (the down projection's output and its norm's input and output), 2 per rotated width, less
        # 1.25 h against the residual-stream term that counts h-wide attention tensors.
        attention = (
            2 * a * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim)
            + 2 * m.qk_pos_emb_head_dim
            + 3 * (m.kv_lora_rank + (m.q_lora_rank or 0))
            - 1.25 * h
        )
        head = m.qk_pos_emb_head_dim  # the rotary tables' width
    else:
        attention = (q + 2 * d_kv) + 2 * q + (q if d_kv < q else 0)
        if m.qk_layernorm:
            attention += 2 * (q + d_kv)  # the query and key norms' inputs and outputs (estimated, not measured)
    hidden = (8 * h + attention) * tokens * e
    if m.dropout > 0:
        hidden += 2 * tokens * h * mask_bytes  # the two hidden dropouts' masks
    if fused_attention:
        scores = a * s * b * 4
    elif RecomputeModule.CORE_ATTN in recompute:
        scores = 0
    else:
        scores = a * s * s * b * (e + ((e + mask_bytes) if m.dropout > 0 else 0))
    routed = tokens / t * k
    expert_width = 6 * f - (f if RecomputeModule.MOE_ACT in recompute else 0)
    experts = routed * (etp * h + expert_width) * e
    # A shared expert runs every token through a tensor-parallel SwiGLU: the same 6 x width
    # intermediates, split t ways (an estimate by analogy with the routed experts, not measured).
    experts += tokens * 6 * (moe.shared_expert_ffn_hidden_size or 0) * e / t
    bookkeeping = tokens * (13 * E + 20 * k) + 2 * tokens * 4
    if dense:
        # A dense layer (model.dense_layers): one tensor-parallel SwiGLU over every token, the
        # routed experts' 6 x width intermediates, and no router.
        experts, bookkeeping = tokens * 6 * m.dense_ffn_hidden_size * e / t, 2 * tokens * 4
    return (hidden + scores + bookkeeping) / t + experts + 4 * s * head * 4


def activation_bytes(
    train: TrainConfig,
    layout: Layout,
    *,
    vocab_size: int,
    bytes_per_element: int,
    fused_attention: bool,
    on_gpu: bool = True,
) -> float:
    """Activation bytes on the most loaded device: its layers' activations for every
    micro-batch in flight, the final norm's input and the fp32 logits of the loss.

    A pipeline stage holds num_layers / PP layers. Under 1F1B the first stage has
    min(PP, micro-batches) micro-batches in flight, so it holds num_layers x min(1, M/PP)
    layers' worth; interleaving (VPP) adds (PP - 1) / (PP x VPP) of that (megatron's
    theoretical memory model). The logits (T x padded vocabulary / t, fp32 for the cross
    entropy) sit on the last stage; they are added to the first stage's figure, which
    over-counts by at most one micro-batch's logits when PP > 1.
    """
    m, o = train.model, train.optim
    tokens = m.seq_length * o.micro_batch_size
    pp, t = layout.pipeline, layout.tensor
    layers = m.num_layers * (min(1.0, layout.num_microbatches / pp) if pp > 1 else 1.0)
    if layout.virtual_pipeline:
        layers *= 1 + (pp - 1) / (pp * layout.virtual_pipeline)
    options = dict(bytes_per_element=bytes_per_element, fused_attention=fused_attention, on_gpu=on_gpu)
    per_layer = activation_bytes_per_layer(train, layout, **options)
    if m.dense_layers:  # the layers' mean, dense and MoE
        dense = activation_bytes_per_layer(train, layout, **options, dense=True)
        per_layer = (m.dense_layers * dense + (m.num_layers - m.dense_layers) * per_layer) / m.num_layers
    padded_vocab = sizes.padded_vocab_size(vocab_size)
    final_norm = tokens * m.hidden_size * bytes_per_element / t
    logits = tokens * padded_vocab * 4 / t
    return per_layer * layers + final_norm + logits


def memory_per_device(
    train: TrainConfig,
    *,
    world_size: int,
    vocab_size: int,
    device_memory_gib: float,
    reserve_fraction: float = DEFAULT_RESERVE,
    optimizer_temporary: bool = True,
    limit: TensorLimit = GPU_TENSOR_LIMIT,
) -> MemoryEstimate:
    """Memory one GPU needs to train ``train`` on ``world_size`` GPUs of ``device_memory_gib`` each.

    - parameters on the most loaded stage: dense layer parameters / (TP x PP), expert
      parameters / (EP x ETP x PP), and the embedding and output tables / TP (both on one
      stage when PP = 1, one each on the first and last stage otherwise);
    - bytes per parameter: ``BF16_BYTES`` or ``FP32_BYTES`` (``optim.precision``; ``auto``
      is bf16 on a GPU), the optimizer share divided by the data-parallel size (experts:
      expert-data-parallel) under ``optim.distributed_optimizer``;
    - activations: ``activation_bytes``, with unfused attention unless ``model.spec`` is
      ``transformer_engine`` (``auto`` may pick the local spec, the larger of the two);
    - capacity: ``device_memory_gib * (1 - reserve_fraction)``;
    - ``optimizer_temporary``: count torch's foreach AdamW temporary (measured on CUDA); off for NxD Training,
      whose optimizer step is a compiled XLA graph;
    - ``limit``: the tensor-parallel sizes the nodes can run (``parallel.tensor_limit``).

    Raises ``ConfigError`` when the parallel layout does not fit ``world_size``.
    """
    try:
        layout = plan_layout(train, world_size, limit=limit)
    except ConfigError as error:
        raise ConfigError(_in_profile(error.problems)) from None
    m, o = train.model, train.optim
    counts = sizes.parameter_counts(train, vocab_size)
    table = sizes.padded_vocab_size(vocab_size) * m.hidden_size
    dense_layers = counts.total - counts.expert - 2 * table - m.hidden_size
    tables = 2 if layout.pipeline == 1 else 1
    dense = dense_layers / (layout.tensor * layout.pipeline) + (tables * table + m.hidden_size) / layout.tensor
    expert = counts.expert / (layout.expert * layout.expert_tensor * layout.pipeline)
    bf16 = sizes.use_bf16(train, on_gpu=True)
    element = BF16_BYTES if bf16 else FP32_BYTES
    stepped = dense / layout.data + expert / layout.expert_data if o.distributed_optimizer else dense + expert
    optimizer = element["optimizer"] * stepped
    # Transformer Engine's and the native spec's attention kernels hold no s x s scores; both step a fused Adam
    # (Transformer Engine's, and torch's under the native spec: training/step/trainer.py use_fused_adamw).
    fused_attention = fused = m.spec in (Spec.TRANSFORMER_ENGINE, Spec.NATIVE)
    # Measured on an H200 (docs/benchmarks.md): without Transformer Engine the peak stayed at 93.4 to
    # 94.3 GiB from sequence 1,024 to 4,096, the weights' and optimizer's 77.5 GiB plus one fp32 copy of
    # the parameters (torch._foreach_sqrt of Adam's second moments), not plus the activations.
    optimizer_step = 0.0 if fused or not optimizer_temporary else 4 * stepped
    activations = activation_bytes(
        train, layout, vocab_size=vocab_size, bytes_per_element=2 if bf16 else 4, fused_attention=fused_attention
    )
    per_device = dense + expert
    parameters, gradients = per_device * element["weight"] / GIB, per_device * element["gradient"] / GIB
    total = parameters + gradients + optimizer / GIB + max(activations, optimizer_step) / GIB
    capacity = device_memory_gib * (1 - reserve_fraction)
    return MemoryEstimate(
        layout=layout,
        precision="bf16" if bf16 else "fp32",
        distributed_optimizer=o.distributed_optimizer,
        attention="fused" if fused_attention else "unfused",
        recompute=tuple(mod.value for mod in train.recompute.modules),
        parameters=parameters,
        gradients=gradients,
        optimizer=optimizer / GIB,
        activations=activations / GIB,
        optimizer_step=optimizer_step / GIB,
        total=total,
        capacity=capacity,
        fits=total <= capacity,
        parameters_per_device=round(per_device),
        device_memory_gib=float(device_memory_gib),
        reserve_fraction=reserve_fraction,
        checkpoint_gb=counts.total * (element["weight"] + element["optimizer"]) / 1e9,
    )


# ---------------------------------------------------------------------------------- prices


@dataclass(frozen=True)
class Price:
    """One hourly rate from prices.yaml, with where it comes from: ``plan`` prints all of it."""

    instance_type: str
    region: str
    capacity: CapacityType
    usd_per_hour: float
    source: str
    """The AWS page the figure was read on, or how an estimate was worked out."""
    retrieved: str
    """The day the figure was read, ``YYYY-MM-DD``."""
    confirmed: bool
    """True only when the figure was read on AWS's pricing page for that type and Region."""


# What each entry of prices.yaml holds, in the words of the problem an entry without it gets.
_PRICE_FIELDS = {
    "instance_type": "an ml. instance type, e.g. ml.trn2.48xlarge",
    "region": "an AWS Region, e.g. us-east-2",
    "usd_per_hour": "a price in USD per hour above 0",
    "source": "the AWS pricing page it was read on, or how the estimate was worked out",
    "retrieved": "the day the figure was read, YYYY-MM-DD",
    "confirmed": "true (read on AWS's pricing page) or false (an estimate)",
}


_PRICE_NOUNS = {  # what a value that is not one is called
    "instance_type": "an instance type",
    "region": "a Region",
    "usd_per_hour": "a price",
    "source": "a source",
    "retrieved": "a date",
    "confirmed": "true or false",
}


def _price_value_problem(field: str, value: object) -> Problem | None:
    """Why ``value`` is not a ``field`` of a price entry, or None."""
    if field in ("instance_type", "region", "source"):
        ok = isinstance(value, str) and bool(value.strip())
    elif field == "usd_per_hour":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    elif field == "confirmed":
        ok = isinstance(value, bool)
    else:  # retrieved: YAML reads an unquoted date as a date, a quoted one as a string
        try:
            ok = isinstance(value, datetime.date) or datetime.date.fromisoformat(str(value)) is not None
        except ValueError:
            ok = False
    return None if ok else problem(f"not {_PRICE_NOUNS[field]}", got=value, allowed=_PRICE_FIELDS[field])


def _price_problems(entry: object, index: int) -> list[Problem]:
    if not isinstance(entry, dict):
        return [problem("a price is a mapping", got=entry, allowed=", ".join(_PRICE_FIELDS)).at(f"prices[{index}]")]
    what = f"{entry.get('instance_type', 'this entry')} in {entry.get('region', '?')}"
    found = []
    for field, allowed in _PRICE_FIELDS.items():
        if field not in entry:
            # Without its source, date and confirmation plan would print a bare number as if it were known.
            found.append(Problem("", f"{what} has no {field}", allowed=allowed).at(f"prices[{index}].{field}"))
        elif value_problem := _price_value_problem(field, entry[field]):
            found.append(value_problem.at(f"prices[{index}].{field}"))
    if "capacity" in entry and entry["capacity"] not in {c.value for c in CapacityType}:
        found.append(
            problem("not a capacity type", got=entry["capacity"], allowed=", ".join(c.value for c in CapacityType)).at(
                f"prices[{index}].capacity"
            )
        )
    for key in sorted(set(entry) - set(_PRICE_FIELDS) - {"capacity"}, key=str):
        allowed = ", ".join([*_PRICE_FIELDS, "capacity"])
        found.append(problem("unknown key", got=key, allowed=allowed).at(f"prices[{index}]"))
    return found


@lru_cache(maxsize=4)
def _load_prices(path: str) -> tuple[Price, ...]:
    """Every entry of the prices file; ``ConfigError`` naming each entry (``<file>: prices[i].<key>``) that lacks
    its price, source, date or confirmation."""
    shown = Path(path).name if Path(path).resolve() != PRICES_PATH else "tools/prices.yaml"
    data = yaml.safe_load(Path(path).read_text()) or {}
    entries = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ConfigError([problem("no list of prices", got=entries, allowed="prices: [...]").at(f"{shown}: prices")])
    found = [p for i, entry in enumerate(entries) for p in _price_problems(entry, i)]
    if found:
        raise ConfigError([dataclasses.replace(p, key=f"{shown}: {p.key}") for p in found])
    return tuple(
        Price(
            instance_type=e["instance_type"],
            region=e["region"],
            capacity=CapacityType(e.get("capacity", CapacityType.ON_DEMAND.value)),
            usd_per_hour=float(e["usd_per_hour"]),
            source=e["source"].strip(),
            retrieved=str(e["retrieved"]),
            confirmed=e["confirmed"],
        )
        for e in entries
    )


def load_price_entries(
    path: str | Path = PRICES_PATH, capacity: CapacityType = CapacityType.ON_DEMAND
) -> dict[tuple[str, str], Price]:
    """``{(instance type, region): Price}`` from prices.yaml, for On-Demand or Spot capacity (an entry's
    ``capacity``, on-demand when absent)."""
    return {(p.instance_type, p.region): p for p in _load_prices(str(path)) if p.capacity is capacity}


def load_prices(
    path: str | Path = PRICES_PATH, capacity: CapacityType = CapacityType.ON_DEMAND
) -> dict[tuple[str, str], float]:
    """``{(instance type, region): USD per hour}`` from prices.yaml, for On-Demand or Spot capacity."""
    return {key: price.usd_per_hour for key, price in load_price_entries(path, capacity).items()}


def _priced_name(config: Config, instance_type: str) -> str:
    """The name the group's nodes are billed under: the SageMaker (``ml.``) type, or on ParallelCluster, whose nodes
    are EC2 instances, the EC2 type."""
    spec = catalog.lookup(instance_type)
    if spec is None:
        return instance_type
    return spec.ec2_name if config.cluster.orchestrator is Orchestrator.PARALLELCLUSTER else spec.sagemaker_name


def _group_prices(config: Config, prices_path: str | Path) -> list[tuple[InstanceGroupConfig, Price | None]]:
    """Each instance group with the price it is costed at: its Spot price for a Spot group that has one, else
    On-Demand; None where prices.yaml has neither."""
    on_demand = load_price_entries(prices_path)
    spot = load_price_entries(prices_path, CapacityType.SPOT)
    out = []
    for group in config.cluster.instance_groups:
        key = (_priced_name(config, group.instance_type), config.region)
        price = spot.get(key) if group.capacity is CapacityType.SPOT else None
        out.append((group, price or on_demand.get(key)))
    return out


def cluster_prices(config: Config, prices_path: str | Path = PRICES_PATH) -> tuple[Price, ...]:
    """The prices the cluster's cost is summed from, each once, in the order of the groups."""
    return tuple(dict.fromkeys(price for _, price in _group_prices(config, prices_path) if price))


def cluster_cost_per_hour(config: Config, prices_path: str | Path = PRICES_PATH) -> tuple[float | None, list[str]]:
    """Sum of instance_count x hourly price over every group (a flexible group at its first choice), and
    notes; None when a price is unknown. A Spot group without a Spot price is priced at On-Demand, an
    upper bound, and says so: AWS publishes no Spot rates for ml. types (docs/capacity.md)."""
    total, notes, unknown = 0.0, [], False
    for group, price in _group_prices(config, prices_path):
        key = (_priced_name(config, group.instance_type), config.region)
        if group.capacity is CapacityType.CAPACITY_BLOCK:
            notes.append(
                f"group {group.name} runs on a Capacity Block, paid upfront at its own rate: priced at On-Demand here"
            )
        if group.capacity is CapacityType.SPOT and (price is None or price.capacity is not CapacityType.SPOT):
            notes.append(
                f"no Spot price for {key[0]} in {config.region} (tools/prices.yaml): group {group.name} is priced "
                "at On-Demand, an upper bound; Spot is up to 90 % less and varies"
            )
        if price is None:
            unknown = True
            notes.append(f"no price for {key[0]} in {config.region} (tools/prices.yaml); cost not estimated")
            continue
        total += group.instance_count * price.usd_per_hour
        if group.autoscale:
            notes.append(
                f"group {group.name} is autoscaled: the cost counts all {group.instance_count} nodes it may run, "
                "and is 0 while no training pod runs"
            )
    return (None if unknown else total), notes


# ---------------------------------------------------------------------------------- plan


def _vocab_size(train: TrainConfig, notes: list[str]) -> int:
    if train.model.vocab_size is not None:
        return train.model.vocab_size
    tokenizer = train.data.tokenizer
    if tokenizer == "byte":
        return BYTE_TOKENIZER_VOCAB
    path = Path(tokenizer)
    if not path.is_absolute():
        path = project_root() / path
    if path.is_file():
        from moe_cdk.training.data.tokenizers import load_tokenizer

        return load_tokenizer(str(path)).vocab_size
    notes.append(f"tokenizer {tokenizer} is not on this machine: assumed a {ASSUMED_VOCAB}-token vocabulary")
    return ASSUMED_VOCAB


def _recommend(config: Config, run_hours: float, nodes: int) -> tuple[str, list[str]]:
    length = f"estimated run {run_hours:,.1f} h on {nodes} node(s)"
    if config.cluster.orchestrator is Orchestrator.EKS:
        return "eks", [
            "the configuration's orchestrator is eks: Kubernetes pipelines run on HyperPod EKS",
            length,
            "HyperPod replaces faulty nodes and resumes the job",
        ]
    if run_hours < TRAINING_JOB_MAX_HOURS and nodes <= TRAINING_JOB_MAX_NODES:
        return "training-job", [
            f"{length}: under {TRAINING_JOB_MAX_HOURS:.0f} h on at most {TRAINING_JOB_MAX_NODES} nodes",
            "a short run or prototype: Training Jobs bill only while the job runs, no standing cluster",
        ]
    reasons = [length]
    if run_hours >= TRAINING_JOB_LIMIT_HOURS:
        reasons.append(f"longer than the {TRAINING_JOB_LIMIT_HOURS // 24}-day Training Jobs limit")
    if run_hours >= TRAINING_JOB_MAX_HOURS:
        reasons.append(
            f"over {TRAINING_JOB_MAX_HOURS:.0f} h: needs automatic resume from checkpoints (HyperPod auto-resume)"
        )
    if nodes > TRAINING_JOB_MAX_NODES:
        reasons.append(
            f"more than {TRAINING_JOB_MAX_NODES} nodes: a persistent cluster with health checks and node replacement"
        )
    return "slurm", reasons


# "Spot instances in SageMaker HyperPod": EC2 gives "a best-effort 2-minute interruption notice", not always.
SPOT_NOTICE_S = 120


def _tiered_storage_note(tiered, specs: Sequence[catalog.InstanceSpec], checkpoint_gb: float, nodes: int) -> str:
    """How many checkpoints the memory tier holds: each node keeps its share of one checkpoint (the
    state is sharded across the nodes) in ``memory_percent`` of its host memory (the smallest of its types)."""
    kept_gib = min(tiered.gib_per_node(s.sagemaker_name) for s in specs)
    share_gib = checkpoint_gb * 1e9 / 2**30 / nodes
    held = int(kept_gib // share_gib) if share_gib else 0
    verdict = f"holds {held} checkpoint(s)" if held else "cannot hold one checkpoint: raise memory_percent"
    return (
        f"tiered storage keeps {kept_gib:,.0f} GiB on each node ({tiered.memory_percent} % of its host memory); a "
        f"checkpoint is {share_gib:,.1f} GiB a node: it {verdict}"
    )


def plan(
    config: Config,
    *,
    train_config_path: str | None = None,
    mfu: float = DEFAULT_MFU,
    train_overrides: Sequence[str] = (),
    prices_path: str | Path = PRICES_PATH,
    reserve_fraction: float = DEFAULT_RESERVE,
) -> Plan:
    """Size ``config``'s training profile (or ``train_config_path``) on its compute groups.

    Raises ``ConfigError`` when the profile cannot be read or its layout does not fit the world
    size. A plan that does not fit in device memory is returned, with ``problems`` saying so.
    """
    if not 0 < mfu <= 1:
        raise ConfigError(
            [problem("model FLOPs utilisation out of range", got=mfu, allowed="0 < mfu <= 1").at("--mfu")]
        )
    notes: list[str] = []
    profile = train_config_path or config.training.profile
    path = Path(train_config_path) if train_config_path else config.training.path
    try:
        train = load_train_config(path, train_overrides)
    except ConfigError as error:
        raise ConfigError(_in_profile(error.problems)) from None

    groups = []
    for group in config.cluster.instance_groups:
        spec = catalog.lookup(group.instance_type)
        if group.name in config.cluster.fallback_group_names:
            notes.append(f"group {group.name} is a fallback group: its nodes stand in for Spot nodes, not beside them")
        elif group.role is NodeRole.COMPUTE and spec is not None and spec.is_accelerated:
            groups.append((group, spec))
    if not groups:
        raise ConfigError(
            [
                problem(
                    "no compute group with accelerators",
                    got="only CPU instance types",
                    allowed="at least one GPU or Trainium compute group",
                ).at("cluster.instance_groups")
            ]
        )
    nodes = sum(g.instance_count for g, _ in groups)
    accelerators = sum(g.instance_count * s.accelerator_count for g, s in groups)
    # One rank per GPU, or per logical NeuronCore (4 per Trainium2 chip at LNC 2), which holds that share of the chip.
    world_size = config.world_size
    stack = config.training_stack
    # Every type a node may be: a flexible group's fallbacks have as many accelerators as its first
    # choice (rules/hyperpod_capacity.py), but maybe less memory or speed.
    every = [s for g, _ in groups for s in g.specs]
    for g, _ in groups:
        if g.fallback_instance_types:
            notes.append(
                f"group {g.name}'s nodes may be "
                f"{', '.join([_priced_name(config, g.instance_type), *g.fallback_instance_types])}: "
                "memory is sized on the smallest device, time on the slowest, cost at the first"
            )
    # Mixed groups: the smallest device bounds the memory, the slowest one the step time.
    device_memory = min(s.accelerator_memory_gib / s.ranks_per_accelerator for s in every)
    models = sorted({s.accelerator_model for s in every})
    # Dense BF16 peak per device, with its sources, in the catalog (the trainer's MFU reads the same table).
    peak = min(catalog.peak_bf16_tflops(mdl) or 0.0 for mdl in models)
    if len(groups) > 1:
        notes.append(f"{len(groups)} compute groups pooled into one world of {world_size} devices")
    if stack is TrainingStack.NXDT:
        # What NxD Training cannot express is refused by `moe-cdk plan` and the job renderers (jobs/nxdt.py).
        # NxD Training splits the experts over the tensor-parallel ranks (jobs/nxdt.py): expert-tensor = tensor.
        parallel = dataclasses.replace(train.parallel, expert_tensor=train.parallel.tensor)
        train = dataclasses.replace(train, parallel=parallel)
        per_chip = every[0].ranks_per_accelerator
        notes.append(
            f"NxD Training on Trainium: an estimate from megatron's formulas for NxD Training's layout (experts over "
            f"the tensor-parallel ranks, ZeRO-1 over data parallel), per logical NeuronCore with "
            f"1/{per_chip} of a chip's memory; XLA's compiled graphs may hold more, and nothing here has run on "
            "Trainium: neuron_parallel_compile's first run reports the real figure"
        )

    vocab = _vocab_size(train, notes)
    memory = memory_per_device(
        train,
        world_size=world_size,
        vocab_size=vocab,
        device_memory_gib=device_memory,
        reserve_fraction=reserve_fraction,
        optimizer_temporary=stack is not TrainingStack.NXDT,
        limit=min((tensor_limit(s) for s in every), key=lambda lim: lim.ranks),
    )
    # megatron orders the expert ranks expert-tensor first, then expert, and neuronx-distributed expert, then
    # tensor ([PP, DP_exp, EP, TP], parallel_layers/parallel_state.py): either way each expert-parallel group is
    # EP x ETP consecutive ranks, on one node only while that fits its ranks (64 on a trn2 node at LNC 2).
    per_node = min(s.ranks_per_node for s in every)
    link = "NeuronLink" if every[0].accelerator_kind is catalog.AcceleratorKind.TRAINIUM else "NVLink"
    expert_ranks = memory.layout.expert * memory.layout.expert_tensor
    if expert_ranks > per_node:
        notes.append(
            f"the expert-parallel group spans nodes (EP {memory.layout.expert} x ETP {memory.layout.expert_tensor} = "
            f"{expert_ranks} ranks, {per_node} ranks per node): the MoE all-to-all crosses EFA, not {link}"
        )
    if tiered := config.cluster.tiered_storage:
        notes.append(_tiered_storage_note(tiered, every, memory.checkpoint_gb, nodes))
    counts = sizes.parameter_counts(train, vocab)
    flops = sizes.flops_per_token(train, vocab)
    tokens_per_second = mfu * peak * 1e12 * accelerators / flops
    run_tokens = train.max_steps * train.optim.global_batch_size * train.model.seq_length
    run_hours = run_tokens / tokens_per_second / 3600 if tokens_per_second else float("inf")

    lustre = config.storage.lustre
    storage_mb_s = lustre.storage_capacity_gib / 1024 * lustre.per_unit_storage_throughput_mb_s_tib
    cost, cost_notes = cluster_cost_per_hour(config, prices_path)
    notes.extend(cost_notes)
    per_billion = cost / (tokens_per_second * 3600) * 1e9 if cost is not None and tokens_per_second else None
    recommendation, reasons = _recommend(config, run_hours, nodes)

    save_s = memory.checkpoint_gb * 1e3 / storage_mb_s
    spot = [g.name for g in config.cluster.instance_groups if g.capacity is CapacityType.SPOT]
    if spot and save_s > SPOT_NOTICE_S:
        notes.append(
            f"Spot group(s) {', '.join(spot)}: a checkpoint takes about {save_s:,.0f} s, longer than the "
            f"{SPOT_NOTICE_S} s notice of an interruption, so the save on SIGTERM will not finish and the run "
            "resumes from its last periodic checkpoint (checkpoint.save_interval)"
        )
    step_s = train.optim.global_batch_size * train.model.seq_length / tokens_per_second if tokens_per_second else 0.0
    stop_s = step_s + save_s
    if config.cluster.orchestrator is Orchestrator.EKS:
        notes.append(
            f"a stop takes about {stop_s:,.0f} s (the rest of a step, then a checkpoint save): eks render gives the "
            f"pods terminationGracePeriodSeconds {termination_grace_s(stop_s)}"
        )
    result = Plan(
        config_name=config.name,
        region=config.region,
        profile=str(profile),
        instance_type=groups[0][0].instance_type,
        nodes=nodes,
        world_size=world_size,
        accelerators=accelerators,
        stack=stack.value,
        accelerator="/".join(models),
        vocab_size=vocab,
        total_parameters=counts.total,
        active_parameters=counts.active,
        memory=memory,
        cost_per_hour_usd=cost,
        prices=cluster_prices(config, prices_path),
        mfu=mfu,
        tokens_per_second=tokens_per_second,
        cost_per_billion_tokens_usd=per_billion,
        run_tokens=run_tokens,
        estimated_run_hours=run_hours,
        storage_throughput_mb_s=storage_mb_s,
        checkpoint_save_s=save_s,
        stop_s=stop_s,
        recommendation=recommendation,
        reasons=tuple(reasons),
        notes=tuple(notes),
    )
    if not memory.fits:
        term, gib = max(memory_terms(memory).items(), key=lambda item: item[1])
        result = dataclasses.replace(
            result,
            problems=(
                problem(
                    f"{profile} does not fit in device memory; the largest term is {term} at {gib:.1f} GiB: "
                    f"{_shrink(term, train)}",
                    got=f"{memory.total:.1f} GiB per device",
                    allowed=f"at most {memory.capacity:.1f} GiB per device: {device_memory:.1f} GiB {'/'.join(models)} "
                    f"less {reserve_fraction:.0%} reserve",
                ).at("training.profile"),
            ),
        )
    return result


def memory_terms(memory: MemoryEstimate) -> dict[str, float]:
    """The terms of the total: the state, and the larger of the two that never coexist."""
    peak = ("optimizer step", memory.optimizer_step) if memory.optimizer_step > memory.activations else None
    return {
        "parameters": memory.parameters,
        "gradients": memory.gradients,
        "optimizer": memory.optimizer,
        **dict([peak or ("activations", memory.activations)]),
    }


def _shrink(term: str, train: TrainConfig) -> str:
    """What shrinks ``term`` per device, in the profile's keys (`moe-cdk plan --set` tries each)."""
    p = train.parallel
    if term == "activations":
        ways = (
            [f"optim.micro_batch_size below {train.optim.micro_batch_size}"] if train.optim.micro_batch_size > 1 else []
        )
        if train.recompute.granularity is RecomputeGranularity.NONE:
            ways.append("recompute.granularity=selective with recompute.modules=[core_attn,moe_act]")
        ways.append(f"parallel.tensor above {p.tensor} (sequence parallel then splits them too)")
    else:
        ways = [f"parallel.expert above {p.expert}"] if p.expert < train.moe.num_experts else []
        ways += [f"parallel.tensor above {p.tensor}", f"parallel.pipeline above {p.pipeline}"]
        if term in ("optimizer", "optimizer step") and not train.optim.distributed_optimizer:
            ways.insert(0, "optim.distributed_optimizer=true")
        if term == "optimizer step":
            ways.insert(0, "model.spec=transformer_engine (its fused Adam keeps no temporary)")
    return "try " + ", or ".join(ways) + ", or more nodes"


# ---------------------------------------------------------------------------------- output


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def _price_line(price: Price) -> str:
    spot = " (Spot)" if price.capacity is CapacityType.SPOT else ""
    state = "confirmed" if price.confirmed else "UNCONFIRMED"
    return (
        f"{price.instance_type}{spot} ${price.usd_per_hour:g}/h in {price.region}, {state}, "
        f"retrieved {price.retrieved}: {price.source}"
    )


BAR_WIDTH = 60
# One fill per memory term, in the order the bar stacks them; "·" is the reserve, " " free memory.
BAR_FILLS = {"parameters": "█", "gradients": "▓", "optimizer": "▒", "activations": "░", "optimizer step": "░"}


def memory_bar(memory: MemoryEstimate, width: int = BAR_WIDTH) -> list[str]:
    """The memory terms stacked against the device, as two text lines: the bar, on the scale of the device's
    memory (or of the total, when that is larger), with the reserve after the capacity, and its legend.
    A plan that does not fit runs past the capacity mark ``|``, into the reserve or past the device's end ``‖``."""
    scale = max(memory.device_memory_gib, memory.total)
    cells, used = [], 0.0
    terms = memory_terms(memory)
    for term, gib in terms.items():
        used += gib
        cells += BAR_FILLS[term] * (round(used / scale * width) - len(cells))
    capacity = round(memory.capacity / scale * width)
    device = round(memory.device_memory_gib / scale * width)
    cells += [" "] * max(0, capacity - len(cells)) + ["·"] * max(0, device - max(capacity, len(cells)))
    legend = "  ".join(f"{BAR_FILLS[term]} {term}" for term in terms) + "  · reserve  | capacity"
    if device < len(cells):  # past the device's memory: mark where it ends
        cells.insert(device, "‖")
        legend += "  ‖ device memory"
    cells.insert(capacity, "|")
    return ["[" + "".join(cells) + "]", legend]


def render_table(plan: Plan) -> str:
    """The plan as a fixed-width text table."""
    m = plan.memory
    per_chip = plan.world_size // plan.accelerators
    ranks = f" ({plan.world_size} ranks, one per logical NeuronCore)" if per_chip > 1 else ""
    rows: list[tuple[str, str]] = [
        ("configuration", f"{plan.config_name} ({plan.region})"),
        ("profile", plan.profile),
        ("compute", f"{plan.nodes} x {plan.instance_type} = {plan.accelerators} x {plan.accelerator}{ranks}"),
        ("stack", plan.stack),
        (
            "parameters",
            f"{plan.total_parameters / 1e9:.2f}B total, {plan.active_parameters / 1e9:.2f}B active, "
            f"vocabulary {plan.vocab_size}",
        ),
        ("layout", m.layout.describe()),
        ("", ""),
        ("memory per device" if per_chip == 1 else "memory per NeuronCore", "GiB"),
        ("  parameters", f"{m.parameters:8.1f}   ({m.parameters_per_device / 1e9:.2f}B {m.precision})"),
        ("  gradients", f"{m.gradients:8.1f}   (fp32 buffers)"),
        (
            "  optimizer",
            f"{m.optimizer:8.1f}   ({'fp32 main weights, ' if m.precision == 'bf16' else ''}Adam m and v"
            f"{', sharded by the distributed optimizer' if m.distributed_optimizer else ''})",
        ),
        (
            "  activations",
            f"{m.activations:8.1f}   ({m.attention} attention, recompute "
            f"{', '.join(m.recompute) or 'none'}, incl. logits)",
        ),
        (
            "  optimizer step",
            f"{m.optimizer_step:8.1f}   (torch's Adam without Transformer Engine: a temporary, after the activations "
            "are freed; the total counts the larger)",
        )
        if m.optimizer_step
        else None,
        ("  total", f"{m.total:8.1f}"),
        ("  capacity", f"{m.capacity:8.1f}   ({m.device_memory_gib:.1f} GiB less {m.reserve_fraction:.0%} reserve)"),
        ("  fits", "yes" if m.fits else "NO"),
        (
            "  per chip",
            f"{m.total * per_chip:8.1f}   of {m.device_memory_gib * per_chip:.1f} GiB ({per_chip} NeuronCores' shares)",
        )
        if per_chip > 1
        else None,
        *zip(("", ""), memory_bar(m)),
        (
            "checkpoint",
            f"{m.checkpoint_gb:,.0f} GB, about {plan.checkpoint_save_s / 60:,.1f} min a save at "
            f"{plan.storage_throughput_mb_s:,.0f} MB/s (FSx)",
        ),
        ("", ""),
        ("cluster cost", f"{_money(plan.cost_per_hour_usd)} per hour (all groups, every node running)"),
        *(("  price", _price_line(price)) for price in plan.prices),
        ("throughput", f"{plan.tokens_per_second:,.0f} tokens/s at {plan.mfu:.0%} MFU"),
        ("cost per 1B tokens", _money(plan.cost_per_billion_tokens_usd)),
        ("run", f"{plan.run_tokens / 1e9:,.2f}B tokens, about {plan.estimated_run_hours:,.1f} h"),
        ("", ""),
        ("recommendation", plan.recommendation),
        *(("  -", reason) for reason in plan.reasons),
        *((("notes", ""),) if plan.notes else ()),
        *(("  -", note) for note in plan.notes),
    ]
    rows = [row for row in rows if row]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows) + "\n"


def to_json(plan: Plan) -> dict:
    """The plan as JSON-ready data."""
    m = plan.memory
    return {
        "config": plan.config_name,
        "region": plan.region,
        "profile": plan.profile,
        "instance_type": plan.instance_type,
        "nodes": plan.nodes,
        "world_size": plan.world_size,
        "accelerators": plan.accelerators,
        "stack": plan.stack,
        "accelerator": plan.accelerator,
        "vocab_size": plan.vocab_size,
        "parameters": {
            "total": plan.total_parameters,
            "active": plan.active_parameters,
            "per_device": m.parameters_per_device,
        },
        "layout": {
            "tensor": m.layout.tensor,
            "pipeline": m.layout.pipeline,
            "virtual_pipeline": m.layout.virtual_pipeline,
            "expert": m.layout.expert,
            "expert_tensor": m.layout.expert_tensor,
            "data": m.layout.data,
            "expert_data": m.layout.expert_data,
        },
        "memory_gib": {
            "parameters": m.parameters,
            "gradients": m.gradients,
            "optimizer": m.optimizer,
            "activations": m.activations,
            "optimizer_step": m.optimizer_step,
            "total": m.total,
            "capacity": m.capacity,
            "fits": m.fits,
            "precision": m.precision,
            "distributed_optimizer": m.distributed_optimizer,
            "attention": m.attention,
            "recompute": list(m.recompute),
        },
        "checkpoint": {
            "size_gb": m.checkpoint_gb,
            "save_s": plan.checkpoint_save_s,
            "stop_s": plan.stop_s,
            "storage_throughput_mb_s": plan.storage_throughput_mb_s,
        },
        "cost_per_hour_usd": plan.cost_per_hour_usd,
        "prices": [
            {
                "instance_type": price.instance_type,
                "region": price.region,
                "capacity": price.capacity.value,
                "usd_per_hour": price.usd_per_hour,
                "source": price.source,
                "retrieved": price.retrieved,
                "confirmed": price.confirmed,
            }
            for price in plan.prices
        ],
        "mfu": plan.mfu,
        "tokens_per_second": plan.tokens_per_second,
        "cost_per_billion_tokens_usd": plan.cost_per_billion_tokens_usd,
        "run_tokens": plan.run_tokens,
        "estimated_run_hours": plan.estimated_run_hours,
        "recommendation": {"orchestrator": plan.recommendation, "reasons": list(plan.reasons)},
        "notes": list(plan.notes),
        "problems": [str(found) for found in plan.problems],
    }
