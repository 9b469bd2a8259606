"""What moe-cdk renders for NxD Training, read the way NxD Training reads it.

Each shipped Trainium configuration (config/*trn2*.yaml) and each Trainium profile (training/configs/*trn2*.yaml) is
rendered, written as YAML, loaded with OmegaConf at the version the Neuron training image pins (``omegaconf>=2.2,<2.3``:
2.2.3, the newest 2.2 on PyPI), and put through every read in ``READS``. Each read names the NxD Training file and line
that makes it (aws-neuron/neuronx-distributed-training at 9169aa0, Neuron SDK 2.26.0), how it reads the key (``get``
with a default, or attribute access, which Hydra's struct mode refuses for a missing key) and what it does with the
value (iterates, computes, compares, tests it, hands it to ``os.environ``). A stored ``null`` where NxD Training
iterates, or a string where it computes, fails here as it would fail there.

Not covered: NeMo's and PyTorch Lightning's own reads below these calls (``exp_manager``'s structured-config merge,
NeMo's scheduler), which cannot be installed here; the reads of keys moe-cdk does not render are made with their
defaults, as NxD Training makes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from moe_cdk.jobs.neuron_job import neuron_run
from moe_cdk.jobs.nxdt import render_nxdt_config
from moe_cdk.jobs.profile import load_job_profile
from moe_cdk.schema.config import load_config
from moe_cdk.training.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]

# The files, at 9169aa0. examples/ holds the entry point; the rest is under src/neuronx_distributed_training/.
ORCH = "examples/training_orchestrator.py"
TRAIN = "examples/training.py"
LM = "src/neuronx_distributed_training/lightning_modules"
MBASE = f"{LM}/model/megatron/megatron_base_model.py"
MGPT = f"{LM}/model/megatron/megatron_gpt_model.py"
BASE = f"{LM}/model/base.py"
DATA = f"{LM}/data/megatron/data_module.py"
DBASE = f"{LM}/data/base.py"
NLP = f"{LM}/nlp_overrides.py"
TRANSFORMER = "src/neuronx_distributed_training/models/megatron/transformer.py"
EXP = "src/neuronx_distributed_training/utils/exp_manager.py"

MISSING = object()


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Use:
    """What NxD Training does with a value, as a check of it."""

    name: str
    ok: Callable[[object], bool]


ITERATE = Use("iterates it", lambda v: isinstance(v, ListConfig))
COMPUTE = Use("computes with it", _number)
INTEGER = Use("uses it as an integer (//, %, range, ==)", _integer)
TEST = Use("tests it (if / is True)", lambda v: isinstance(v, bool))
ENVIRON = Use("puts it in os.environ", lambda v: isinstance(v, str))
MAPPING = Use("reads keys under it", lambda v: isinstance(v, DictConfig))
OPTIONAL_STR = Use("a path or null", lambda v: v is None or isinstance(v, str))
OPTIONAL_INT = Use("an integer or null (mapped to 1)", lambda v: v is None or _integer(v))
FALSY = Use("raises if it is set", lambda v: not v)
TRUTHY = Use("raises unless it is set", lambda v: bool(v))
ANY = Use("reads it", lambda v: True)


def one_of(*values: object) -> Use:
    return Use(f"compares it with {values}", lambda v: v in values)


@dataclass(frozen=True)
class Read:
    key: str
    """Dotted, from the configuration's root."""
    where: str
    """File:line at 9169aa0."""
    use: Use
    default: object = MISSING
    """The default of a ``.get(key, default)``; MISSING for attribute access (the key must be there)."""


