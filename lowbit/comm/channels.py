"""Outlier channels and the block Hadamard around the block codec, for hidden-size messages
(``int4+o16``, ``int4+h``, ``int4+h+o16``).

A residual-stream message ``[tokens, hidden]`` has a few channels far larger than the rest; in a
32-value block such a channel sets the scale and the other 31 values lose their bits.

* ``+oN``: a fixed set of N channels, the same on every rank (chosen on calibration text, or given
  by the caller), travels exactly in the input dtype beside the blocks and is summed in float32 in
  rank order; the blocks carry the message with those channels set to zero (a zero never raises a
  block's scale and decodes to exactly 0). Wire cost: ``N · 16 / hidden`` bits per value for
  16-bit input (16 of 576: +0.44).
* ``+h``: every B-value block (B = 64 or 32) of the rest, taken along the flat message, is
  multiplied by the orthonormal Sylvester Hadamard matrix ``H/√B`` (``lowbit.formats.hadamard``)
  before encoding. The sum is linear, so the ranks reduce in the transformed domain, and after the
  final decode every rank applies the same transform again (``H/√B`` is its own inverse) to the same
  decoded bytes: ranks stay bit-identical. A huge value is spread over its block instead of
  setting one 32-value scale alone; a non-finite input value poisons its whole B-value block.

Every step is elementwise or a fixed butterfly (no BLAS reduction whose order could depend on
threads), so equal inputs give equal bits on every rank and machine.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property

import torch

from lowbit.formats.hadamard import fast_transform

from .codecs import native
from .collectives import scratch
from .codecs.spec import CodecSpec, parse_spec


@dataclass(frozen=True, eq=False)
class ChannelPlan:
    """What is done around the codec for one message layout: hidden size, outlier channels, block."""

    hidden: int
    channels: torch.Tensor  # int64, sorted, unique, in [0, hidden)
    block: int  # Hadamard block size (0: none)

    @staticmethod
    def make(spec: str | CodecSpec, hidden: int | None, channels=None) -> ChannelPlan | None:
        """The plan of ``spec`` for messages whose last dimension is ``hidden``; None for a plain codec.
        ValueError for a missing or wrong hidden size or channel set."""
        spec = parse_spec(spec)
        if spec.plain_codec:
            if channels is not None and len(channels):
                raise ValueError(f"outlier channels given, but codec {spec.name!r} has no +oN option")
            return None
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise ValueError(f"codec {spec.name!r} needs the hidden size (the messages' last dimension), got {hidden!r}")
        if spec.hadamard and hidden % spec.hadamard:
            raise ValueError(f"codec {spec.name!r}: hidden size {hidden} is not a multiple of the Hadamard block {spec.hadamard}")
        idx = check_channels(spec, hidden, channels) if spec.outliers else torch.zeros(0, dtype=torch.int64)
        return ChannelPlan(hidden, idx, spec.hadamard)

    @cached_property
    def digest(self) -> int:
        """A 62-bit fingerprint of (hidden, block, channels): the metadata check compares it across ranks."""
        h = hashlib.blake2b(digest_size=8)
        h.update(torch.tensor([self.hidden, self.block, self.channels.numel()], dtype=torch.int64).numpy().tobytes())
        h.update(self.channels.numpy().tobytes())
        return int.from_bytes(h.digest(), "little") >> 2

    def check(self, t: torch.Tensor) -> None:
        if t.dim() == 0 or t.shape[-1] != self.hidden:
            raise ValueError(f"this all-reduce carries messages of hidden size {self.hidden} in the last "
                             f"dimension, got shape {tuple(t.shape)}")

    @cached_property
    def scale(self) -> float:
        """The butterfly's final multiplier 1/√B as float32 (what ``fast_transform`` multiplies by)."""
        return float(torch.tensor(1.0 / math.sqrt(self.block or 1), dtype=torch.float32))

    def _native(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and native.available()

    def split(self, x: torch.Tensor, workspace: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(rest, outliers): the message as float32 ``[tokens, hidden]`` with the outlier channels zeroed
        and, with +h, Hadamard-transformed per block; the outlier channels ``[tokens, N]`` in x's dtype.
        One C pass on CPU (``csrc/qr_channels.h``), torch ops elsewhere: the same bits (tested).
        ``workspace``: a dict keeping the two buffers between calls (their contents are overwritten)."""
        self.check(x)
        if self._native(x):
            tokens, n = x.numel() // self.hidden, self.channels.numel()
            rest = scratch(workspace, "rest", (tokens, self.hidden), torch.float32, x.device)
            outl = scratch(workspace, "outl", (tokens, n), x.dtype, x.device)
            return native.split_channels(x.reshape(-1).contiguous(), self.hidden, self.channels, n, self.block,
                                         self.scale, rest, outl)
        return self.split_torch(x)

    def encode(self, x: torch.Tensor, codec, wire: torch.Tensor, outl: torch.Tensor) -> None:
        """:meth:`split` then the codec's ``encode`` of the rest, into ``wire`` ``[rows, row_bytes]`` and
        ``outl`` ``[tokens, N]``; fused per row in C on CPU (no float32 copy of the message), else the
        torch split and the device's encoder (Triton on CUDA for INT8/INT4)."""
        from .codecs.device import encode

        self.check(x)
        if self._native(x) and wire.is_contiguous() and outl.is_contiguous():
            native.encode_split(x.reshape(-1).contiguous(), self.hidden, self.channels, self.channels.numel(),
                                self.block, self.scale, 0 if codec.kind == "int" else 1, codec.bits, codec.row_bytes,
                                codec.code_bytes, wire, outl)
            return
        rest, o = self.split_torch(x)
        encode(rest.reshape(-1), codec, out=wire)
        outl.copy_(o)

    def split_torch(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = x.reshape(-1, self.hidden)
        idx = self.channels.to(x.device)
        outl = x2.index_select(1, idx)
        rest = x2.to(torch.float32, copy=True)
        if idx.numel():
            rest.index_fill_(1, idx, 0.0)
        if self.block:
            rest = block_transform(rest, self.block)
        return rest, outl

    def merge(self, rest: torch.Tensor, osum: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the message's shape and dtype) = inverse transform of the summed rest, with the
        summed outlier channels ``osum`` (float32 ``[tokens, N]``) put back; cast once to out's dtype."""
        self._check_osum(osum, rest.numel())
        if self._native(rest) and out.is_contiguous() and out.device.type == "cpu":
            n = self.channels.numel()
            native.merge_channels(rest.reshape(-1).contiguous(), self.hidden, self.channels, n, self.block, self.scale,
                                  osum.contiguous() if n else None, out.view(-1))
            return out
        return self.merge_torch(rest, osum, out)

    def decode_merge(self, wires: list[torch.Tensor], codec, osum: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        """:meth:`merge` of the float32 sum (list order) of the decoded ``wires`` (``[rows, row_bytes]``,
        float32-wire rows of ``out.numel()`` values): one C pass per row on CPU, no float32 message
        in memory; decode + decode_add + merge elsewhere. The same bits either way (tested)."""
        from .codecs.device import decode, decode_add

        n, nch = out.numel(), self.channels.numel()
        self._check_osum(osum, n)
        if (self._native(out) and out.is_contiguous() and all(w.is_contiguous() and w.device.type == "cpu" for w in wires)
                and codec.kind in ("int", "fp4")):
            native.decode_merge_channels(list(wires), 0 if codec.kind == "int" else 1, codec.bits, codec.row_bytes,
                                         codec.code_bytes, self.hidden, self.channels, nch, self.block, self.scale,
                                         osum.contiguous() if nch else None, out.view(-1))
            return out
        acc = decode(wires[0], codec, n, torch.float32, fp_wire=torch.float32)
        for w in wires[1:]:
            decode_add(acc, w, codec, fp_wire=torch.float32)
        return self.merge(acc.view(-1, self.hidden), osum, out)

    def _check_osum(self, osum: torch.Tensor | None, n: int) -> None:
        nch = self.channels.numel()
        if nch and (not isinstance(osum, torch.Tensor) or tuple(osum.shape) != (n // self.hidden, nch)):
            raise ValueError(f"merge: needs the float32 outlier sums of {n // self.hidden} x {nch}, got "
                             f"{tuple(osum.shape) if isinstance(osum, torch.Tensor) else repr(osum)}")

    def merge_torch(self, rest: torch.Tensor, osum: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        # + 0 turns -0 into +0 and changes nothing else: a decoded zero is +0 whichever sign its
        # block's scale had (the C path's integer stages give the same bits; see fwht_blocks)
        vals = block_transform(rest + 0.0, self.block) if self.block else rest
        vals = vals.reshape(-1, self.hidden)
        if osum is not None and self.channels.numel():
            vals.index_copy_(1, self.channels.to(vals.device), osum)
        if out.dtype == torch.float16:  # as the plain decode: within the codec's rounding of 65504 stays finite
            vals = torch.where(vals.abs() < 65536.0, vals.clamp(-65504.0, 65504.0), vals)
        out.copy_(vals.view(out.shape))
        return out


def check_channels(spec: CodecSpec, hidden: int, channels) -> torch.Tensor:
    """The outlier channels as a sorted int64 tensor; ValueError unless exactly ``spec.outliers``
    distinct channels in [0, hidden), fewer than hidden."""
    n = spec.outliers
    if n >= hidden:
        raise ValueError(f"codec {spec.name!r}: {n} outlier channels for hidden size {hidden}; use fewer than {hidden}")
    if channels is None:
        raise ValueError(f"codec {spec.name!r} needs its {n} outlier channels (from calibration or the caller)")
    idx = torch.as_tensor(channels).reshape(-1)
    if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.is_complex():
        raise ValueError(f"codec {spec.name!r}: outlier channels must be integers, got {idx.dtype}")
    idx = idx.to(torch.int64).cpu()
    if idx.numel() != n:
        raise ValueError(f"codec {spec.name!r} needs {n} outlier channels, got {idx.numel()}")
    if bool(((idx < 0) | (idx >= hidden)).any()):
        raise ValueError(f"codec {spec.name!r}: outlier channels must lie in [0, {hidden}), got {idx.tolist()}")
    idx = torch.sort(idx).values
    if bool((idx[1:] == idx[:-1]).any()):
        raise ValueError(f"codec {spec.name!r}: outlier channels must be distinct, got {idx.tolist()}")
    return idx


def spread_channels(n: int, hidden: int) -> torch.Tensor:
    """n channels spread evenly over ``hidden`` (0, hidden // n, ...): for benchmarks on random data,
    where no channel is special."""
    return torch.arange(n, dtype=torch.int64) * (hidden // max(n, 1))


def block_transform(x: torch.Tensor, block: int) -> torch.Tensor:
    """``H/√B`` applied to every ``block`` consecutive values of the flat float32 ``x`` (same shape);
    its own inverse up to rounding. The butterfly of ``lowbit.formats.hadamard.fast_transform``: it
    adds before it scales, so a block beyond float32's maximum / B overflows (inf, then NaN on the
    wire: poisoned, as the C path does)."""
    if x.numel() % block:
        raise ValueError(f"block Hadamard: {x.numel()} values are not whole blocks of {block}")
    return fast_transform(x.reshape(-1, block)).view(x.shape)


def transform_bound(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per element of ``block_transform(x)``: ``|computed − exact| ≤ (log2 B + 3) u ‖x_block‖₁ / √B``
    (``hadamard.error_bound``), same shape as x (float64)."""
    u = 2.0**-24
    xb = x.reshape(-1, block).double()
    b = (math.log2(block) + 3) * u * xb.abs().sum(-1, keepdim=True) / math.sqrt(block)
    return b.expand_as(xb).reshape(x.shape)
