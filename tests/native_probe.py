"""The native spec's two modules against the megatron modules they stand in for (a script, not a test file).

Run as ``python tests/native_probe.py CONFIG [KEY=VALUE ...]``. In one process it builds the model of CONFIG, with
the overrides, under the native spec as the trainer does, takes the first layer's ``NativeCoreAttention`` and
``NativeExperts``, and runs each on the same random inputs twice: through its own forward, and through the forward
of the megatron class it subclasses (``DotProductAttention``, ``SequentialMLP``) on the same weights. It does so in
float32 and in bfloat16, backward too. It also builds the trainer's optimizer and steps it once. It prints one JSON
line: per case, the largest difference of the outputs and of the input and weight gradients, each with the
reference's largest magnitude, and how many grouped GEMMs ran; and the optimizer's fused flags and kernel calls.
"""

from __future__ import annotations

import json
import sys

import torch

from moe_cdk.training.step import _megatron

_megatron.import_core()  # as moe-train does, before the model code imports megatron-core

from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402

from moe_cdk.training.config import load_train_config  # noqa: E402
from moe_cdk.training.launch_env import detect  # noqa: E402
from moe_cdk.training.step import cpu_compat, trainer  # noqa: E402
from moe_cdk.training.step.model import build_model  # noqa: E402
from moe_cdk.training.step.native import NativeCoreAttention, NativeExperts  # noqa: E402

VOCAB = 257  # the byte tokenizer
TOKENS_PER_EXPERT = [5, 0, 9, 4]  # one expert gets no token


def compare(run, inputs: list[torch.Tensor], weights: list[torch.Tensor]) -> dict:
    """``run(native: bool)`` on fresh copies of ``inputs``: the worst difference between the two paths' outputs and
    gradients, and the reference path's scale for each."""
    results = {}
    for native in (True, False):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        for w in weights:
            w.grad = None
        out = run(native, *leaves)
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype))
        results[native] = [out, *(t.grad for t in leaves), *(w.grad for w in weights)]
    found = {}
    for name, got, want in zip(["output", *[f"input{i}" for i in range(len(inputs))], "weights"], *results.values()):
        found[name] = {
            "diff": (got.float() - want.float()).abs().max().item(),
            "scale": want.float().abs().max().item(),
        }
    return found


def optimizer_case(config, runtime) -> dict:
    """The trainer's torch AdamWs under the native spec: whether each group is fused, how many fused kernels one
    step of each runs, and whether the groups stay fused after loading a state whose groups are not."""
    trainable = trainer.build(config, runtime, VOCAB)
    optimizers = [w.optimizer for w in getattr(trainable.optimizer, "chained_optimizers", [trainable.optimizer])]
    calls, original = 0, torch._fused_adamw_

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    torch._fused_adamw_ = counted
    try:
        for inner in optimizers:
            for group in inner.param_groups:
                for p in group["params"]:
                    p.grad = torch.ones_like(p)
            inner.step()
    finally:
        torch._fused_adamw_ = original
    fused = [group["fused"] for inner in optimizers for group in inner.param_groups]
    for inner in optimizers:
        state = inner.state_dict()
        for group in state["param_groups"]:
            group.update(fused=None, foreach=None)  # as the local spec's optimizer saves them
        inner.load_state_dict(state)
    reloaded = [group["fused"] for inner in optimizers for group in inner.param_groups]
    return {"optimizers": len(optimizers), "fused": fused, "fused_kernels": calls, "fused_after_load": reloaded}


def main(argv: list[str]) -> None:
    config = load_train_config(argv[0], ["model.spec=native", *argv[1:]])
    env = detect()
    runtime = trainer.setup(config, env)
    grouped = 0
    original_grouped_mm = torch._grouped_mm

    def counted(*args, **kwargs):
        nonlocal grouped
        grouped += 1
        return original_grouped_mm(*args, **kwargs)

    torch._grouped_mm = counted
    report = {}
    try:
        [chunk] = build_model(config, VOCAB, on_gpu=False)
        layer = chunk.decoder.layers[0]
        attention = layer.self_attention.core_attention
        experts = layer.mlp.experts
        assert isinstance(attention, NativeCoreAttention) and isinstance(experts, NativeExperts)
        m = config.model
        s, b, heads, groups = m.seq_length, 2, m.num_attention_heads, m.num_query_groups or m.num_attention_heads
        qk_width = v_width = m.head_size
        if m.multi_latent_attention:  # query and key heads wider than the value heads
            qk_width, v_width = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        generator = torch.Generator().manual_seed(0)
        mask = trainer.causal_mask(s, torch.device("cpu"))
        counts = torch.tensor(TOKENS_PER_EXPERT)
        for dtype in (torch.float32, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            experts.to(dtype)
            attention.to(dtype)
            q = torch.randn(s, b, heads, qk_width, generator=generator).to(dtype)
            k = torch.randn(s, b, groups, qk_width, generator=generator).to(dtype)
            v = torch.randn(s, b, groups, v_width, generator=generator).to(dtype)

            def attend(native, q, k, v):
                forward = NativeCoreAttention.forward if native else DotProductAttention.forward
                return forward(attention, q, k, v, mask)

            with cpu_compat.cuda_factories_on_cpu():
                report[f"attention_{name}"] = compare(attend, [q, k, v], [])

            x = torch.randn(sum(TOKENS_PER_EXPERT), m.hidden_size, generator=generator).to(dtype)
            probs = torch.rand(sum(TOKENS_PER_EXPERT), generator=generator).to(dtype)
            fc1 = experts.local_experts[2].linear_fc1.weight

            def expert_run(native, x, probs):
                forward = NativeExperts.forward if native else SequentialMLP.forward
                return forward(experts, x, counts, probs)[0]

            before = grouped
            report[f"experts_{name}"] = compare(expert_run, [x, probs], [fc1])
            report[f"experts_{name}"]["grouped_gemms"] = grouped - before
        report["optimizer"] = optimizer_case(config, runtime)
    finally:
        torch._grouped_mm = original_grouped_mm
        trainer.teardown()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
