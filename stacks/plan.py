"""``moe-cdk plan``: will the training profile fit the cluster, what will it cost, and where to run it.

Everything here is arithmetic on the two configurations and the instance catalog: no CDK
constructs are built and nothing is deployed. The parameter counts and FLOPs come from
``moe_cdk.training.model`` (imported lazily; it pulls in torch, a few seconds).

Memory model (per device, GiB = 2**30 bytes). moe-train keeps fp32 parameters and fp32
AdamW state with bf16 autocast, and shards no optimizer state (no ZeRO), so every
parameter a device holds costs

    4 bytes (fp32 weight) + 4 bytes (fp32 gradient) + 8 bytes (Adam first and second moments) = 16 bytes.

Dense parameters (attention, router, norms, embeddings) are split by tensor parallel only;
expert parameters by expert parallel x tensor parallel (megatron's expert tensor-parallel
size is the tensor-parallel size). Pipeline parallel is always 1. Activations are sized in
``memory_per_device``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

# stacks.config imports CDK constructs; jsii prints a Node banner unless this is set first.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from moe_cdk.constructs import instance_catalog  # noqa: E402
from moe_cdk.constructs.instance_catalog import AcceleratorKind  # noqa: E402
from moe_cdk.stacks.config import REPO_ROOT, Config, NodeRole, Orchestrator, load_config  # noqa: E402
from moe_cdk.training.config import TrainConfig, load_train_config  # noqa: E402
from moe_cdk.training.parallel import plan_layout  # noqa: E402
from moe_cdk.training.schema import ConfigError, report_problems  # noqa: E402

GIB = 2**30
PRICES_PATH = Path(__file__).resolve().parent / "prices.yaml"

# Bytes per parameter a device holds: fp32 weight + fp32 gradient + fp32 Adam m and v.
WEIGHT_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES = 4, 4, 8

DEFAULT_RESERVE = 0.10
"""Share of device memory kept back for the CUDA context, NCCL buffers, the caching
allocator's fragmentation and temporaries the formula does not count."""

DEFAULT_MFU = 0.35
"""Model FLOPs utilisation assumed for throughput: a typical figure for a well-tuned MoE
run with megatron-core on H100-class GPUs; an estimate, not a measurement."""

BYTE_TOKENIZER_VOCAB = 257  # 256 byte values + end-of-document (training/data.py ByteTokenizer)
ASSUMED_VOCAB = 32000  # Mixtral/Llama-2 size, used when the tokenizer.json is not on this machine

# Dense (no sparsity) BF16 tensor-core peak per device, TFLOP/s:
# - H100 SXM and H200 SXM: 989 (NVIDIA H100 Tensor Core GPU datasheet and NVIDIA H200
#   datasheet list 1,979 TFLOPS BF16 "with sparsity"; dense is half).
# - A100 SXM: 312 (NVIDIA A100 Tensor Core GPU datasheet, BF16 312 TFLOPS dense, 624 with sparsity).
# - Trainium2: 667 (AWS Trainium2 / Amazon EC2 Trn2 product page: 667 TFLOPS dense BF16 per chip).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "Trainium2": 667.0}

TRAINING_JOB_MAX_HOURS = 24.0  # prototypes and short runs: under a day...
TRAINING_JOB_MAX_NODES = 4  # ...on a few nodes
TRAINING_JOB_LIMIT_HOURS = 28 * 24  # SageMaker Training Jobs: MaxRuntimeInSeconds is at most 28 days


