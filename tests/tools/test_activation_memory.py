"""`moe-cdk plan`'s activation model against what the trainer's model really saves for the
backward pass on CPU (fp32, the local spec), for a few shapes and layouts: within 10%."""

from __future__ import annotations

import json
import subprocess

import pytest
from trainer_runs import ENV, ROOT, TINY, python

from moe_cdk.tools.plan import activation_bytes
from moe_cdk.training.config import load_train_config
from moe_cdk.training.step.parallel import plan_layout

PROBE = ROOT / "tests/activation_probe.py"

CASES = {
    "tiny": (1, []),
    "seq-128": (1, ["model.seq_length=128"]),
    "hidden-128": (1, ["model.hidden_size=128", "model.ffn_hidden_size=256"]),
    "gqa-2-groups": (1, ["model.num_query_groups=2"]),
    "micro-batch-2": (1, ["optim.micro_batch_size=2"]),
    "8-experts": (1, ["moe.num_experts=8"]),
    "dropout": (1, ["model.dropout=0.1"]),
    "recompute-core-attn": (1, ["recompute.granularity=selective", "recompute.modules=[core_attn]"]),
    "mla": (
        1,
        [
            "model.multi_latent_attention=true",
            "model.qk_layernorm=true",
            "model.kv_lora_rank=32",
            "model.qk_head_dim=24",
            "model.qk_pos_emb_head_dim=8",
            "model.v_head_dim=16",
        ],
    ),
    "mla-query-latent": (
        1,
        [
            "model.multi_latent_attention=true",
            "model.qk_layernorm=true",
            "model.q_lora_rank=48",
            "model.kv_lora_rank=32",
            "model.qk_head_dim=16",
            "model.qk_pos_emb_head_dim=8",
            "model.v_head_dim=32",
            "model.hidden_size=128",
            "model.ffn_hidden_size=256",
        ],
    ),
    "dense-first-layer": (1, ["model.num_layers=3", "model.dense_layers=1", "model.dense_ffn_hidden_size=256"]),
    "TP2-SP": (2, ["parallel.tensor=2"]),
    "EP2": (2, ["parallel.expert=2"]),
    "TP2-EP2-ETP1": (2, ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1"]),
}


@pytest.fixture(scope="module")
def measured() -> dict[str, int]:
    """Every case's saved bytes: the one-rank cases in one process, each two-rank case in two ranks of its own
    (tests/local_ranks.py; the same ranks cannot set up a second process group)."""
    runs = [(1, {name: overrides for name, (n, overrides) in CASES.items() if n == 1})]
    runs += [(n, {name: overrides}) for name, (n, overrides) in CASES.items() if n > 1]
    found = {}
    for nproc, cases in runs:
        done = subprocess.run(
            [*python(nproc), str(PROBE), str(TINY), json.dumps(cases)],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"case"')]
        found.update({line["case"]: line["saved_bytes"] for line in lines})
    assert set(found) == set(CASES)
    return found


@pytest.mark.parametrize("case", CASES)
def test_plan_activation_model_is_within_10_percent_of_the_saved_tensors(case, measured):
    nproc, overrides = CASES[case]
    train = load_train_config(TINY, overrides)
    planned = activation_bytes(
        train, plan_layout(train, nproc), vocab_size=257, bytes_per_element=4, fused_attention=False, on_gpu=False
    )
    saved = measured[case]
    assert abs(planned - saved) / saved <= 0.10, f"plan {planned:,.0f} bytes, saved {saved:,} bytes"
