"""lowbit's batched integer CPU kernel (``csrc/i8_gemm.c``) for W8A8 and W4A4: int8 dot products
(``vpdpbusd`` with AVX-512 VNNI) over register tiles of several tokens x 32 output rows.

The weight is the unsigned operand (INT8 codes + 128, INT4 codes + 8, one zero point per matrix)
and the activation codes the signed one, so each (token, row, group) product
``Σ u·x - z·Σx = Σ (u - z)·x`` is the exact int32 the GEMV kernels compute; the float32 steps are
theirs too (``fma(float(P), w_scale·x_scale, f)`` in group order; W4A4's INT8 outliers added as
``f + float(P_o)·(s_o·sx_o)``). So a token's result is the same bits from this kernel, from the
GEMVs and from the portable build (tested), whatever the batch.

Layout (:func:`pack`): panels of 16 rows, per 4 input channels a 64-byte vector ``[16 rows][4]``
(bytes), or per 8 channels ``[16 rows][4]`` bytes whose low nibbles are channels 0-3 and high
nibbles 4-7 (4-bit). Scales ``[out/16, groups, 16]``.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowbit.kernels.cpu import act_sym
from lowbit.kernels.cpu.kernel_library import KernelLibrary
from lowbit.kernels.cpu.native_args import require_cpu, require_state
from lowbit.kernels.linear_params import NonFiniteActivations

PANEL = 16  # rows per panel
PORTABLE_FLAGS = ("-O3", "-DPANEL_NO_SIMD")


def _bind(lib: ctypes.CDLL) -> None:
    i64, i32, vp, ci = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int
    lib.i8_gemm.argtypes = [vp, ci, vp, i32, i64, i64, i64, i64, vp, vp, i64, vp, vp, i64, vp, i64, vp, vp, ci]
    lib.i8_gemm.restype = ci
    lib.i8_gemm_simd.restype = ci
    lib.i8_gemm_amx.restype = ci
    act_sym.bind(lib.i8_act_sym)
    lib.i8_gemm_linear.argtypes = [vp, ci, vp, i32, i64, i64, i64, i64, vp, vp, i64, i64, i64, ci, ctypes.c_float, ci,
                                   vp, vp, ci, i64, vp, ci, ci]
    lib.i8_gemm_linear.restype = ci
    if hasattr(lib, "i8_input_order_new"):  # absent from builds of older sources (scripts/*_ab.py load them)
        lib.i8_gemm_linear_ordered.argtypes = lib.i8_gemm_linear.argtypes
        lib.i8_gemm_linear_ordered.restype = ci
        lib.i8_input_order_new.argtypes = [vp, i64, ctypes.POINTER(vp)]
        lib.i8_input_order_new.restype = ci
        lib.i8_input_order_free.argtypes = [vp]
        lib.i8_input_order_free.restype = None
    lib.i8_round_bf16.argtypes = [vp, vp, i64]
    lib.i8_round_bf16.restype = None


_LIB = KernelLibrary("i8 gemm", "i8_gemm.c", _bind)

# library(flags=None): the best build, or one with ``flags`` (e.g. PORTABLE_FLAGS); None if none builds
library, available, _built = _LIB.get, _LIB.available, _LIB.built


def simd(lib: ctypes.CDLL | None = None) -> int:
    """0 (portable loop), 256 or 512 (vector width), +1 where the dot product is VNNI's vpdpbusd."""
    lib = lib or library()
    return 0 if lib is None else int(lib.i8_gemm_simd())


def amx(lib: ctypes.CDLL | None = None) -> bool:
    """Whether this build runs AMX-INT8 tiles, from 8 tokens for INT8 weights and 20 for 4-bit ones
    (the ``amx`` ISA variant, on a CPU whose OS granted tile state); the integers, and so the bits,
    are the vector tiles'."""
    lib = lib or library()
    return lib is not None and bool(lib.i8_gemm_amx())


