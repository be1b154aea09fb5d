"""The outlier channels of a model's all-reduces (``--allreduce int4+o16``): the channels with the
largest root-mean-square value of the row-parallel outputs (o_proj, down_proj: what tensor
parallelism sums) on calibration text (WikiText-2 validation, never the evaluation text).

RMS rather than mean |value|: a channel that is huge on a few tokens (a massive activation) ruins
those tokens' blocks, and the square weighs it as the codec's squared error does. On the default
model at TP 2 (int4+h+o16, 4 x 512 WikiText-2 test tokens, both ranks simulated bit for bit in one
process) the two criteria are within the noise of so few tokens: two-shot per layer RMS 1.069x
the float perplexity vs mean |value| 1.096x (max |value| 1.107x); one-shot per layer RMS 1.029x
(1.049x in a one-process simulation that summed the statistic in float32, which may have picked
a slightly different set: not checked) vs mean |value| 1.031x;
one-shot, one set for the model, RMS 1.024x (README, all-reduce section).

``per="model"`` (the default: as good as or better than per layer in both comparisons made):
one set for all, the channels with the largest mean over the layers of (channel mean square /
layer mean square), so that no single loud layer decides; ``per="layer"``: each row-parallel
linear its own. Rank 0 calibrates and broadcasts, so every rank holds the very same sets (a rank
that computed its own on another CPU could differ in a near tie).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .layers import REDUCED

PER = ("layer", "model")


def row_parallel_names(model: nn.Module) -> list[str]:
    """The names of a shard's row-parallel layers (linears, mixtures of experts), in module order
    (the same on every rank)."""
    return [n for n, m in model.named_modules() if isinstance(m, REDUCED)]


@torch.inference_mode()
def channel_magnitudes(model: nn.Module, names: list[str], ids: torch.Tensor) -> torch.Tensor:
    """``[len(names), hidden]``: mean squared output per channel of each named linear of the single-process
    ``model`` (bias left out: the all-reduce sums the outputs before the bias) over ``ids``' tokens."""
    mods = dict(model.named_modules())
    missing = [n for n in names if n not in mods]
    if missing:
        raise ValueError(f"the single-process model has no modules {missing[:3]}; cannot calibrate outlier channels")
    sums: dict[str, torch.Tensor] = {}
    count = [0]

    def hook(name):
        def fn(mod, inp, out):
            y = out.float()
            if getattr(mod, "bias", None) is not None:
                y = y - mod.bias.float()
            y = y.reshape(-1, y.shape[-1]).double()
            s = (y * y).sum(0)
            sums[name] = sums[name] + s if name in sums else s
        return fn

    handles = [mods[n].register_forward_hook(hook(n)) for n in names]
    try:
        for row in ids:
            model(input_ids=row[None], use_cache=False)
            count[0] += row.numel()
    finally:
        for h in handles:
            h.remove()
    return torch.stack([sums[n] for n in names]) / count[0]


def choose_channels(mags: torch.Tensor, n: int, per: str = "model") -> torch.Tensor:
    """``[layers, n]`` sorted channel indices from :func:`channel_magnitudes` (ties: lower index)."""
    if per not in PER:
        raise ValueError(f"outlier channels per {per!r}; choose one of {', '.join(PER)}")
    if not 0 < n < mags.shape[1]:
        raise ValueError(f"{n} outlier channels for hidden size {mags.shape[1]}; use 1 to {mags.shape[1] - 1}")
    if per == "model":
        score = (mags / mags.mean(1, keepdim=True).clamp_min(1e-30)).mean(0)
        top = torch.sort(torch.topk(score.double(), n, sorted=True).indices).values
        return top.expand(mags.shape[0], n).clone()
    return torch.sort(torch.topk(mags.double(), n, dim=1, sorted=True).indices, dim=1).values


def calibrate(model: str, names: list[str], n: int, per: str = "model", samples: int = 8, seqlen: int = 512,
              seed: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Load ``model`` in one process, run ``samples`` calibration windows (or the token ``ids``
    ``[samples, seqlen]``, e.g. for a model without a tokenizer), choose ``[len(names), n]`` channels."""
    from lowbit.checkpoint import load_model
    from lowbit.data.calibration import calibration_ids

    m, tok = load_model(model, kernel="reference")
    ids = calibration_ids(tok, samples, seqlen, seed=seed) if ids is None else ids
    return choose_channels(channel_magnitudes(m, names, ids), n, per)


def shared_channels(rank: int, model: str, names: list[str], n: int, per: str = "model", **kw) -> dict[str, torch.Tensor]:
    """Rank 0 calibrates, every rank receives the same ``{name: channels}`` (collective)."""
    chans = calibrate(model, names, n, per, **kw) if rank == 0 else torch.empty(len(names), n, dtype=torch.int64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(chans, 0)
    return dict(zip(names, chans))
