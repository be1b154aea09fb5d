"""Block scales beyond float16's range: the *extended* scale, so finite input never decodes to NaN/Inf.

A block's scale is an fp16 number. When a block is finite but its scale would overflow fp16
(|scale| > 65504: INT8 blocks beyond 8.4e6, INT6 2.1e6, INT4 524032, INT3 262016, FP4 393120),
the scale is stored in the fp16 NaN space instead, where no fp16 scale ever lives:

    bits = sign << 15 | 0x7C00 | p,  p = (k - 15) << 2 | m  (1 <= p < 0x200)
    value = ±2^k · (1 + m/4),        k = 16 .. 127, m = 0 .. 3

i.e. two significant bits and any float32 exponent. The encoder takes the smallest such value
≥ |s32| (the float32 scale: signed absmax / qmin, or absmax / 6 for FP4) with s32's sign, so no
code clips because of the scale. A code whose value |q·s| would pass BF16_MAX moves one step
toward zero, so every decoded value is finite in float32 and bfloat16. Error of such a block:
at most 2|s| per value (the bound ``accuracy.quantization_bound`` uses for it).

A poisoned block (NaN/Inf input) keeps the scale 0x7E00 (bit 9 set, never an extended scale) and
decodes to NaN, as before; readers that do not know extended scales see NaN there too. Scale bits
no encoder writes (fp16 ±inf, or a payload with k outside 16..127) decode to NaN as well, in every
implementation alike: a peer's corrupt scale poisons its block visibly and the same on every rank,
instead of decoding to ±inf, to zero or to a value of the wrong sign.
"""

from __future__ import annotations

import math
import struct

import torch

BF16_MAX = 3.3895313892515355e38  # the largest finite bfloat16 (0x7F7F)
EXT_STEPS = 112  # k - 15 of the largest extended scale (2^127 · 1.75)
E2M1_MAX = 6.0


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def encode_py(s32: float) -> tuple[int, float]:
    """(fp16 bits, value) of the extended scale for the float32 scale ``s32`` (finite, |s32| > 65504)."""
    b = struct.unpack("<I", struct.pack("<f", s32))[0]
    mag = ((b & 0x7FFFFFFF) + 0x1FFFFF) & 0x7FE00000  # round the magnitude up to 2 significant bits
    k, m = (mag >> 23) - 127, (mag >> 21) & 3
    value = struct.unpack("<f", struct.pack("<I", mag))[0]
    sign = b >> 31
    return sign << 15 | 0x7C00 | (k - 15) << 2 | m, -value if sign else value


def is_ext_py(bits: int) -> bool:
    return bits & 0x7E00 == 0x7C00 and 1 <= (bits & 0x1FF) >> 2 <= EXT_STEPS


def is_void_py(bits: int) -> bool:
    """Scale bits that are neither an fp16 number nor an extended scale: the block decodes to NaN."""
    return bits & 0x7C00 == 0x7C00 and not is_ext_py(bits)


def value_py(bits: int) -> float:
    """The value of an extended scale's bits."""
    p = bits & 0x1FF
    v = math.ldexp(1 + (p & 3) / 4, 15 + (p >> 2))
    return -v if bits & 0x8000 else v


def code_cap_py(s: float) -> float:
    """How many steps of |s| fit below BF16_MAX (float32 division), the limit on |code|."""
    return _f32(_f32(BF16_MAX) / abs(s))


def scale_values(h16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 values, extended mask) of fp16 scales, extended ones decoded; no host sync."""
    bits = h16.view(torch.int16).to(torch.int32) & 0xFFFF
    p = bits & 0x1FF
    ext = ((bits & 0x7E00) == 0x7C00) & ((p >> 2) >= 1) & ((p >> 2) <= EXT_STEPS)
    mag = ((p >> 2) + 142).bitwise_left_shift(23) | (p & 3).bitwise_left_shift(21)
    v = mag.view(torch.float32)
    v = torch.where((bits & 0x8000) != 0, -v, v)
    plain = torch.where((bits & 0x7C00) == 0x7C00, torch.full_like(v, float("nan")), h16.float())  # is_void_py
    return torch.where(ext, v, plain), ext


def encode(s32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp16 scales carrying the extended bits, float32 values) for float32 scales ``s32``
    (meaningful where finite and beyond fp16; other entries are don't-cares)."""
    b = s32.view(torch.int32)
    mag = ((b & 0x7FFFFFFF) + 0x1FFFFF) & 0x7FE00000
    p = (((mag >> 23) - 142).clamp_(1, 0x7F) << 2) | ((mag >> 21) & 3)  # clamp: don't-care entries stay in range
    neg = b < 0
    h = (p | 0x7C00) - neg.to(torch.int32) * 0x8000  # the int16 value of the bits
    v = mag.view(torch.float32)
    return h.to(torch.int16).view(torch.float16), torch.where(neg, -v, v)


def code_cap(s: torch.Tensor) -> torch.Tensor:
    """Per block: BF16_MAX / |s| (float32), the limit on |code| that keeps |code·s| ≤ BF16_MAX."""
    return torch.tensor(BF16_MAX, dtype=torch.float32, device=s.device) / s.abs()


def fp4_cap(cap: torch.Tensor) -> torch.Tensor:
    """The largest E2M1 magnitude within ``cap``: 6, or 4 where 6 steps would pass BF16_MAX
    (an extended FP4 scale is at most 1.25·absmax/6, so cap ≥ 4.8 and 4 always fits)."""
    return torch.where(cap >= E2M1_MAX, E2M1_MAX, 4.0)