def round_bf16(x: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """float32 ``x`` → bfloat16 by the kernels' output rounding (meant to equal ``x.to(torch.bfloat16)``)."""
    lib = _built(lib)
    require_cpu("round_bf16", x)
    x = x.float().contiguous()
    y = torch.empty(x.shape, dtype=torch.bfloat16)
    lib.i8_round_bf16(x.data_ptr(), y.data_ptr(), x.numel())
    return y


@dataclass
class I8Panels:
    panels: torch.Tensor  # uint8, see pack
    scale: torch.Tensor  # float32 [out_pad / 16, n_groups, 16] (padded rows: 0)
    zero: int  # 128 (INT8 codes) or 8 (INT4)
    nibbles: bool
    group: int
    k_pad: int
    out: int


def panel_codes(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes ``[out_pad, k_pad]`` (out_pad a multiple of 16, k_pad of 8) → panel bytes."""
    out_pad, k_pad = u.shape
    u = u.to(torch.uint8)
    if bits == 8:
        return u.reshape(out_pad // PANEL, PANEL, k_pad // 4, 4).transpose(1, 2).contiguous()
    q = u.reshape(out_pad // PANEL, PANEL, k_pad // 8, 2, 4)
    return (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).transpose(1, 2).contiguous()


def panel_rows(t: torch.Tensor, out_pad: int) -> torch.Tensor:
    """Per-(row, group) values ``[out, groups]`` → ``[out_pad / 16, groups, 16]`` (padded rows 0)."""
    t = F.pad(t, (0, 0, 0, out_pad - t.shape[0]))
    return t.reshape(out_pad // PANEL, PANEL, -1).transpose(1, 2).contiguous()


def pack(codes: torch.Tensor, scale: torch.Tensor, bits: int, group: int, k_pad: int) -> I8Panels:
    """Signed symmetric codes ``[out, n]`` (INT8 or INT4 values) and their scales ``[out, groups]``
    (groups of ``group`` channels over ``k_pad`` ≥ n; both multiples of the 8 channels a 4-bit
    panel step holds, of 4 for 8 bits) → :class:`I8Panels`. ValueError otherwise: the kernel steps
    over whole groups of ``group`` (0 would sum nothing) and reads one scale per group."""
    out, n = codes.shape
    step = {4: 8, 8: 4}.get(bits)
    if step is None or k_pad < n or k_pad % step or (k_pad and (group <= 0 or group % step)):
        raise ValueError(f"i8 gemm: {bits}-bit panels need 4 or 8 bits, k_pad >= {n} and a group > 0, both multiples "
                         f"of {step or 4}; got k_pad {k_pad}, group {group}")
    if k_pad and tuple(scale.shape) != (out, -(-k_pad // group)):
        raise ValueError(f"i8 gemm: scales must be [{out}, {-(-k_pad // group)}] for groups of {group} over {k_pad} "
                         f"channels, got {tuple(scale.shape)}")
    zero = 128 if bits == 8 else 8
    out_pad = -(-out // PANEL) * PANEL
    u = F.pad(codes.to(torch.int16) + zero, (0, k_pad - n, 0, out_pad - out))
    return I8Panels(panel_codes(u, bits), panel_rows(scale.float(), out_pad), zero, bits != 8, group, k_pad, out)


def act_codes(x: torch.Tensor, n_outliers: int, w: I8Panels, bits: int, clip: float,
              lib: ctypes.CDLL | None = None, *, half: bool = False) -> act_sym.NativeCodes:
    """Per-token symmetric codes of ``x [t, in]`` (outlier channels last) in ``w``'s groups."""
    lib = _built(lib)
    require_state(w, I8Panels, "i8 gemm")
    return act_sym.symmetric_codes(lib.i8_act_sym, x, n_outliers, w.group, w.scale.shape[1], w.k_pad, bits, clip, half)


def run_codes(c: act_sym.NativeCodes, w: I8Panels, outliers: I8Panels | None = None,
              lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``[t, out]`` float32 (no bias) from codes laid out for ``w`` (:func:`act_codes`), plus the INT8
    outlier part when ``outliers`` holds its panels (the C reads ``c.outlier`` as int16 ``[t, k]``,
    ``c.outlier_scale`` as ``[t]``, the panels as bytes: all checked)."""
    lib = _built(lib)
    require_state(w, I8Panels, "i8 gemm")
    require_cpu("i8 gemm", c.xq, c.scale, c.outlier, c.outlier_scale, w.panels, w.scale)
    t, ng = c.xq.shape[0], w.scale.shape[1]
    if c.xq.dim() != 2 or c.xq.shape[1] != w.k_pad or tuple(c.scale.shape) != (t, ng) or c.xq.dtype != torch.int16:
        raise ValueError(f"i8 gemm: codes must be int16 [t, {w.k_pad}] with scales [t, {ng}], got "
                         f"{c.xq.dtype} {tuple(c.xq.shape)} / {tuple(c.scale.shape)}")
    out_pad = PANEL * w.scale.shape[0]
    y = torch.empty(t, out_pad)
    o, ko = (outliers, c.outlier.shape[-1]) if outliers is not None and c.outlier.shape[-1] else (None, 0)
    if o is not None:
        _check_outlier_panels(o, w, ko)
        if c.outlier.dtype != torch.int16 or tuple(c.outlier.shape) != (t, ko) or c.outlier_scale.numel() != t:
            raise ValueError(f"i8 gemm: outlier codes must be int16 [{t}, {ko}] with {t} scales, got "
                             f"{c.outlier.dtype} {tuple(c.outlier.shape)} / {c.outlier_scale.numel()}")
    xq, sx = c.xq.contiguous(), c.scale.float().contiguous()  # held: the C call reads their memory
    xo, sxo = c.outlier.contiguous(), c.outlier_scale.float().contiguous()
    if t and lib.i8_gemm(w.panels.data_ptr(), int(w.nibbles), w.scale.data_ptr(), w.zero, out_pad, w.k_pad, w.group,
                         ng, xq.data_ptr(), sx.data_ptr(), t,
                         o.panels.data_ptr() if o else None, o.scale.data_ptr() if o else None, o.k_pad if o else 0,
                         xo.data_ptr() if o else None, ko, sxo.data_ptr() if o else None, y.data_ptr(),
                         torch.get_num_threads()):
        raise MemoryError("i8 gemm: out of memory for its activation buffers")
    return y[:, :w.out] if out_pad != w.out else y



def _check_outlier_panels(o: I8Panels, w: I8Panels, k: int) -> None:
    """ValueError unless ``o`` holds INT8 panels of ``k`` channels for ``w``'s rows: the C reads them
    as bytes with one scale per row, over ``o.k_pad`` channels (k rounded up to 4)."""
    require_state(o, I8Panels, "i8 gemm outliers")
    require_cpu("i8 gemm outliers", o.panels, o.scale)
    if o.nibbles or o.scale.shape[0] != w.scale.shape[0] or o.scale.shape[1] != 1 or not k <= o.k_pad < k + 4:
        raise ValueError(f"i8 gemm: outlier panels do not match the weight (INT8 panels of {k} channels and "
                         f"{PANEL * w.scale.shape[0]} rows needed)")


class InputOrder:
    """A layer's input reorder ``perm`` (int64 ``[n]``) checked and planned in C once, for every
    call of :func:`linear` that reads x through it (a per-call plan cost 2-6 µs). The plan is a
    build's own (its vector width), so one is made per library, on first use; freed with this object.
    Pickles and deep copies carry ``perm`` and plan again (a plan is a raw pointer)."""

    def __init__(self, perm: torch.Tensor, lib: ctypes.CDLL | None = None) -> None:
        if (not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.dtype.is_floating_point or perm.is_complex()
                or perm.dtype == torch.bool):
            raise ValueError(f"i8 gemm: an input order must be a 1-D integer tensor, got {_describe(perm)}")
        self.perm = perm.to(torch.int64, copy=True).cpu().contiguous()
        self.n = self.perm.numel()
        self._plans: dict[int, tuple[ctypes.CDLL, int]] = {}
        self._lock = threading.Lock()
        self.plan(_built(lib))  # a bad index is an error here, when the layer is prepared

    def plan(self, lib: ctypes.CDLL) -> int:
        """The plan's address for ``lib`` (made on its first use)."""
        got = self._plans.get(id(lib))
        if got is not None:
            return got[1]
        with self._lock:
            got = self._plans.get(id(lib))
            if got is None:
                ptr = ctypes.c_void_p()
                rc = lib.i8_input_order_new(self.perm.data_ptr(), self.n, ctypes.byref(ptr))
                if rc == -3:
                    raise ValueError(f"i8 gemm: the input permutation holds an index outside [0, {self.n})"
                                     + (" (more than 2^31 - 1 channels)" if self.n > 2 ** 31 - 1 else ""))
                if rc:
                    raise MemoryError("i8 gemm: out of memory for an input order's plan")
                got = self._plans[id(lib)] = (lib, ptr.value)
        return got[1]

    def __del__(self) -> None:
        for lib, ptr in getattr(self, "_plans", {}).values():
            lib.i8_input_order_free(ptr)
        self._plans = {}

    def __reduce__(self):
        return InputOrder, (self.perm,)


def _describe(t) -> str:
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def linear_args(w: I8Panels, outliers: I8Panels | None, n_outliers: int, n_in: int, bits: int, clip: float,
                half: bool = False) -> tuple:
    """The weight half of ``i8_gemm_linear``'s arguments (:func:`linear`), built once per layer: they
    hold raw pointers, so whoever keeps the tuple keeps ``w`` and ``outliers`` too."""
    require_state(w, I8Panels, "i8 gemm")
    require_cpu("i8 gemm", w.panels, w.scale)
    n = n_in - n_outliers
    if n < 0 or w.k_pad < n or w.group * w.scale.shape[1] < n or not 2 <= bits <= 8:
        raise ValueError(f"i8 gemm: {n_in} inputs with {n_outliers} outliers do not fit panels over {w.k_pad} channels")
    if n_outliers:
        if outliers is None:
            raise ValueError("i8 gemm: outlier panels do not match the weight (none given)")
        _check_outlier_panels(outliers, w, n_outliers)
    o = outliers if n_outliers else None
    return (w.panels.data_ptr(), int(w.nibbles), w.scale.data_ptr(), w.zero, PANEL * w.scale.shape[0], w.k_pad,
            w.group, w.scale.shape[1], o.panels.data_ptr() if o else None, o.scale.data_ptr() if o else None,
            o.k_pad if o else 0, n_in, n, bits, clip, int(half))


def linear(x: torch.Tensor, args: tuple, out: int, perm: torch.Tensor | InputOrder | None = None,
           keep_bf16: bool = False, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x [..., n_in]`` (read as ``x[..., perm]`` when perm is given: an :class:`InputOrder` planned
    once, or int64 indices planned for this call) → ``[..., out]`` float32 (no bias): activation
    codes, both exact products and the rescale in one C call, the same bits as :func:`act_codes`
    then :func:`run_codes`. With ``keep_bf16`` a bfloat16 ``x`` gives bfloat16, rounded in C as
    torch's ``.to(torch.bfloat16)`` rounds (no conversion pass in torch)."""
    lib = _built(lib)
    n_in, out_pad = args[11], args[4]
    if x.dim() == 0 or x.shape[-1] != n_in or not x.is_floating_point() or not x.is_cpu:
        raise ValueError(f"i8 gemm: needs a floating-point CPU tensor [..., {n_in}], got {x.dtype} {tuple(x.shape)}")
    if isinstance(perm, InputOrder):
        if perm.n != n_in:
            raise ValueError(f"i8 gemm: an input order of {perm.n} channels for a linear of {n_in} inputs")
        entry, order = lib.i8_gemm_linear_ordered, perm.plan(lib)
    else:
        if perm is not None and (not isinstance(perm, torch.Tensor) or perm.dtype != torch.int64
                                 or tuple(perm.shape) != (n_in,) or not perm.is_contiguous() or not perm.is_cpu):
            raise ValueError(f"i8 gemm: the input permutation must be contiguous int64 [{n_in}] on the CPU")
        entry, order = lib.i8_gemm_linear, None if perm is None else perm.data_ptr()
    if x.dtype != torch.bfloat16 and x.dtype != torch.float32:
        x = x.float()
    x = x.contiguous()
    bf16 = int(x.dtype == torch.bfloat16)
    y_bf16 = int(bf16 and keep_bf16)
    y = torch.empty(*x.shape[:-1], out_pad, dtype=torch.bfloat16 if y_bf16 else torch.float32)
    rc = entry(*args, order, x.data_ptr(), bf16, x.numel() // n_in, y.data_ptr(), y_bf16, torch.get_num_threads())
    if rc == -2:
        raise NonFiniteActivations()
    if rc == -3:
        raise ValueError("i8 gemm: the input order's plan is not this build's" if isinstance(perm, InputOrder)
                         else f"i8 gemm: the input permutation holds an index outside [0, {n_in})")
    if rc:
        raise MemoryError("i8 gemm: out of memory for its activation buffers")
    return y[..., :out] if out_pad != out else y


def linear_in_dtype(x: torch.Tensor, args: tuple, out: int, bias: torch.Tensor | None,
                    perm: torch.Tensor | InputOrder | None = None) -> torch.Tensor:
    """:func:`linear` returning x's dtype for float32 and bfloat16 (others: float32): bfloat16 rounded
    in C when there is no bias, else the bias added in float32 before torch's rounding."""
    y = linear(x, args, out, perm, keep_bf16=bias is None)
    if bias is None:
        return y
    y = y + bias
    return y.to(x.dtype) if x.dtype == torch.bfloat16 else y
