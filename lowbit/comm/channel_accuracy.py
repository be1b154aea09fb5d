"""The outlier-channel / block-Hadamard all-reduce in one process: a plain reference of its split and
merge, what every rank holds after it (``simulate_channels``) and its per-element error bound.

The reference split/merge walk token by token and multiply each block by the dense orthonormal
Hadamard matrix in float64; the fast ones (``channels.py``) use index ops and the butterfly in
float32, equal to the reference within ``channels.transform_bound``.
"""

from __future__ import annotations

import math

import torch

from lowbit.formats.hadamard import orthonormal

from .accuracy import _MIN_SUBNORMAL_HALF, _UNIT_ROUNDOFF, error_bound, simulate
from .channels import ChannelPlan, transform_bound
from .codecs.spec import CodecSpec, parse_spec
from .collectives import rank_order_sum
from .oneshot import oneshot_reference


def _dense_blocks(v: torch.Tensor, block: int) -> torch.Tensor:
    h = orthonormal(block, torch.float64)
    return torch.cat([h.T @ v[j : j + block] for j in range(0, v.numel(), block)])


def split_reference(x: torch.Tensor, plan: ChannelPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """(rest float64 ``[tokens, hidden]``, outliers ``[tokens, N]`` in x's dtype), one token at a time."""
    rows = x.reshape(-1, plan.hidden)
    chans = plan.channels.tolist()
    rest, outl = [], []
    for t in range(rows.shape[0]):
        r = rows[t].double().clone()
        outl.append(torch.stack([rows[t, c] for c in chans]) if chans else rows[t, :0])
        for c in chans:
            r[c] = 0.0
        rest.append(r)
    rest = torch.stack(rest)
    if plan.block:
        rest = _dense_blocks(rest.reshape(-1), plan.block).view(rest.shape)
    return rest, torch.stack(outl)


def merge_reference(rest: torch.Tensor, osum: torch.Tensor | None, plan: ChannelPlan) -> torch.Tensor:
    """The merged message in float64 ``[tokens, hidden]`` (before the final cast)."""
    vals = rest.double().reshape(-1)
    if plan.block:
        vals = _dense_blocks(vals, plan.block)
    vals = vals.view(-1, plan.hidden).clone()
    for k, c in enumerate(plan.channels.tolist()):
        vals[:, c] = osum[:, k].double()
    return vals


def simulate_channels(inputs: list[torch.Tensor], spec: str | CodecSpec, plan: ChannelPlan,
                      shot: str = "twoshot") -> torch.Tensor:
    """What every rank holds after ``QuickAllReduce(spec).all_reduce(x, plan)`` on the ``shot`` path,
    given each rank's input (rank order), bit for bit."""
    spec = parse_spec(spec)
    parts = [plan.split(x) for x in inputs]
    rests = [p[0].reshape(-1) for p in parts]
    if shot == "twoshot":
        acc = simulate(rests, spec.codec)
    else:
        acc = oneshot_reference(rests, spec.codec, codecs="fast")
    osum = None
    if plan.channels.numel():
        osum = rank_order_sum(p[1] for p in parts)
    return plan.merge(acc.view(-1, plan.hidden), osum, torch.empty_like(inputs[0]))


def channel_error_bound(inputs: list[torch.Tensor], spec: str | CodecSpec, plan: ChannelPlan) -> torch.Tensor:
    """Per element (float64, the inputs' shape flattened) a bound on |result − exact float64 sum|
    for finite inputs, either path: the codec's two-stage bound on the transformed rest
    (``accuracy.error_bound``) plus each rank's forward-transform rounding, carried back through
    ``H/√B`` (at most ``Σ_block / √B``), plus the inverse's rounding; the outlier channels only
    their float32 sums; then the final cast to the input dtype."""
    spec = parse_spec(spec)
    dtype, w = inputs[0].dtype, len(inputs)
    parts = [plan.split(x) for x in inputs]
    rests = [p[0].reshape(-1) for p in parts]
    e = error_bound(rests, spec.codec)
    acc = torch.zeros_like(rests[0], dtype=torch.float64)
    for r in rests:
        acc += r.double()
    if plan.block:
        zeroed = [x.reshape(-1, plan.hidden).float().index_fill(1, plan.channels, 0.0).reshape(-1) for x in inputs]
        e = e + sum(transform_bound(z, plan.block) for z in zeroed)
        back = e.view(-1, plan.block).sum(-1, keepdim=True) / math.sqrt(plan.block)
        e = back.expand(-1, plan.block).reshape(-1) + transform_bound((acc.abs() + e).float(), plan.block) * 1.01
    e = e.view(-1, plan.hidden).clone()
    exact = sum(x.reshape(-1, plan.hidden).double() for x in inputs)
    if plan.channels.numel():
        mags = sum(x.reshape(-1, plan.hidden).double().abs() for x in inputs)[:, plan.channels]
        e[:, plan.channels] = w * _UNIT_ROUNDOFF[torch.float32] * mags
    cast = (exact.abs() + e) * _UNIT_ROUNDOFF[dtype] + _MIN_SUBNORMAL_HALF[dtype]
    return (e + cast).reshape(-1)
