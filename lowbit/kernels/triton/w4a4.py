"""Triton W4A4 group GEMM with the INT8 outlier part fused (one kernel, one output write).

Per output tile and per group of ``G`` input channels: load int8 activation codes and packed
INT4 weight nibbles (two codes a byte, stored ``code + 8``: the group's first half in the low
nibbles, its second half in the high ones), two int8 x int8 → int32 ``tl.dot`` (exact),
rescale by act_scale[token, group] x w_scale[out, group] into a float32 accumulator; then the
outlier channels as int8 dots into an int32 accumulator with their own scales; bias; store. Tested on CPU under
``TRITON_INTERPRET=1`` against the float64 integer reference (float32 rescale error only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowbit.kernels.linear_params import ActSpec, KernelError, LinearParams

from lowbit.kernels.triton import tl, triton


if triton is not None:

    @triton.jit
    def _w4a4_kernel(a_ptr, as_ptr, ao_ptr, aos_ptr, w_ptr, ws_ptr, wo_ptr, wos_ptr, b_ptr, y_ptr,
                     M, O, N, K, NG, s_a, s_as, s_ao, s_w, s_ws, s_wo, s_y,
                     G: tl.constexpr, BM: tl.constexpr, BO: tl.constexpr, BK: tl.constexpr,
                     HAS_BIAS: tl.constexpr):
        pm = tl.program_id(0)
        po = tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        ro = po * BO + tl.arange(0, BO)
        mm = rm < M
        mo = ro < O
        rh = tl.arange(0, G // 2)
        acc = tl.zeros((BM, BO), dtype=tl.float32)
        for gi in range(0, NG):
            # byte j of a group holds channel j (low nibble) and channel j + G/2 (high nibble), so the
            # two halves are two plain dots with no interleave in registers
            cols = gi * G + rh
            a_lo = tl.load(a_ptr + rm[:, None] * s_a + cols[None, :], mask=mm[:, None] & (cols[None, :] < N), other=0)
            a_hi = tl.load(a_ptr + rm[:, None] * s_a + (cols + G // 2)[None, :],
                           mask=mm[:, None] & ((cols + G // 2)[None, :] < N), other=0)
            b = tl.load(w_ptr + ro[:, None] * s_w + (gi * (G // 2) + rh)[None, :], mask=mo[:, None], other=0x88)
            lo = (b & 0xF).to(tl.int8) - 8
            hi = (b >> 4).to(tl.int8) - 8
            p = tl.dot(a_lo, tl.trans(lo), out_dtype=tl.int32)
            p += tl.dot(a_hi, tl.trans(hi), out_dtype=tl.int32)
            sa = tl.load(as_ptr + rm * s_as + gi, mask=mm, other=0.0)
            sw = tl.load(ws_ptr + ro * s_ws + gi, mask=mo, other=0.0)
            acc += p.to(tl.float32) * sa[:, None] * sw[None, :]
        acc_o = tl.zeros((BM, BO), dtype=tl.int32)
        rk = tl.arange(0, BK)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            ao = tl.load(ao_ptr + rm[:, None] * s_ao + kk[None, :], mask=mm[:, None] & (kk[None, :] < K), other=0)
            wo = tl.load(wo_ptr + ro[:, None] * s_wo + kk[None, :], mask=mo[:, None] & (kk[None, :] < K), other=0)
            acc_o += tl.dot(ao, tl.trans(wo), out_dtype=tl.int32)
        aos = tl.load(aos_ptr + rm, mask=mm, other=0.0)
        wos = tl.load(wos_ptr + ro, mask=mo, other=0.0)
        acc += acc_o.to(tl.float32) * aos[:, None] * wos[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + ro, mask=mo, other=0.0)[None, :]
        tl.store(y_ptr + rm[:, None] * s_y + ro[None, :], acc, mask=mm[:, None] & mo[None, :])


@dataclass
class TritonW4A4Prepared:
    packed: torch.Tensor  # uint8 [out, groups * group/2]: code+8, see pack_nibbles
    scale: torch.Tensor  # float32 [out, n_groups]
    outlier: torch.Tensor  # int8 [out, k]
    outlier_scale: torch.Tensor  # float32 [out]
    act: ActSpec
    n_normal: int
    group: int
    bias: torch.Tensor | None


def pack_nibbles(codes: torch.Tensor, group: int) -> torch.Tensor:
    """Signed int4 codes ``[out, n]`` → uint8 ``[out, ceil(n / group) * group / 2]`` (stored
    ``code + 8``, the last group padded with code 0): within each group of ``group`` channels,
    byte ``j`` holds channel ``j`` in its low nibble and channel ``j + group/2`` in its high one."""
    out, n = codes.shape
    ng = -(-n // group)
    u = (codes.to(torch.int16) + 8).to(torch.uint8)
    u = F.pad(u, (0, ng * group - n), value=8).view(out, ng, 2, group // 2)
    return (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(out, ng * group // 2).contiguous()


def prepare(p: LinearParams, device: torch.device | str | None = None) -> TritonW4A4Prepared:
    if p.kind != "w4a4" or p.act is None or p.zero is not None:
        raise KernelError("triton w4a4 kernel needs symmetric INT4 weights and INT4 activations")
    g = p.group or p.n_normal
    if (p.act.group or p.n_normal) != g or g < 16 or g & (g - 1):
        raise KernelError(f"triton w4a4 needs equal power-of-two weight/activation groups >= 16, got {g}/{p.act.group}")
    dev = torch.device(device) if device is not None else p.codes.device
    mv = lambda t: None if t is None else t.to(dev).contiguous()  # noqa: E731
    return TritonW4A4Prepared(mv(pack_nibbles(p.codes, g)), mv(p.scale.float()), mv(p.outlier),
                              mv(p.outlier_scale.float()), p.act, p.n_normal, g, mv(p.bias))


# (BM, BO, num_warps) by token count: small tiles for decode, larger ones for prefill batches.
# Untimed on a GPU so far (see README); every configuration is compile-checked in CI.
CONFIGS = ((16, 64, 4), (64, 64, 4), (128, 128, 8))


def _config(m: int) -> tuple[int, int, int]:
    return CONFIGS[0] if m <= 16 else CONFIGS[1] if m <= 128 else CONFIGS[2]


def matmul(codes: torch.Tensor, scale: torch.Tensor, outlier: torch.Tensor, outlier_scale: torch.Tensor,
           w: TritonW4A4Prepared, block_m: int | None = None, block_o: int | None = None, block_k: int = 32,
           num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """Quantized activations (int8 codes ``[M, N]``, scales ``[M, NG]``, outliers) times ``w``;
    the tile keywords override the configuration chosen by token count (for tile sweeps)."""
    if triton is None:
        raise KernelError("triton is not installed")
    m, n = codes.shape
    o = w.packed.shape[0]
    k = w.outlier.shape[1]
    if n != w.n_normal or outlier.shape[1] != k:
        raise ValueError(f"activation codes [{m}, {n}] + {outlier.shape[1]} outliers do not match weight {w.n_normal} + {k}")
    y = torch.empty(m, o, dtype=torch.float32, device=codes.device)
    if m == 0:
        return y
    ng = scale.shape[1]
    cfg_m, cfg_o, warps = _config(m)
    block_m, block_o, warps = block_m or cfg_m, block_o or cfg_o, num_warps or warps
    extra = {} if num_stages is None else {"num_stages": num_stages}
    bias = w.bias if w.bias is not None else y
    grid = (triton.cdiv(m, block_m), triton.cdiv(o, block_o))
    ao = outlier if k else codes.new_zeros(m, 1)
    wo = w.outlier if k else w.packed.new_zeros(o, 1, dtype=torch.int8)
    _w4a4_kernel[grid](codes, scale, ao, outlier_scale, w.packed, w.scale, wo, w.outlier_scale, bias, y,
                       m, o, n, k, ng, codes.stride(0), scale.stride(0), ao.stride(0), w.packed.stride(0),
                       w.scale.stride(0), wo.stride(0), y.stride(0),
                       G=w.group, BM=block_m, BO=block_o, BK=block_k, HAS_BIAS=w.bias is not None, num_warps=warps, **extra)
    return y


def run(x: torch.Tensor, w: TritonW4A4Prepared, input_perm: torch.Tensor | None = None) -> torch.Tensor:
    from lowbit.kernels.triton.act_codes import quantize_tokens_triton

    a = quantize_tokens_triton(x, w.act, w.outlier.shape[1], input_perm)
    return matmul(a.codes, a.scale, a.outlier, a.outlier_scale, w)
