"""Mixture-of-experts MLPs as one ``nn.Linear`` pair per expert, so each expert's linears can be
calibrated, reordered and quantized like any other (transformers stores them as 3-D tensors).

The forward is the same computation as transformers' ``MixtralExperts``.
"""

from __future__ import annotations

import torch
from torch import nn


class ExpertMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)


class UnfusedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int, act_fn):
        super().__init__()
        self.num_experts = num_experts
        self.experts = nn.ModuleList(ExpertMLP(hidden, intermediate) for _ in range(num_experts))
        self.act_fn = act_fn

    @classmethod
    def from_fused(cls, fused: nn.Module) -> "UnfusedExperts":
        e, two_i, h = fused.gate_up_proj.shape
        m = cls(e, h, two_i // 2, fused.act_fn).to(fused.gate_up_proj.device, fused.gate_up_proj.dtype)
        with torch.no_grad():
            for i, ex in enumerate(m.experts):
                ex.gate_up_proj.weight.copy_(fused.gate_up_proj[i])
                ex.down_proj.weight.copy_(fused.down_proj[i])
        return m

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for e, ex in enumerate(self.experts):
            token_idx, pos = torch.where(top_k_index == e)
            if token_idx.numel() == 0:
                continue
            gate, up = ex.gate_up_proj(hidden_states[token_idx]).chunk(2, dim=-1)
            y = ex.down_proj(self.act_fn(gate) * up) * top_k_weights[token_idx, pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out