READS: tuple[Read, ...] = (
    # training_orchestrator.py, process_config: what becomes the environment, and the MoE checks.
    Read("distributed_strategy.virtual_pipeline_model_parallel_size", f"{ORCH}:31", OPTIONAL_INT, 1),
    Read("model.fusions.softmax", f"{ORCH}:35", TEST, None),
    Read("neuron_experimental_compress_rg", f"{ORCH}:37", TEST),
    Read("aync_exec_max_inflight_requests", f"{ORCH}:41", INTEGER),
    Read("bucket_size_collectives", f"{ORCH}:42", INTEGER),
    Read("compiler_cache_url", f"{ORCH}:43", ENVIRON),
    Read("compiler_flags", f"{ORCH}:44", ENVIRON),
    Read("neuron_rt_exec_timeout", f"{ORCH}:45", INTEGER),
    Read("model.moe.dropless", f"{ORCH}:62", TEST, False),
    Read("model.moe.capacity_factor", f"{ORCH}:63", COMPUTE),  # > 0.0 (line 93), <= 0.0 (line 99)
    Read("model.moe.glu_mlp", f"{ORCH}:65", TEST, True),
    Read("model_source", f"{ORCH}:67", one_of("megatron", "hf")),
    Read("model.activation", f"{ORCH}:84", one_of("silu", "swiglu")),  # dropless needs one of them
    Read(
        "precision.type",
        f"{ORCH}:104",
        one_of("bf16SR", "mixed_precision", "mixed_precision_SR", "fp32", "manual", "autocast"),
        None,
    ),
    # training.py: the checkpoint IO, the trainer's keyword arguments, the model source.
    Read("exp_manager.async_checkpointing", f"{TRAIN}:47", TEST, False),
    Read("model.weight_init_only", f"{TRAIN}:48", TEST, False),
    Read("exp_manager.resume_from_checkpoint", f"{TRAIN}:58", OPTIONAL_STR),
    Read("trainer", f"{TRAIN}:61", MAPPING),  # NLPTrainer(**cfg.trainer): see TRAINER_ARGUMENTS
    Read("exp_manager", f"{TRAIN}:63", MAPPING),
    Read("model_alignment_strategy", f"{TRAIN}:72", FALSY, False),
    # megatron_base_model.py: recompute and the configuration's own checks.
    Read(
        "model.optim.name",
        f"{MBASE}:49",
        Use("refuses distributed_fused_adam", lambda v: v != "distributed_fused_adam"),
        None,
    ),
    Read("model.activations_checkpoint_granularity", f"{MBASE}:58", one_of(None, "selective", "full"), None),
    Read("distributed_strategy.sequence_parallel", f"{MBASE}:76", TEST, False),
    Read("distributed_strategy.tensor_model_parallel_size", f"{MBASE}:76", INTEGER, 1),
    Read("distributed_strategy.zero1", f"{MBASE}:85", TRUTHY, None),
    Read("model.megatron_amp_o2", f"{MBASE}:88", FALSY, None),
    Read("model.gradient_accumulation_fusion", f"{MBASE}:93", FALSY, False),
    Read("model.use_emha", f"{MBASE}:96", FALSY, False),
    Read("model.num_layers", f"{MBASE}:101", INTEGER),
    Read("distributed_strategy.pipeline_model_parallel_size", f"{MBASE}:101", INTEGER),
    Read("model.activations_checkpoint_num_layers", f"{MBASE}:106", INTEGER, 1),
    Read("model.activations_checkpoint_method", f"{MBASE}:119", one_of(None, "uniform"), None),
    Read("model.bias_dropout_add_fusion", f"{MBASE}:121", FALSY, False),
    Read("model.bias_activation_fusion", f"{MBASE}:123", FALSY, False),
    Read("model.moe", f"{MBASE}:126", MAPPING, {}),
    Read("model.moe.moe_dropout", f"{MBASE}:127", FALSY, False),
    # megatron_gpt_model.py: the model's arguments.
    Read("model.save_logits", f"{MGPT}:72", TEST, False),
    Read("model.moe.num_experts", f"{MGPT}:81", INTEGER, 1),
    Read("model.moe.top_k", f"{MGPT}:82", INTEGER, 1),  # num_experts / top_k (line 143), top_k > 1 (line 146)
    Read("model.hidden_size", f"{MGPT}:85", INTEGER),
    Read("model.max_position_embeddings", f"{MGPT}:86", INTEGER),
    Read("model.num_attention_heads", f"{MGPT}:88", INTEGER),
    Read("model.apply_query_key_layer_scaling", f"{MGPT}:89", TEST, True),
    Read("model.kv_channels", f"{MGPT}:90", Use("an integer or null", lambda v: v is None or _integer(v)), None),
    Read("model.ffn_hidden_size", f"{MGPT}:91", INTEGER),
    Read("model.init_method_std", f"{MGPT}:94", COMPUTE, 0.02),
    Read("model.use_scaled_init_method", f"{MGPT}:95", TEST, True),
    Read("model.use_cpu_initialization", f"{MGPT}:98", TEST, False),
    Read("model.hidden_dropout", f"{MGPT}:99", COMPUTE, 0.1),
    Read("model.attention_dropout", f"{MGPT}:100", COMPUTE, 0.0),
    Read("model.ffn_dropout", f"{MGPT}:101", COMPUTE, 0.0),
    Read("model.normalization", f"{MGPT}:110", one_of("layernorm", "rmsnorm"), "layernorm"),
    Read("model.layernorm_epsilon", f"{MGPT}:111", COMPUTE, 1e-5),
    Read("model.share_embeddings_and_output_weights", f"{MGPT}:116", TEST, True),
    Read("model.position_embedding_type", f"{MGPT}:117", one_of("learned_absolute", "rope"), "learned_absolute"),
    Read("model.rotary_percentage", f"{MGPT}:118", COMPUTE, 1.0),
    # transformer.py's expert layer asserts swiglu, no bias and pre_ln (lines 419-421).
    Read("model.activation", f"{MGPT}:119 ({TRANSFORMER}:419)", one_of("swiglu"), "gelu"),
    Read("model.has_bias", f"{MGPT}:120 ({TRANSFORMER}:420)", one_of(False), True),
    Read("model.transformer_block_type", f"{MGPT}:121 ({TRANSFORMER}:421)", one_of("pre_ln"), "pre_ln"),
    Read("model.persist_layer_norm", f"{MGPT}:124", TEST, False),
    Read("model.position_freq_base", f"{MGPT}:129", COMPUTE, 10000),
    Read("model.num_kv_heads", f"{MGPT}:131", INTEGER, None),  # divided over the tensor ranks
    Read("distributed_strategy.expert_model_parallel_size", f"{MGPT}:133", INTEGER, 1),
    Read("distributed_strategy.token_shuffle_group_size", f"{MGPT}:134", INTEGER, 1),
    Read("model.moe.frequency", f"{MGPT}:137", INTEGER, 1),
    Read("model.moe.dropout", f"{MGPT}:138", COMPUTE, 0.0),
    # transformer.py builds RouterSinkhorn for sinkhorn and RouterTopK otherwise (lines 438-455).
    Read("model.moe.routing_algorithm", f"{MGPT}:141 ({TRANSFORMER}:438)", one_of("top_k", "sinkhorn"), "top_k"),
    Read("model.moe.capacity_factor", f"{MGPT}:143", COMPUTE, 1.0),
    Read("model.moe.output_router_logits", f"{MGPT}:144", TEST, False),
    Read("model.moe.router_aux_loss_coef", f"{MGPT}:145", COMPUTE, 0.0),
    Read("model.moe.normalize_top_k_affinities", f"{MGPT}:146", TEST, True),
    Read("model.do_layer_norm_weight_decay", f"{MGPT}:174", TEST, False),
    Read("data.micro_batch_size", f"{MGPT}:187", INTEGER),
    # base.py: the batch arithmetic, the NxD configuration, the optimizer and its schedule.
    Read("data.global_batch_size", f"{BASE}:57", INTEGER),
    Read("exp_manager.log_parameter_norm", f"{BASE}:66", TEST, False),
    Read("exp_manager.log_gradient_norm", f"{BASE}:67", TEST, False),
    Read("seed", f"{BASE}:90", INTEGER, None),
    Read("precision.master_weights", f"{BASE}:121", TEST, False),
    Read("precision.fp32_grad_acc", f"{BASE}:122", TEST, False),
    Read("exp_manager.checkpoint_callback_params.use_master_weights_in_ckpt", f"{BASE}:131", TEST, False),
    Read(
        "model.pipeline_cuts",
        f"{BASE}:148",
        Use("null or a list", lambda v: v is None or isinstance(v, ListConfig)),
        None,
    ),
    Read("model.encoder_seq_length", f"{BASE}:196", INTEGER, None),
    Read("model.optim", f"{BASE}:305", MAPPING),
    Read("model.optim.name", f"{BASE}:305", Use("looks it up by name", lambda v: isinstance(v, str))),
    Read("model.optim.sched", f"{BASE}:311", MAPPING),
    # NeMo's CosineAnnealing computes the decay from these and trainer.max_steps.
    Read("model.optim.sched.warmup_steps", f"{BASE}:311", INTEGER),
    Read("model.optim.sched.constant_steps", f"{BASE}:311", INTEGER),
    Read("model.optim.sched.min_lr", f"{BASE}:311", COMPUTE),
    Read("model.optim.lr", f"{BASE}:302", COMPUTE),
    Read("model.optim.weight_decay", f"{BASE}:302", COMPUTE),
    Read("model.optim.betas", f"{BASE}:302", ITERATE),
    Read("trainer.max_steps", f"{BASE}:309", INTEGER),
    # The data module.
    Read("data.tokenizer", f"{DATA}:28", MAPPING),
    Read("data.fine_tuning", f"{DATA}:37", FALSY, False),
    Read("data.validation_drop_last", f"{DATA}:64", TEST, True),
    Read("data.pad_samples_to_global_batch_size", f"{DATA}:68", TEST, False),
    Read("data.data_prefix", f"{DATA}:112", ITERATE),  # weight, prefix pairs: see test_data_prefix_pairs
    Read("data.data_impl", f"{DATA}:113", one_of("mmap", "lazy")),
    Read("data.splits_string", f"{DATA}:114", Use("a string", lambda v: isinstance(v, str))),
    Read("data.seq_length", f"{DATA}:116", INTEGER),
    Read("seed", f"{DATA}:117", INTEGER),
    Read("data.skip_warmup", f"{DATA}:118", TEST, True),
    Read("data.dataloader_type", f"{DATA}:140", one_of("single", "cyclic")),
    Read("data.num_workers", f"{DATA}:170", INTEGER),
    Read("model.make_vocab_size_divisible_by", f"{DBASE}:73", INTEGER, 128),
    # exp_manager: the keys it branches on.
    Read("exp_manager.explicit_log_dir", f"{EXP}:200", OPTIONAL_STR),
    Read("exp_manager.resume_if_exists", f"{EXP}:205", TEST),
    Read("exp_manager.resume_ignore_no_checkpoint", f"{EXP}:212", TEST),
    Read("exp_manager.create_checkpoint_callback", f"{EXP}:241", TEST),
    Read("exp_manager.checkpoint_callback_params", f"{EXP}:242", MAPPING),
    Read("exp_manager.log_local_rank_0_only", f"{EXP}:259", TEST),
    Read("exp_manager.create_tensorboard_logger", f"{EXP}:271", TEST),
    Read("trainer.lnc", f"{NLP}:935", INTEGER),
)

