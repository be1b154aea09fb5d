"""Capture the real inputs of a model's linear layers with forward hooks.

Linears that read the same tensor (q/k/v; gate/up) form one *input site*; each site is stored
once, keyed by its first linear's name, with the names of all its consumers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class InputSite:
    """One tensor that feeds one or more linears, and its statistics over all captured tokens."""

    name: str
    consumers: list[str] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)  # kept sample of rows, float32
    sq_sum: torch.Tensor | None = None  # per-channel Σx² over every token seen (diag of XᵀX)
    n_tokens: int = 0

    def sample(self) -> torch.Tensor:
        return torch.cat(self.rows) if self.rows else torch.empty(0)

    def outlier_ratio(self) -> float:
        """max / median of the per-channel square sums: how strongly a few channels dominate."""
        med = float(self.sq_sum.median())
        return float(self.sq_sum.max()) / med if med > 0 else float("inf")


def decoder_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The nn.Linear modules inside the decoder layers (not the embedding or lm_head)."""
    return {
        name: mod
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and ".layers." in f".{name}"
    }


@torch.inference_mode()
def capture_inputs(model: nn.Module, batches: torch.Tensor, keep_rows: int = 512, seed: int = 0) -> dict[str, InputSite]:
    """Run ``batches`` ([n, seqlen] ids, one sequence at a time) and collect every input site.

    Every token updates the per-channel square sums; a seeded random sample of at most
    ``keep_rows`` rows per site is kept for measuring quantization error.
    """
    linears = decoder_linears(model)
    sites: dict[str, InputSite] = {}
    last: dict[str, object] = {"tensor": None, "site": None}  # q/k/v and gate/up run back to back
    per_seq = max(1, keep_rows // max(1, batches.shape[0]))
    gen = torch.Generator().manual_seed(seed)

    def hook(name):
        def fn(_mod, args):
            if args[0] is last["tensor"]:  # the same tensor as the linear just before
                site = sites[last["site"]]
                if name not in site.consumers:
                    site.consumers.append(name)
                return
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            site = sites.setdefault(name, InputSite(name, [name]))
            last["tensor"], last["site"] = args[0], name
            sq = (x * x).sum(dim=0)
            site.sq_sum = sq if site.sq_sum is None else site.sq_sum + sq
            site.n_tokens += x.shape[0]
            idx = torch.randperm(x.shape[0], generator=gen)[:per_seq]
            site.rows.append(x[idx].clone())

        return fn

    handles = [mod.register_forward_pre_hook(hook(name)) for name, mod in linears.items()]
    try:
        for seq in batches:
            model(seq[None])
            last["tensor"] = None
    finally:
        for h in handles:
            h.remove()
    return sites
