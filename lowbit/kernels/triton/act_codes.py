"""Triton dynamic per-token activation quantization, with the input-channel reordering fused
(gather by ``perm`` while loading): one program per (token, group), plus one per token for the
INT8 outlier block. Same arithmetic as :func:`lowbit.kernels.token_codes.quantize_tokens`
(signed absmax of the group by first-index argmax, x clip / -2^(b-1), or by compressed-tensors'
rule absmax x clip / ((2^b - 1) / 2); zero → 1, IEEE division, round half to even, clamp); tested
equal to it under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch

from lowbit.kernels.token_codes import IntActivation
from lowbit.kernels.linear_params import ActSpec, KernelError

from lowbit.kernels.triton import tl, triton


if triton is not None:

    @triton.jit
    def _round_half_even(v):
        f = tl.floor(v)
        d = v - f
        odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
        return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)

    @triton.jit
    def _quant_block(x, valid, ridx, qmin: tl.constexpr, qmax: tl.constexpr, clip, HALF: tl.constexpr):
        ax = tl.where(valid, tl.abs(x), 0.0)
        if HALF:  # compressed-tensors' rule: a positive scale over half the code range
            s = tl.math.div_rn(tl.max(ax, 0) * clip, (qmax - qmin) / 2.0)
        else:
            idx = tl.argmax(ax, 0, tie_break_left=True)
            v = tl.sum(tl.where(ridx == idx, x, 0.0), 0)
            s = tl.math.div_rn(v * clip, qmin)  # IEEE division, as torch's (a plain '/' may be approximate on GPUs)
        s = tl.where(s == 0.0, 1.0, s)
        q = _round_half_even(tl.math.div_rn(x, s))
        q = tl.minimum(tl.maximum(q, qmin), qmax)
        return q.to(tl.int8), s

    @triton.jit
    def _quant_store(x_ptr, perm_ptr, c_ptr, s_ptr, row, first, n_valid, s_x, scale_off, clip,
                     L: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr, HAS_PERM: tl.constexpr,
                     HALF: tl.constexpr):
        """Quantize channels ``first .. first+n_valid`` of ``row`` (reordered) as one block; store
        the codes at ``c_ptr[0 .. n_valid)`` and the scale at ``s_ptr[scale_off]``."""
        r = tl.arange(0, L)
        valid = r < n_valid
        src = first + r
        if HAS_PERM:
            src = tl.load(perm_ptr + first + r, mask=valid, other=0)
        x = tl.load(x_ptr + row * s_x + src, mask=valid, other=0.0).to(tl.float32)
        q, s = _quant_block(x, valid, r, QMIN, QMAX, clip, HALF)
        tl.store(c_ptr + r, q, mask=valid)
        tl.store(s_ptr + scale_off, s)

    @triton.jit
    def _act_quant_kernel(x_ptr, perm_ptr, c_ptr, s_ptr, oc_ptr, os_ptr, N, K, NG, s_x, s_c, s_s, s_oc, clip,
                          G: tl.constexpr, KB: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
                          HAS_PERM: tl.constexpr, HALF: tl.constexpr):
        # The two branches live in helpers: compiled Triton needs variables of one shape across
        # an if/else, and a group (G) and the outlier block (KB) have different shapes.
        row = tl.program_id(0)
        gi = tl.program_id(1)
        if gi < NG:
            _quant_store(x_ptr, perm_ptr, c_ptr + row * s_c + gi * G, s_ptr, row, gi * G, tl.minimum(N - gi * G, G),
                         s_x, row * s_s + gi, clip, G, QMIN, QMAX, HAS_PERM, HALF)
        else:
            _quant_store(x_ptr, perm_ptr, oc_ptr + row * s_oc, os_ptr, row, N, K, s_x, row, 1.0,
                         KB, -128.0, 127.0, HAS_PERM, False)


def quantize_tokens_triton(x: torch.Tensor, act: ActSpec, n_outliers: int = 0,
                           perm: torch.Tensor | None = None) -> IntActivation:
    """``x [t, in]`` in the model's channel order; ``perm`` (optional) reorders channels first
    (``x[:, perm]``), so outliers come last without a separate gather pass."""
    if triton is None:
        raise KernelError("triton is not installed")
    if x.dim() != 2:
        raise ValueError(f"activations must be [tokens, features], got {tuple(x.shape)}")
    x = x.contiguous()
    t, n_in = x.shape
    n = n_in - n_outliers
    g = act.group or n
    if g & (g - 1):
        raise KernelError(f"triton activation quantization needs a power-of-two group, got {g}")
    ng = -(-n // g) if n else 0
    codes = torch.empty(t, n, dtype=torch.int8, device=x.device)
    scale = torch.empty(t, ng, dtype=torch.float32, device=x.device)
    oc = torch.empty(t, max(n_outliers, 1), dtype=torch.int8, device=x.device)
    os_ = torch.empty(t, dtype=torch.float32, device=x.device)
    if perm is not None:
        if perm.shape != (n_in,):
            raise ValueError(f"perm must have {n_in} entries, got {tuple(perm.shape)}")
        perm = perm.to(device=x.device, dtype=torch.int64).contiguous()
    if t:
        kb = max(16, triton.next_power_of_2(max(n_outliers, 1)))
        qmax = 2 ** (act.bits - 1) - 1
        _act_quant_kernel[(t, ng + 1)](x, perm if perm is not None else x, codes, scale, oc, os_, n, n_outliers, ng,
                                       x.stride(0), codes.stride(0), max(scale.stride(0), 1), oc.stride(0), float(act.clip),
                                       G=g, KB=kb, QMIN=float(-qmax - 1), QMAX=float(qmax), HAS_PERM=perm is not None,
                                       HALF=act.half_range)
    if n_outliers == 0:
        oc = oc[:, :0]
        os_ = torch.ones(t, dtype=torch.float32, device=x.device)
    return IntActivation(codes, scale, oc, os_)