# NLPTrainer.__init__'s keyword arguments (nlp_overrides.py, lines 890-940): training.py passes cfg.trainer as
# **kwargs, so any other key is a TypeError.
TRAINER_ARGUMENTS = frozenset(
    "logger enable_checkpointing callbacks default_root_dir gradient_clip_val gradient_clip_algorithm num_nodes "
    "num_processes devices enable_progress_bar overfit_batches track_grad_norm check_val_every_n_epoch fast_dev_run "
    "accumulate_grad_batches max_epochs min_epochs max_steps min_steps max_time limit_train_batches limit_val_batches "
    "limit_test_batches limit_predict_batches val_check_interval log_every_n_steps accelerator strategy sync_batchnorm "
    "precision enable_model_summary num_sanity_val_steps profiler benchmark deterministic "
    "reload_dataloaders_every_n_epochs auto_lr_find detect_anomaly auto_scale_batch_size plugins move_metrics_to_cpu "
    "multiple_trainloader_mode inference_mode lnc sequential_move_factor barebones use_distributed_sampler".split()
)

# megatron_base_model.py, lines 60-63: under selective granularity each name is looked up in that module's
# namespace, which imports CoreAttention and NeuronSwitchMLP (line 21); any other name is skipped without a word.
RECOMPUTABLE = frozenset({"CoreAttention", "NeuronSwitchMLP"})


