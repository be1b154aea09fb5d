"""The integer kinds' activation codes computed in C (``csrc/act_sym.h``), the same bits as
:func:`lowbit.kernels.token_codes.quantize_tokens` (tested): one call instead of a dozen torch
operators per linear, each with its own pass and thread fork/join, and the codes come out as the
zero-padded int16 rows the native GEMV kernels read."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from lowbit.kernels.cpu.native_args import require_cpu
from lowbit.kernels.linear_params import NonFiniteActivations


@dataclass
class NativeCodes:
    xq: torch.Tensor  # int16 [t, kp]: normal-channel codes, zero past n
    scale: torch.Tensor  # float32 [t, ng]
    xsum: torch.Tensor  # int32 [t, ng]: each group's code sum (for the weight's zero point)
    outlier: torch.Tensor  # int16 [t, k]: INT8 codes of the outlier channels
    outlier_scale: torch.Tensor  # float32 [t]


def bind(fn) -> None:
    i64, vp, ci = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [vp, ci, i64, i64, i64, i64, i64, i64, ci, ctypes.c_float, ci, vp, vp, vp, vp, vp, ci]
    fn.restype = i64


def symmetric_codes(fn, x: torch.Tensor, n_outliers: int, group: int, ng: int, kp: int, bits: int,
                    clip: float, half: bool = False) -> NativeCodes:
    """``x [t, in]`` (outlier channels last) → codes of ``n = in - n_outliers`` normal channels in
    ``ng`` groups of ``group`` padded to ``kp`` (scales by compressed-tensors' rule when ``half``,
    :attr:`ActSpec.half_range`), and INT8 outlier codes; ``fn`` is a library's ``*_act_sym`` entry
    point."""
    if x.dim() != 2:
        raise ValueError(f"activations must be [tokens, features], got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"activations must be floating point, got {x.dtype}")
    require_cpu("native activation codes", x)
    t, n_in = x.shape
    n = n_in - n_outliers
    if n < 0 or kp < n or ng * group < n or not 2 <= bits <= 8:
        raise ValueError(f"activation layout: {n_in} features, {n_outliers} outliers, {ng} groups of {group}, "
                         f"padded {kp}, {bits} bits")
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.float()
    x = x.contiguous()
    xq = torch.empty(t, kp, dtype=torch.int16)
    sx = torch.empty(t, ng)
    xsum = torch.empty(t, ng, dtype=torch.int32)
    oq = torch.empty(t, n_outliers, dtype=torch.int16)
    osx = torch.empty(t)
    if t and fn(x.data_ptr(), int(x.dtype == torch.bfloat16), t, n_in, n, group, ng, kp, bits, clip, int(half),
                xq.data_ptr(), sx.data_ptr(), xsum.data_ptr(), oq.data_ptr(), osx.data_ptr(), torch.get_num_threads()):
        raise NonFiniteActivations()
    return NativeCodes(xq, sx, xsum, oq, osx)
