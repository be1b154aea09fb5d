"""lowbit's own 4-bit-weight CPU kernel (``csrc/w4_gemv.c``), for W4A16 and W4A4.

torch's packed-int4 CPU matmul streams the weight at well under the memory bandwidth at batch 1,
so decode gains little from 4-bit weights. This kernel unpacks 64 codes per 32 bytes with a mask,
a shift and byte unpacks and multiplies them with int16 activation codes (``vpmaddwd``): each
(row, group) product is an exact int32 (zero point subtracted as an integer), and the only
roundings are the float32 rescale and the sum over groups. 4 output rows share every activation
load; 4 tokens share every unpack.

W4A16 (:func:`run`): the activations are rounded to int16 per weight group (|error| ≤ scale/2,
scale = absmax/32767, i.e. 2^-16 of the group's absmax, far finer than bfloat16's 2^-8 relative);
tested against the float64 reference within Σ_g (scale_g/2)·Σ|w| + 2^-20·Σ|x||w|. A token with a
NaN/Inf activation gets NaN outputs. W4A4 (:func:`run_codes`): its INT4 activation codes go in as
they are, so the result is the exact integer reference up to float32 rescaling.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowbit.kernels.cpu import a16_linear, act_sym
from lowbit.kernels.cpu.kernel_library import KernelLibrary
from lowbit.kernels.cpu.native_args import CachedPointers, require_cpu, require_state
from lowbit.kernels.linear_params import KernelError, LinearParams

CHUNK = 64  # input channels per 32-byte chunk of codes
PORTABLE_FLAGS = ("-O3", "-DW4_NO_SIMD")


def _bind(lib: ctypes.CDLL) -> None:
    i64, vp, ci = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.w4_linear.argtypes = [vp, vp, vp, i64, i64, i64, i64, i64, vp, ci, i64, vp, ci, ci]
    lib.w4_linear.restype = ci
    lib.w4_gemv_codes.argtypes = [vp, vp, vp, i64, i64, i64, i64, vp, vp, vp, i64, vp, ci]
    act_sym.bind(lib.w4_act_sym)


_LIB = KernelLibrary("w4", "w4_gemv.c", _bind)


# library(flags=None): the best build, or one with ``flags`` (e.g. PORTABLE_FLAGS); None if none builds
library, available, _built = _LIB.get, _LIB.available, _LIB.built


# byte c of a chunk holds channel _LOW[c] in its low nibble and _LOW[c] + 32 in its high one: the
# order in which AVX2's per-128-bit-lane byte unpacks hand the nibbles to 16-lane int16 products
_LOW = torch.tensor([(c & 15) // 8 * 16 + (c >> 4) * 8 + (c & 7) for c in range(32)])


@dataclass
class W4GemvPrepared(CachedPointers):
    packed: torch.Tensor  # uint8 [out_pad / 4, kp / 64, 4, 32]
    scale: torch.Tensor  # float32 [out_pad / 4, n_groups, 4] (padded rows: 0)
    zero: torch.Tensor  # int32 [out_pad / 4, n_groups, 4]
    group: int
    n_in: int
    k_pad: int
    out: int
    bias: torch.Tensor | None
    method: str = "native"

    def __post_init__(self) -> None:
        # the weight half of w4_linear's arguments, built once: a decode step calls every layer
        # (rebuilt by copies and unpickling)
        require_cpu("w4 gemv kernel", self.packed, self.scale, self.zero)
        self.args = (self.packed.data_ptr(), self.scale.data_ptr(), self.zero.data_ptr(), 4 * self.scale.shape[0],
                     self.k_pad, self.group, self.scale.shape[1], self.n_in)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Unsigned codes ``[out, kp]`` (0..15; out a multiple of 4, kp of 64) → the kernel's bytes
    ``[out/4, kp/64, 4, 32]``: 4 rows interleaved chunk by chunk, one sequential stream."""
    out, kp = codes.shape
    c = codes.to(torch.uint8).reshape(out, kp // CHUNK, CHUNK)
    b = c[:, :, _LOW] | (c[:, :, _LOW + 32] << 4)  # [out, chunks, 32]
    return b.reshape(out // 4, 4, kp // CHUNK, 32).transpose(1, 2).contiguous()


MAX_GROUP = 4096  # a group's int32 product: |sum| ≤ g·15·32767 < 2^31


def check_group(n: int, group: int) -> int:
    """The kernel's group size for ``n`` input channels (``group`` 0 = whole row), or KernelError."""
    g = group or n
    if g % CHUNK and g != n:
        raise KernelError(f"w4 native kernel needs a group size that is a multiple of {CHUNK}, got {g}")
    if g > MAX_GROUP:
        raise KernelError(f"w4 native kernel: group {g} > {MAX_GROUP} could overflow its int32 group sums")
    return g


def usable(p: LinearParams) -> bool:
    """Whether this kernel builds here and :func:`check_group` accepts ``p``'s normal channels:
    the W4A16 and W4A4 defaults pick it then, and fall back to another method otherwise."""
    try:
        check_group(p.n_normal, p.group)
    except KernelError:
        return False
    return available()


def prepare(p: LinearParams, kinds: tuple[str, ...] = ("w4a16",)) -> W4GemvPrepared:
    """The packed normal channels of ``p`` (outlier channels are the caller's)."""
    p.check()
    if p.kind not in kinds:
        raise KernelError(f"w4 native kernel got kind {p.kind}, expected {' or '.join(kinds)}")
    if p.n_outliers and p.kind == "w4a16":
        raise KernelError("w4a16 native kernel has no outlier channels")
    out, n = p.codes.shape
    g = check_group(n, p.group)
    kp, out_pad = -(-n // CHUNK) * CHUNK, -(-out // 4) * 4
    if p.zero is None:
        codes, zero = p.codes.to(torch.int16) + 8, torch.full(p.scale.shape, 8, dtype=torch.int32)
    else:
        codes, zero = p.codes.to(torch.int16), p.zero.to(torch.int32)
    # padded channels meet zero activations; padded rows have zero scales and are sliced off
    codes = F.pad(codes, (0, kp - n, 0, out_pad - out))

    def blocks(t: torch.Tensor) -> torch.Tensor:  # [out, groups] → [out_pad/4, groups, 4]
        t = F.pad(t, (0, 0, 0, out_pad - out))
        return t.reshape(out_pad // 4, 4, -1).transpose(1, 2).contiguous()

    return W4GemvPrepared(pack(codes), blocks(p.scale.float()), blocks(zero), g if g != n else kp, n, kp, out,
                          p.bias)


def run(x: torch.Tensor, w: W4GemvPrepared, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x [..., in]`` (float32 or bfloat16; others are converted to float32) → ``[..., out]`` of
    x's dtype."""
    lib = _built(lib)
    require_state(w, W4GemvPrepared, "w4 gemv kernel")
    return a16_linear.call(lib.w4_linear, w.args, w.n_in, w.args[3], w.out, w.bias, x, "w4 gemv kernel")


def run_codes(codes: torch.Tensor, scale: torch.Tensor, w: W4GemvPrepared, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Σ_groups scale[t, g]·w_scale[o, g]·(exact integer group product) for activation codes
    ``codes [t, n]`` (int8, uint8 or int16: other dtypes are refused, their cast to int16 would wrap
    or truncate) and their group scales ``scale [t, groups]`` → ``[t, out]`` float32 (no bias)."""
    lib = _built(lib)
    require_state(w, W4GemvPrepared, "w4 native kernel")
    ng = w.scale.shape[1]
    require_cpu("w4 native kernel", codes, scale)
    if codes.dim() != 2 or codes.shape[1] != w.n_in:
        raise ValueError(f"w4 native kernel: codes must be [tokens, {w.n_in}], got {tuple(codes.shape)}")
    if codes.dtype not in (torch.int8, torch.uint8, torch.int16):
        raise ValueError(f"w4 native kernel: codes must be int8, uint8 or int16, got {codes.dtype}")
    t, n = codes.shape
    if tuple(scale.shape) != (t, ng):
        raise ValueError(f"w4 native kernel: scale must be [{t}, {ng}] (tokens, groups), got {tuple(scale.shape)}")
    xq = F.pad(codes.to(torch.int16), (0, w.k_pad - n)).contiguous()
    xsum = F.pad(xq, (0, ng * w.group - w.k_pad)).reshape(t, ng, w.group).sum(-1, dtype=torch.int32)
    return _gemv_codes(lib, xq, scale.float().contiguous(), xsum.contiguous(), w)


def _gemv_codes(lib, xq: torch.Tensor, sx: torch.Tensor, xsum: torch.Tensor, w: W4GemvPrepared) -> torch.Tensor:
    """The C call on codes already laid out: xq int16 [t, kp], sx float32 / xsum int32 [t, groups]."""
    t, ng = xq.shape[0], w.scale.shape[1]
    out_pad = 4 * w.scale.shape[0]
    y = torch.empty(t, out_pad)
    if t:
        lib.w4_gemv_codes(w.packed.data_ptr(), w.scale.data_ptr(), w.zero.data_ptr(), out_pad, w.k_pad, w.group, ng,
                          xq.data_ptr(), sx.data_ptr(), xsum.data_ptr(), t, y.data_ptr(), torch.get_num_threads())
    return y[:, :w.out] if out_pad != w.out else y


def quantize_and_run(x: torch.Tensor, w: W4GemvPrepared, n_outliers: int, bits: int, clip: float,
                     lib: ctypes.CDLL | None = None, *, half: bool = False) -> tuple[torch.Tensor, act_sym.NativeCodes]:
    """W4A4's normal channels in two C calls: ``x [t, in]`` (outlier channels last) → per-token
    symmetric ``bits``-bit codes per weight group (:mod:`.native_act`) → the GEMV; returns ``[t,
    out]`` float32 (no bias) and the codes (the caller's outlier product needs them)."""
    lib = _built(lib)
    require_state(w, W4GemvPrepared, "w4 native kernel")
    if x.dim() != 2 or x.shape[1] != w.n_in + n_outliers:
        raise ValueError(f"w4 native kernel: activations must be [tokens, {w.n_in + n_outliers}], got {tuple(x.shape)}")
    ng = w.scale.shape[1]
    c = act_sym.symmetric_codes(lib.w4_act_sym, x, n_outliers, w.group, ng, w.k_pad, bits, clip, half)
    return _gemv_codes(lib, c.xq, c.scale, c.xsum, w), c