def _rendered_configs() -> dict[str, str]:
    """Every shipped Trainium configuration and profile, rendered: name -> NxD Training's YAML."""
    rendered = {}
    for path in sorted((ROOT / "config").glob("*trn2*.yaml")):
        config = load_config(path)
        rendered[f"config/{path.name}"] = neuron_run(config, load_job_profile(config, None, ())).config_text
    trn2 = load_config(ROOT / "config/trn2.yaml")
    group = trn2.cluster.compute_group(None)
    for path in sorted((ROOT / "training/configs").glob("*trn2*.yaml")):
        profile = load_train_config(path)
        nxdt = render_nxdt_config(
            profile, name=path.stem, nodes=group.instance_count, ranks_per_node=64, compile_cache="/fsx/cache"
        )
        rendered[f"training/configs/{path.name}"] = yaml.safe_dump(nxdt, sort_keys=False)
    return rendered


RENDERED = _rendered_configs()


@pytest.fixture(scope="module", params=sorted(RENDERED), ids=str)
def cfg(request, tmp_path_factory) -> DictConfig:
    """A rendered configuration as Hydra hands it to NxD Training: loaded by OmegaConf, struct mode on."""
    written = tmp_path_factory.mktemp("nxdt") / "config.yaml"
    written.write_text(RENDERED[request.param])
    loaded = OmegaConf.load(written)
    OmegaConf.set_struct(loaded, True)
    return loaded


