"""Benchmark (a): megatron's MoE layer with the alltoall dispatcher against a naive loop over experts.

The naive reference is the Mixtral-style loop: route, then for each expert gather its
tokens, run its SwiGLU MLP and scatter-add the weighted result. Both use the same shapes
and the same weights. Reported: forward+backward tokens/s of each and their ratio, over
``--repeats`` paired rounds (after a warm-up round), as min, median and max.

    .venv/bin/python bench/moe_layer.py [--tokens 2048 --hidden 256 --ffn 512 --experts 8 --top-k 2] [--repeats 5]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _common import init_single_process, paired, ratios, report, spread, timed


def megatron_moe_layer(args):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=args.hidden,
        num_attention_heads=4,
        ffn_hidden_size=args.ffn,
        moe_ffn_hidden_size=args.ffn,
        num_moe_experts=args.experts,
        moe_router_topk=args.top_k,
        moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type="none",
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization="RMSNorm",
        bias_dropout_fusion=False,
        use_cpu_initialization=not torch.cuda.is_available(),
        gradient_accumulation_fusion=False,
        moe_grouped_gemm=False,
        params_dtype=torch.float32,
    )
    spec = get_gpt_layer_local_spec(num_experts=args.experts, moe_grouped_gemm=False, normalization="RMSNorm")
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=128, max_sequence_length=16)
    layer = model.decoder.layers[0].mlp
    return layer.cuda() if torch.cuda.is_available() else layer


class NaiveMoE(torch.nn.Module):
    """Mixtral-style reference with the megatron layer's weights."""

    def __init__(self, megatron_layer, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = torch.nn.Parameter(megatron_layer.router.weight.detach().clone())
        experts = megatron_layer.experts.local_experts
        self.fc1 = torch.nn.ParameterList([torch.nn.Parameter(e.linear_fc1.weight.detach().clone()) for e in experts])
        self.fc2 = torch.nn.ParameterList([torch.nn.Parameter(e.linear_fc2.weight.detach().clone()) for e in experts])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(tokens @ self.router.t(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        out = torch.zeros_like(tokens)
        for e, (fc1, fc2) in enumerate(zip(self.fc1, self.fc2)):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            gate, up = (tokens[rows] @ fc1.t()).chunk(2, dim=-1)
            out.index_add_(0, rows, (F.silu(gate) * up) @ fc2.t() * weights[rows, slot, None])
        return out.view_as(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=512)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10, help="steps per round")
    parser.add_argument("--repeats", type=int, default=5, help="paired rounds")
    args = parser.parse_args()
    init_single_process()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    megatron = megatron_moe_layer(args)
    naive = NaiveMoE(megatron, args.top_k).to(device)
    x = torch.randn(args.tokens, 1, args.hidden, device=device, requires_grad=True)  # [seq, batch, hidden]

    def megatron_step():
        output, _ = megatron(x)
        output.sum().backward()

    def naive_step():
        naive(x).sum().backward()

    runs = paired(
        {
            "megatron alltoall": lambda: timed(megatron_step, warmup=0, iters=args.iters),
            "naive expert loop": lambda: timed(naive_step, warmup=0, iters=args.iters),
        },
        repeats=args.repeats,
    )
    rows = []
    for name, seconds in runs.items():
        s = spread(seconds)
        rows.append(
            {
                "implementation": name,
                "median_ms": s["median"] * 1000,
                "min_ms": s["min"] * 1000,
                "max_ms": s["max"] * 1000,
                "tokens_per_s": args.tokens / s["median"],
            }
        )
    report(
        "moe_layer",
        rows,
        {
            "shape": vars(args),
            "repeats": args.repeats,
            "megatron_over_naive": ratios(runs["naive expert loop"], runs["megatron alltoall"]),
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
