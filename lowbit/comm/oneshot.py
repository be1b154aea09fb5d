"""One-shot quantized all-reduce: one collective, for messages too small to pay two-shot's two.

Every rank encodes its whole tensor once, one all-gather delivers every rank's wire bytes to every
rank, and each rank decodes the W contributions and adds them in float32, in rank order, then casts
to the input dtype. Every rank decodes the very same bytes in the same order, so every rank ends
with a bit-identical result, and it equals :func:`oneshot_reference` (decode-then-sum) bit for bit.

Against two-shot: one collective instead of two, and only one quantization (the sum is not
re-encoded), but every rank receives (W-1) whole encoded tensors instead of 2(W-1)/W of one, and
decodes W tensors. It wins where latency dominates (small messages), which the size policy decides.

Range: float16 contributions are saturated to ±65504 before the sum (FP4 may decode 65504 as
65520), and a float16 sum beyond the range becomes ±inf when cast, as in ``dist.all_reduce``;
a float32 sum that overflows is ±inf too (nothing re-encodes it). A NaN/Inf input block decodes
to NaN on every rank (the codecs poison the block), as in two-shot.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .codecs import Codec, fp_wire_dtype, n_rows
from .codecs.device import decode, decode_add, encode  # Triton on CUDA for INT8/INT4, else fast.py
from .codecs.fast import saturate_f16
from .collectives import all_gather_into, guarded, rank_order_sum, scratch

def sum_wires(wires: list[torch.Tensor], codec: Codec, n: int, dtype: torch.dtype, out: torch.Tensor) -> torch.Tensor:
    """``out = dtype(sum_j decode(wires[j]))``, float32 sums in list order (the one-shot's local step)."""
    fpw = fp_wire_dtype(dtype)
    f16 = dtype == torch.float16 and codec.kind != "fp"
    acc = decode(wires[0], codec, n, torch.float32, fp_wire=fpw)
    if f16:
        acc = saturate_f16(acc)
    for w in wires[1:]:
        if f16:
            acc += saturate_f16(decode(w, codec, n, torch.float32, fp_wire=fpw))
        else:
            decode_add(acc, w, codec, fp_wire=fpw)
    return out.copy_(acc)


def one_shot_channels(x: torch.Tensor, codec: Codec, plan, group=None, out: torch.Tensor | None = None,
                      workspace: dict | None = None) -> torch.Tensor:
    """One-shot with a channel plan (``channels.py``): each rank sends its encoded rest and its raw
    outlier channels in one all-gather; every rank decodes the W rests into a float32 sum (rank
    order), sums the outlier channels in float32 (rank order) and merges (inverse Hadamard, one cast).
    Bit-identical to ``channel_accuracy.simulate_channels(..., "oneshot")``."""
    world = dist.get_world_size(group)
    n, dtype = x.numel(), x.dtype
    tokens, nch = n // plan.hidden, plan.channels.numel()
    rows, rb = n_rows(n), codec.wire_row_bytes(torch.float32)
    ob = tokens * nch * x.element_size()
    gathered = scratch(workspace, "oneshot_ch", (world, rows * rb + ob), torch.uint8, x.device)
    send = scratch(workspace, "oneshot_ch_send", (rows * rb + ob,), torch.uint8, x.device)
    plan.encode(x, codec, send[: rows * rb].view(rows, rb), send[rows * rb :].view(dtype).view(tokens, nch))
    guarded("one-shot (all-gather)", all_gather_into, gathered.view(-1), send, group=group)
    osum = None
    if nch:
        osum = rank_order_sum(gathered[:, rows * rb :].contiguous().view(dtype).view(world, tokens, nch))
    if out is None:
        out = torch.empty(n, dtype=dtype, device=x.device)
    plan.decode_merge([gathered[j, : rows * rb].view(rows, rb) for j in range(world)], codec, osum,
                      out.view(tokens, plan.hidden))
    return out


def one_shot(x: torch.Tensor, codec: Codec, group=None, out: torch.Tensor | None = None,
             workspace: dict | None = None) -> torch.Tensor:
    """The reduced values, flat, in x's dtype (written into the flat contiguous ``out`` if given,
    which may be x itself). Collective: call on every rank with the same size and dtype."""
    world = dist.get_world_size(group)
    n, dtype = x.numel(), x.dtype
    fpw = fp_wire_dtype(dtype)
    rows, rb = n_rows(n), codec.wire_row_bytes(fpw)
    gathered = scratch(workspace, "oneshot", (world, rows, rb), torch.uint8, x.device)
    send = encode(x.reshape(-1), codec, out=scratch(workspace, "oneshot_send", (rows, rb), torch.uint8, x.device))
    guarded("one-shot (all-gather)", all_gather_into, gathered.view(-1), send.reshape(-1), group=group)
    if out is None:
        out = torch.empty(n, dtype=dtype, device=x.device)
    return sum_wires([gathered[j] for j in range(world)], codec, n, dtype, out)


def oneshot_reference(inputs: list[torch.Tensor], codec: str | Codec, codecs: str = "reference") -> torch.Tensor:
    """What every rank holds after the one-shot path, given each rank's input: decode then sum,
    written plainly; ``codecs``: "reference" (``reference.py``) or "fast" (the codecs the ranks run)."""
    from .codecs import decode_ref, encode_ref, get_codec

    c = get_codec(codec)
    enc, dec = (encode_ref, decode_ref) if codecs == "reference" else (encode, decode)
    dtype, n = inputs[0].dtype, inputs[0].numel()
    acc = None
    for x in inputs:  # rank order; the first contribution starts the sum (0 + -0 would be +0)
        v = dec(enc(x.reshape(-1), c), c, n, torch.float32, fp_wire=fp_wire_dtype(dtype))
        if dtype == torch.float16 and c.kind != "fp":
            v = torch.where(v.abs() < 65536.0, v.clamp(-65504.0, 65504.0), v)
        acc = v if acc is None else acc + v
    return acc.to(dtype)