def read(cfg: DictConfig, r: Read) -> object:
    """The value NxD Training gets: ``node.get(leaf, default)`` or ``node.leaf``."""
    *path, leaf = r.key.split(".")
    node = cfg
    for part in path:
        node = node[part] if r.default is MISSING else node.get(part, {})
    return getattr(node, leaf) if r.default is MISSING else node.get(leaf, r.default)


def test_the_shipped_trainium_configurations_and_profiles_are_all_read():
    assert {"config/trn2.yaml", "config/eks-trn2.yaml", "training/configs/mixtral-8x7b-trn2.yaml"} <= set(RENDERED)


def test_every_read_nxd_training_makes_gets_what_it_uses(cfg):
    wrong = {}
    for r in READS:
        try:
            value = read(cfg, r)
        except Exception as error:  # noqa: BLE001 - a read that raises is the finding
            wrong[f"{r.key} ({r.where})"] = f"{type(error).__name__}: {error}".splitlines()[0]
            continue
        if not r.use.ok(value):
            wrong[f"{r.key} ({r.where})"] = f"{value!r}: NxD Training {r.use.name}"
    assert wrong == {}


def test_selective_recompute_names_modules_nxd_training_recomputes(cfg):
    # megatron_base_model.py, lines 57-63: read with a default, iterated under selective granularity.
    granularity = cfg.model.get("activations_checkpoint_granularity", None)
    modules = cfg.model.get("activations_checkpoint_recompute", [])
    if granularity == "selective":
        assert isinstance(modules, ListConfig) and list(modules) and set(modules) <= RECOMPUTABLE


def test_trainer_keys_are_nlp_trainer_arguments(cfg):
    assert set(cfg.trainer) <= TRAINER_ARGUMENTS


def test_data_prefix_pairs_weights_with_paths(cfg):
    # NeMo's dataset builder reads data_prefix as weight, path, weight, path (data_module.py, line 112).
    prefix = list(cfg.data.data_prefix)
    assert len(prefix) % 2 == 0
    assert all(_number(w) for w in prefix[::2]) and all(isinstance(p, str) for p in prefix[1::2])


def test_the_router_activation_is_the_one_top_k_routing_uses(cfg):
    # transformer.py, lines 438-444: top_k routing builds RouterTopK without act_fn, so its default, softmax
    # (neuronx-distributed fecfe75, modules/moe/routing.py, line 171), is what trains; router_activation
    # reaches only RouterSinkhorn (line 451).
    if cfg.model.moe.get("routing_algorithm", "top_k") == "top_k":
        assert cfg.model.moe.get("router_activation", "sigmoid") == "softmax"


def test_a_stored_null_where_nxd_training_iterates_is_caught(tmp_path):
    # The check above can fail: the rendering before issue 41's fix stored null for the recompute list.
    written = tmp_path / "config.yaml"
    written.write_text(
        RENDERED["config/trn2.yaml"]
        .replace("- CoreAttention", "")
        .replace("activations_checkpoint_recompute:\n", "activations_checkpoint_recompute: null\n")
    )
    cfg = OmegaConf.load(written)
    assert cfg.model.get("activations_checkpoint_granularity") == "selective"
    with pytest.raises(TypeError, match="not iterable"):
        list(cfg.model.get("activations_checkpoint_recompute", []))


def test_a_string_where_nxd_training_computes_is_caught():
    cfg = OmegaConf.create({"model": {"moe": {"capacity_factor": "2.0"}}})
    r = next(r for r in READS if r.key == "model.moe.capacity_factor")
    assert not r.use.ok(read(cfg, r))
