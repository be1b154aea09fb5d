"""FP4 E2M1 values with a per-block scale: FP16 per 32, MXFP4 (E8M0 per 32), NVFP4 (E4M3 per 16).

E2M1 represents ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}. A 4-bit code is ``sign << 3 | magnitude index``.
Rounding is to nearest, ties to the even magnitude index (the even code), like IEEE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_float_input
from .granularity import PerGroup, from_blocks, to_blocks

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E2M1_MIDPOINTS = tuple((a + b) / 2 for a, b in zip(E2M1_VALUES, E2M1_VALUES[1:]))
# a tie on midpoint i rounds up to index i + 1 where that index is even (i odd): 0.75, 1.75, 3.5
E2M1_UP_ON_TIE = E2M1_MIDPOINTS[1::2]
E2M1_SIGNED = E2M1_VALUES + tuple(-v for v in E2M1_VALUES)  # indexed by the 4-bit code
E4M3_MAX = 448.0

SCALE_KINDS = ("fp16", "e8m0", "e4m3")
_TABLES: dict[tuple[str, torch.device], torch.Tensor] = {}
_NAMED = {"midpoints": E2M1_MIDPOINTS, "signed": E2M1_SIGNED}


def _table(name: str, device: torch.device) -> torch.Tensor:
    """An E2M1 table as a float32 tensor on ``device``, made once (the codecs call this per step)."""
    key = (name, device)
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(_NAMED[name], dtype=torch.float32, device=device)
    return _TABLES[key]


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Round already-scaled values to E2M1 codes (uint8 in 0..15); magnitudes above 6 saturate."""
    a = v.float().abs()
    idx = torch.bucketize(a, _table("midpoints", v.device))  # a tie with midpoint i gives i: down
    for t in E2M1_UP_ON_TIE:  # ...right when index i is even; else the tie goes up
        idx += a == t
    return ((v < 0).to(torch.uint8) << 3) | idx.to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes back to float32 values (code 8 is -0.0)."""
    return _table("signed", codes.device)[(codes & 15).long()]


def _e8m0(x: torch.Tensor) -> torch.Tensor:
    """Power-of-two scale as OCP MX defines it: 2^(floor(log2(amax)) - emax_elem), emax_elem=2."""
    exp = torch.floor(torch.log2(x)) - 2
    return torch.exp2(exp.clamp(-127, 127))


@dataclass(frozen=True)
class FP4Blocks:
    """Codes (uint8, one per value, in the input's shape), block scales and an optional global scale."""

    codes: torch.Tensor
    scale: torch.Tensor  # [n_blocks] float32 holding exactly the stored value
    global_scale: torch.Tensor | None  # NVFP4's per-tensor fp32 scale
    block: int
    scale_kind: str


def fp4_quantize(x: torch.Tensor, scale_kind: str = "fp16", block: int | None = None) -> FP4Blocks:
    """Quantize to E2M1 with one scale per ``block`` values along the last dim."""
    check_float_input(x)
    if scale_kind not in SCALE_KINDS:
        raise ValueError(f"scale_kind must be one of {SCALE_KINDS}, got {scale_kind!r}")
    block = block or (16 if scale_kind == "e4m3" else 32)
    g = PerGroup(block)
    blocks, view = to_blocks(x.float(), g)
    amax = blocks.abs().amax(dim=1) if blocks.numel() else blocks.new_zeros(blocks.shape[0])
    global_scale = None
    if scale_kind == "fp16":
        scale = (amax / E2M1_MAX).half().float()
        if not bool(torch.isfinite(scale).all()):
            raise ValueError("a block scale overflows float16")
    elif scale_kind == "e8m0":
        scale = _e8m0(torch.where(amax > 0, amax, torch.ones_like(amax)))
    else:
        tmax = amax.max() if amax.numel() else amax.new_tensor(0.0)
        global_scale = (tmax / (E2M1_MAX * E4M3_MAX)).clamp(min=torch.finfo(torch.float32).tiny)
        scale = (amax / E2M1_MAX / global_scale).clamp(max=E4M3_MAX)
        scale = scale.to(torch.float8_e4m3fn).float()
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    eff = safe * (global_scale if global_scale is not None else 1.0)
    codes = e2m1_encode(blocks / eff[:, None])
    return FP4Blocks(from_blocks(codes, view), safe, global_scale, block, scale_kind)


def fp4_dequantize(q: FP4Blocks, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    blocks, view = to_blocks(q.codes, PerGroup(q.block))
    eff = q.scale * (q.global_scale if q.global_scale is not None else 1.0)
    return from_blocks(e2m1_decode(blocks) * eff[:, None], view).to(dtype)
