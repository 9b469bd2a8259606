"""The native spec's modules: megatron's local layer with its two slow parts done by torch's own kernels.

* ``NativeCoreAttention``: megatron's ``DotProductAttention`` builds the s x s scores with ``baddbmm`` and a
  softmax over them; this one calls ``torch.nn.functional.scaled_dot_product_attention`` (causal, with grouped
  query heads), which on a GPU runs a flash or cuDNN kernel that never holds the scores. It has no parameters, as
  DotProductAttention has none, so a checkpoint is the same under either.
* ``NativeExperts``: megatron's ``SequentialMLP`` runs one GEMM per expert; this one keeps its parameters (one MLP
  per expert, so the same sharded state dict and checkpoints) and runs each projection over the rank's experts
  as one ``torch._grouped_mm``: torch's grouped GEMM, with Hopper kernels on CUDA and a CPU implementation, in
  bfloat16 (torch 2.9 has no float32 grouped kernel on either). Other dtypes take the per-expert GEMMs.

This module imports megatron; training/step/model.py imports it only when it builds the native spec.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.moe.experts import SequentialMLP

GROUPED_MM_DTYPES = (torch.bfloat16,)
"""The dtypes torch 2.9's ``_grouped_mm`` computes, on CPU and on CUDA (sm90 and later)."""


class NativeCoreAttention(DotProductAttention):
    """Causal attention through ``scaled_dot_product_attention``; megatron builds it where it builds
    ``DotProductAttention`` (the layer spec's ``core_attention``), with the same arguments.

    Query ``[sq, b, heads, d]`` and key and value ``[sk, b, groups, d]`` in, ``[sq, b, heads * d_v]`` out, as
    DotProductAttention takes and gives them. ``k_channels`` and ``v_channels`` are accepted for multi-latent
    attention, whose value heads are narrower than its query and key heads (``scaled_dot_product_attention``
    follows the tensors' own widths).
    """

    def __init__(self, config, *args, k_channels: int | None = None, v_channels: int | None = None, **kwargs):
        super().__init__(config, *args, **kwargs)
        assert v_channels in (None, config.kv_channels), (v_channels, config.kv_channels)
        # What DotProductAttention does beyond causal softmax attention (another mask type, softmax offsets, layer
        # scaling) no moe-train configuration key sets; these guard the module's own contract.
        assert self.attn_mask_type is AttnMaskType.causal, self.attn_mask_type
        assert self.softmax_offset is None, "softmax_type other than vanilla"
        assert not self.config.apply_query_key_layer_scaling

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        assert packed_seq_params is None and attention_bias is None
        # [s, b, n, d] -> [b, n, s, d], the layout scaled_dot_product_attention takes.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        dropout = self.attention_dropout.p if self.training else 0.0
        # DotProductAttention draws its dropout in the tensor-parallel RNG tracker's fork (different masks on
        # the ranks' different heads); the same here.
        forked = dropout and not self.config.sequence_parallel
        with tensor_parallel.get_cuda_rng_tracker().fork() if forked else contextlib.nullcontext():
            context = F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=dropout,
                is_causal=True,
                scale=self.softmax_scale,
                enable_gqa=q.size(1) != k.size(1),
            )
        # [b, n, sq, d_v] -> [sq, b, n * d_v]
        context = context.permute(2, 0, 1, 3).contiguous()
        return context.view(*context.shape[:2], -1)


class NativeExperts(SequentialMLP):
    """A rank's experts as ``SequentialMLP`` holds them, each projection run over all of them as one grouped GEMM.

    Tokens come sorted by local expert with ``tokens_per_expert`` counts, as the token dispatcher gives them to
    SequentialMLP. The experts' linears are bias-free and their weights already this rank's expert-tensor shard,
    whose partial outputs the dispatcher reduces, so the arithmetic is the MLP's own: ``fc2(act(fc1(x)) * p)``
    with ``p`` the token's routing probability.
    """

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
        x = permuted_local_hidden_states
        if x.dtype not in GROUPED_MM_DTYPES or self.config.moe_apply_probs_on_input:
            return super().forward(x, tokens_per_expert, permuted_probs)
        # Cumulative token counts, the group ends _grouped_mm takes.
        ends = torch.cumsum(torch.as_tensor(tokens_per_expert, device=x.device), 0).to(torch.int32)
        fc1 = torch.stack([e.linear_fc1.weight for e in self.local_experts]).transpose(1, 2)
        fc2 = torch.stack([e.linear_fc2.weight for e in self.local_experts]).transpose(1, 2)
        hidden = torch._grouped_mm(x, fc1, offs=ends)
        hidden = self._activation(hidden)
        hidden = (hidden * permuted_probs.unsqueeze(-1)).to(x.dtype)
        return torch._grouped_mm(hidden, fc2, offs=ends), None

    def _activation(self, hidden: torch.Tensor) -> torch.Tensor:
        config = self.config
        if not config.gated_linear_unit:
            return config.activation_func(hidden)
        gate, linear = torch.chunk(hidden, 2, dim=-1)
        if (clamp := config.activation_func_clamp_value) is not None:
            gate, linear = gate.clamp(max=clamp), linear.clamp(min=-clamp, max=clamp)
        return config.activation_func(gate) * (linear + config.glu_linear_offset)


__all__ = ["GROUPED_MM_DTYPES", "NativeCoreAttention", "NativeExperts"]