class PlanError(ValueError):
    """The training profile cannot run on the cluster. ``problems`` holds one ``key: message`` line each."""

    def __init__(self, problems: list[str], plan: Plan | None = None):
        self.problems = problems
        self.plan = plan
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory per device, in GiB, and the parallel layout it was sized for."""

    tensor: int
    pipeline: int
    expert: int
    data: int
    parameters: float
    """fp32 weights this device holds."""
    gradients: float
    """fp32 gradients of those weights."""
    optimizer: float
    """AdamW first and second moments (fp32)."""
    activations: float
    """Activations kept for the backward pass, plus the fp32 logits."""
    total: float
    capacity: float
    """Device memory less the reserve."""
    fits: bool
    parameters_per_device: int = 0
    """Parameter count this device holds."""
    device_memory_gib: float = 0.0
    reserve_fraction: float = DEFAULT_RESERVE


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
    """Accelerators across those nodes: one training process each."""
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
    recommendation: str
    """training-job, slurm or eks."""
    reasons: tuple[str, ...]
    notes: tuple[str, ...]


# ---------------------------------------------------------------------------------- memory


def _model():
    # Lazy: moe_cdk.training.model imports torch at module level.
    from moe_cdk.training import model

    return model


def activation_bytes_per_layer(train: TrainConfig) -> float:
    """Activations one transformer layer keeps for the backward pass, per device, in bytes.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models" (arXiv:2205.05198), section 4: with 16-bit activations and no recomputation a
    GPT layer stores ``s*b*h*(34 + 5*a*s/h)`` bytes (s sequence length, b micro-batch, h
    hidden size, a attention heads), made of

    - attention, ``11*s*b*h + 5*a*s^2*b``: the QKV input (2sbh), Q and K (4sbh), the
      softmax output (2as^2b) and its dropout mask (as^2b), the scores' dropout output
      (2as^2b), V (2sbh), the output-projection input (2sbh) and its dropout mask (sbh);
    - MLP, ``19*s*b*h`` for an h -> 4h -> h MLP: its input (2sbh), the activation
      function's input (8sbh), the second linear's input (8sbh) and a dropout mask (sbh);
    - two layer norms, ``4*s*b*h`` (their inputs).

    With tensor parallel t and sequence parallelism (megatron turns it on for MoE whenever
    t > 1) every term is divided by t (the paper's Table 2, ``s*b*h/t * (34 + 5*a*s/h)``).

    For the MoE layer the dense MLP term is scaled by how much expert MLP each token runs:
    ``19*s*b*h * top_k * ffn/(4h)`` -- each token is processed by top_k experts of width
    ffn instead of one MLP of width 4h. Expert parallelism does not divide it: after the
    all-to-all each expert-parallel rank holds, on balanced routing, as many routed tokens
    as it sent. Not counted (small next to the above): router logits and probabilities
    (s*b*experts), token-permutation buffers and the SwiGLU gate's extra input. The
    scores term 5*a*s^2*b is kept because moe-train uses megatron's local (unfused)
    attention, which materialises the s x s scores.

    So, per layer: ``s*b*h/t * (15 + 19*top_k*ffn/(4h) + 5*a*s/h)`` bytes.
    """
    m, moe, t = train.model, train.moe, train.parallel.tensor
    s, b, h, a = m.seq_length, train.optim.micro_batch_size, m.hidden_size, m.num_attention_heads
    attention_and_norms = 11 + 4
    mlp = 19 * moe.top_k * m.ffn_hidden_size / (4 * h)
    scores = 5 * a * s / h
    return s * b * h * (attention_and_norms + mlp + scores) / t


def memory_per_device(train: TrainConfig, *, world_size: int, vocab_size: int, device_memory_gib: float,
                      reserve_fraction: float = DEFAULT_RESERVE) -> MemoryEstimate:
    """Memory one device needs to train ``train`` on ``world_size`` devices of ``device_memory_gib`` each.

    - parameters: ``dense/TP + expert/(EP*ETP)`` parameters, where expert = layers x
      experts x 3 x hidden x ffn and dense = total - expert (``parameter_counts``, with the
      vocabulary padded as the trainer does); x4 bytes weights, x4 gradients, x8 Adam.
    - activations: ``activation_bytes_per_layer`` x layers x micro-batches in flight (1:
      one pipeline stage holds one micro-batch's activations at a time), plus the logits
      of the loss, ``s*b*padded_vocab*4 / TP`` bytes (fp32 for the cross entropy).
    - capacity: ``device_memory_gib * (1 - reserve_fraction)``.

    Raises ``PlanError`` when the parallel layout does not fit ``world_size``.
    """
    try:
        data = plan_layout(train, world_size).data
    except ConfigError as error:
        raise PlanError([f"training.profile: {line}" for line in error.errors]) from None
    model = _model()
    p, m = train.parallel, train.model
    counts = model.parameter_counts(train, vocab_size)
    expert = counts.expert
    dense = counts.total - expert
    per_device = dense / p.tensor + expert / (p.expert * p.expert_tensor_size)
    in_flight = 1  # pipeline parallel is 1
    padded_vocab = model.padded_vocab_size(vocab_size)
    logits = m.seq_length * train.optim.micro_batch_size * padded_vocab * 4 / p.tensor
    activations = (activation_bytes_per_layer(train) * m.num_layers * in_flight + logits) / GIB
    parameters = per_device * WEIGHT_BYTES / GIB
    gradients = per_device * GRADIENT_BYTES / GIB
    optimizer = per_device * OPTIMIZER_BYTES / GIB
    total = parameters + gradients + optimizer + activations
    capacity = device_memory_gib * (1 - reserve_fraction)
    return MemoryEstimate(
        tensor=p.tensor, pipeline=p.pipeline, expert=p.expert, data=data,
        parameters=parameters, gradients=gradients, optimizer=optimizer, activations=activations,
        total=total, capacity=capacity, fits=total <= capacity,
        parameters_per_device=round(per_device), device_memory_gib=float(device_memory_gib),
        reserve_fraction=reserve_fraction,
    )


# ---------------------------------------------------------------------------------- prices


@lru_cache(maxsize=4)
def _load_prices(path: str) -> dict[tuple[str, str], float]:
    data = yaml.safe_load(Path(path).read_text())
    return {(e["instance_type"], e["region"]): float(e["usd_per_hour"]) for e in data["prices"]}


def load_prices(path: str | Path = PRICES_PATH) -> dict[tuple[str, str], float]:
    """``{(instance type, region): USD per hour}`` from prices.yaml."""
    return dict(_load_prices(str(path)))


def _ml_name(instance_type: str) -> str:
    spec = instance_catalog.lookup(instance_type)
    return spec.sagemaker_name if spec else instance_type


def cluster_cost_per_hour(config: Config, prices: dict[tuple[str, str], float]) -> tuple[float | None, list[str]]:
    """Sum of instance_count x hourly price over every group; None and the missing ones when a price is unknown."""
    total, missing = 0.0, []
    for group in config.cluster.instance_groups:
        price = prices.get((_ml_name(group.instance_type), config.region))
        if price is None:
            missing.append(f"no price for {_ml_name(group.instance_type)} in {config.region} (stacks/prices.yaml); "
                           "cost not estimated")
        else:
            total += group.instance_count * price
    return (None if missing else total), missing


# ---------------------------------------------------------------------------------- plan


def _vocab_size(train: TrainConfig, notes: list[str]) -> int:
    tokenizer = train.data.tokenizer
    if tokenizer == "byte":
        return BYTE_TOKENIZER_VOCAB
    path = Path(tokenizer)
    if not path.is_absolute():
        path = REPO_ROOT / path
    if path.is_file():
        from moe_cdk.training.data import load_tokenizer

        return load_tokenizer(str(path)).vocab_size
    notes.append(f"tokenizer {tokenizer} is not on this machine: assumed a {ASSUMED_VOCAB}-token vocabulary")
    return ASSUMED_VOCAB


def _recommend(config: Config, run_hours: float, nodes: int) -> tuple[str, list[str]]:
    length = f"estimated run {run_hours:,.1f} h on {nodes} node(s)"
    if config.cluster.orchestrator is Orchestrator.EKS:
        return "eks", ["the configuration's orchestrator is eks: Kubernetes pipelines run on HyperPod EKS",
                       length, "HyperPod replaces faulty nodes and resumes the job"]
    if run_hours < TRAINING_JOB_MAX_HOURS and nodes <= TRAINING_JOB_MAX_NODES:
        return "training-job", [f"{length}: under {TRAINING_JOB_MAX_HOURS:.0f} h on at most {TRAINING_JOB_MAX_NODES} nodes",
                                "a short run or prototype: Training Jobs bill only while the job runs, no standing cluster"]
    reasons = [length]
    if run_hours >= TRAINING_JOB_LIMIT_HOURS:
        reasons.append(f"longer than the {TRAINING_JOB_LIMIT_HOURS // 24}-day Training Jobs limit")
    if run_hours >= TRAINING_JOB_MAX_HOURS:
        reasons.append(f"over {TRAINING_JOB_MAX_HOURS:.0f} h: needs automatic resume from checkpoints (HyperPod auto-resume)")
    if nodes > TRAINING_JOB_MAX_NODES:
        reasons.append(f"more than {TRAINING_JOB_MAX_NODES} nodes: a persistent cluster with health checks and node replacement")
    return "slurm", reasons


def plan(config: Config, *, train_config_path: str | None = None, mfu: float = DEFAULT_MFU,
         train_overrides: Sequence[str] = (), prices_path: str | Path = PRICES_PATH,
         reserve_fraction: float = DEFAULT_RESERVE) -> Plan:
    """Size ``config``'s training profile (or ``train_config_path``) on its compute groups.

    Raises ``PlanError`` when the profile cannot be read, its layout does not fit the world
    size, or it does not fit in device memory (``.plan`` then holds the sized plan).
    """
    if not 0 < mfu <= 1:
        raise PlanError([f"--mfu: model FLOPs utilisation out of range (got {mfu!r}; allowed 0 < mfu <= 1)"])
    notes: list[str] = []
    profile = train_config_path or config.training.profile
    path = Path(train_config_path) if train_config_path else config.training.path
    try:
        train = load_train_config(path, train_overrides)
    except ConfigError as error:
        raise PlanError([f"training.profile: {line}" for line in error.errors]) from None

    groups = []
    for group in config.cluster.instance_groups:
        spec = instance_catalog.lookup(group.instance_type)
        if group.role is NodeRole.COMPUTE and spec is not None and spec.is_accelerated:
            groups.append((group, spec))
    if not groups:
        raise PlanError(["cluster.instance_groups: no compute group with accelerators "
                         "(got only CPU instance types; allowed at least one GPU or Trainium compute group)"])
    nodes = sum(g.instance_count for g, _ in groups)
    world_size = sum(g.instance_count * s.accelerator_count for g, s in groups)
    # Mixed groups: the smallest device bounds the memory, the slowest one the step time.
    device_memory = min(s.accelerator_memory_gib for _, s in groups)
    models = sorted({s.accelerator_model for _, s in groups})
    peak = min(PEAK_BF16_TFLOPS.get(mdl, 0.0) for mdl in models)
    if len(groups) > 1:
        notes.append(f"{len(groups)} compute groups pooled into one world of {world_size} devices")
    if any(s.accelerator_kind is AcceleratorKind.TRAINIUM for _, s in groups):
        notes.append("moe-train runs on NVIDIA GPUs (CUDA); Trainium figures are indicative only")

    vocab = _vocab_size(train, notes)
    memory = memory_per_device(train, world_size=world_size, vocab_size=vocab,
                               device_memory_gib=device_memory, reserve_fraction=reserve_fraction)
    model = _model()
    counts = model.parameter_counts(train, vocab)
    flops = model.flops_per_token(train, vocab)
    tokens_per_second = mfu * peak * 1e12 * world_size / flops
    run_tokens = train.max_steps * train.optim.global_batch_size * train.model.seq_length
    run_hours = run_tokens / tokens_per_second / 3600 if tokens_per_second else float("inf")

    cost, missing = cluster_cost_per_hour(config, load_prices(prices_path))
    notes.extend(missing)
    per_billion = cost / (tokens_per_second * 3600) * 1e9 if cost is not None and tokens_per_second else None
    recommendation, reasons = _recommend(config, run_hours, nodes)

    result = Plan(
        config_name=config.name, region=config.region, profile=str(profile), instance_type=groups[0][0].instance_type,
        nodes=nodes, world_size=world_size, accelerator="/".join(models), vocab_size=vocab,
        total_parameters=counts.total, active_parameters=counts.active, memory=memory,
        cost_per_hour_usd=cost, mfu=mfu, tokens_per_second=tokens_per_second,
        cost_per_billion_tokens_usd=per_billion, run_tokens=run_tokens, estimated_run_hours=run_hours,
        recommendation=recommendation, reasons=tuple(reasons), notes=tuple(notes),
    )
    if not memory.fits:
        raise PlanError([
            f"training.profile: {profile} does not fit in device memory "
            f"(got {memory.total:.1f} GiB per device; allowed at most {memory.capacity:.1f} GiB per device: "
            f"{device_memory:g} GiB {'/'.join(models)} less {reserve_fraction:.0%} reserve)"
        ], result)
    return result


# ---------------------------------------------------------------------------------- output


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def render_table(plan: Plan) -> str:
    """The plan as a fixed-width text table."""
    m = plan.memory
    rows: list[tuple[str, str]] = [
        ("configuration", f"{plan.config_name} ({plan.region})"),
        ("profile", plan.profile),
        ("compute", f"{plan.nodes} x {plan.instance_type} = {plan.world_size} x {plan.accelerator}"),
        ("parameters", f"{plan.total_parameters / 1e9:.2f}B total, {plan.active_parameters / 1e9:.2f}B active, "
                       f"vocabulary {plan.vocab_size}"),
        ("layout", f"tensor {m.tensor} x pipeline {m.pipeline} x expert {m.expert}, data {m.data}"),
        ("", ""),
        ("memory per device", "GiB"),
        ("  parameters", f"{m.parameters:8.1f}   ({m.parameters_per_device / 1e9:.2f}B fp32)"),
        ("  gradients", f"{m.gradients:8.1f}"),
        ("  optimizer", f"{m.optimizer:8.1f}   (AdamW m and v, fp32)"),
        ("  activations", f"{m.activations:8.1f}   (no recomputation, incl. logits)"),
        ("  total", f"{m.total:8.1f}"),
        ("  capacity", f"{m.capacity:8.1f}   ({m.device_memory_gib:g} GiB less {m.reserve_fraction:.0%} reserve)"),
        ("  fits", "yes" if m.fits else "NO"),
        ("", ""),
        ("cluster cost", f"{_money(plan.cost_per_hour_usd)} per hour (all groups, on-demand)"),
        ("throughput", f"{plan.tokens_per_second:,.0f} tokens/s at {plan.mfu:.0%} MFU"),
        ("cost per 1B tokens", _money(plan.cost_per_billion_tokens_usd)),
        ("run", f"{plan.run_tokens / 1e9:,.2f}B tokens, about {plan.estimated_run_hours:,.1f} h"),
        ("", ""),
        ("recommendation", plan.recommendation),
        *(("  -", reason) for reason in plan.reasons),
        *((("notes", ""),) if plan.notes else ()),
        *(("  -", note) for note in plan.notes),
    ]
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
        "accelerator": plan.accelerator,
        "vocab_size": plan.vocab_size,
        "parameters": {"total": plan.total_parameters, "active": plan.active_parameters,
                       "per_device": m.parameters_per_device},
        "layout": {"tensor": m.tensor, "pipeline": m.pipeline, "expert": m.expert, "data": m.data},
        "memory_gib": {"parameters": m.parameters, "gradients": m.gradients, "optimizer": m.optimizer,
                       "activations": m.activations, "total": m.total, "capacity": m.capacity, "fits": m.fits},
        "cost_per_hour_usd": plan.cost_per_hour_usd,
        "mfu": plan.mfu,
        "tokens_per_second": plan.tokens_per_second,
        "cost_per_billion_tokens_usd": plan.cost_per_billion_tokens_usd,
        "run_tokens": plan.run_tokens,
        "estimated_run_hours": plan.estimated_run_hours,
        "recommendation": {"orchestrator": plan.recommendation, "reasons": list(plan.reasons)},
        "notes": list(plan.notes),
    }


# ---------------------------------------------------------------------------------- CLI


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 when it fits, 2 (problems on stderr) when the configuration is invalid or does not fit."""
    try:
        config = load_config(args.config)
    except ConfigError as error:
        return report_problems(args.config, error.errors)
    try:
        result = plan(config, train_config_path=args.train_config, mfu=args.mfu, train_overrides=tuple(args.set or ()))
    except PlanError as error:
        return report_problems(args.config, error.problems)
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        sys.stdout.write(render_table(result))
    return 0


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register ``plan`` on an argparse subparsers object."""
    parser = subcommands.add_parser(
        "plan", help="size the training profile on the cluster: memory, cost, throughput, orchestrator; exit 2 if it does not fit")
    parser.add_argument("--config", required=True, help="infrastructure YAML, e.g. config/default.yaml")
    parser.add_argument("--train-config", help="trainer YAML (default: the configuration's training.profile)")
    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                        help=f"model FLOPs utilisation assumed for throughput (default: {DEFAULT_MFU})")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a trainer key, e.g. parallel.tensor=4 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)
    return parser
