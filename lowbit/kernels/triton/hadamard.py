"""Triton online Hadamards (the GPU twins of ``csrc/hadamard.c``), the operations of
``lowbit.formats.hadamard.fast_transform`` per value, so the torch path's bits (tested under
``TRITON_INTERPRET=1``); bfloat16 rows are transformed in float32 and rounded once.

* block (``BlockHadamard``): one program per (row, block) loads ``block`` values, runs the
  butterfly stages (span h: the pair (a, b) at distance h becomes (a + b, a - b), by reshaping to
  [.., 2, h] and splitting), multiplies once by the float32 ``1/√block`` and stores; the trailing
  outlier channels are copied.
* whole input (``InputHadamard``, R4), order ``n = p·m``: one program per row holds it as a
  [p, m] tile (m padded to a power of two), forms the product with the small ``H_m`` as the same
  ordered sum of ±1 terms (one column of x loaded per term), then the butterfly over the p rows.
"""

from __future__ import annotations

import functools

import torch

from lowbit.formats.hadamard import factor
from lowbit.kernels.triton import tl, triton


if triton is not None:

    @triton.jit
    def _stage(x, B: tl.constexpr, H: tl.constexpr):
        y = tl.permute(tl.reshape(x, [B // (2 * H), 2, H]), [0, 2, 1])  # [.., h, 2]: each pair on the last axis
        a, b = tl.split(y)
        y = tl.join(a + b, a - b)  # [.., h, 2]
        return tl.reshape(tl.permute(y, [0, 2, 1]), [B])

    @triton.jit
    def _bf16_bits(x):
        """float32 -> bfloat16 bits, round to nearest even (NaN stays a quiet NaN), in integers: the
        interpreter's own cast truncates, so it would not check what a GPU's rounding cast does."""
        u = x.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = tl.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, r)
        return r.to(tl.uint16).to(tl.int16, bitcast=True)

    @triton.jit
    def _stage_rows(x, P: tl.constexpr, MP: tl.constexpr, H: tl.constexpr):
        """One butterfly stage of span H over the rows of a [P, MP] tile."""
        y = tl.permute(tl.reshape(x, [P // (2 * H), 2, H, MP]), [0, 2, 3, 1])  # each pair on the last axis
        a, b = tl.split(y)
        y = tl.join(a + b, a - b)  # [.., H, MP, 2]
        return tl.reshape(tl.permute(y, [0, 3, 1, 2]), [P, MP])

    @triton.jit
    def _widen(x, BF16: tl.constexpr):
        """Loaded values as float32 (bfloat16 bits, loaded as int16, widened exactly)."""
        if BF16:
            return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        return x.to(tl.float32)

    @triton.jit
    def _input_hadamard_kernel(x_ptr, y_ptr, h_ptr, s_x, n, scale, P: tl.constexpr, M: tl.constexpr,
                               MP: tl.constexpr, LOG2P: tl.constexpr, BF16: tl.constexpr):
        row = tl.program_id(0)
        a = tl.arange(0, P)
        j = tl.arange(0, MP)
        base = x_ptr + row * s_x + a * M
        acc = tl.zeros([P, MP], dtype=tl.float32)
        for d in tl.static_range(M):  # x[a, :] @ H_m as fast_transform orders it
            h = tl.load(h_ptr + d * M + j, mask=j < M, other=0.0)
            t = _widen(tl.load(base + d), BF16)[:, None] * h[None, :]
            if d == 0:
                acc = t
            else:
                acc = acc + t
        for i in tl.static_range(LOG2P):  # spans of 1, 2, 4, ... rows (m, 2m, 4m, ... values)
            acc = _stage_rows(acc, P, MP, 2 ** i)
        acc = acc * scale
        out = y_ptr + row * n + a[:, None] * M + j[None, :]
        keep = (j < M)[None, :]  # the padding columns of m; every one of the p rows is real
        if BF16:
            tl.store(out, _bf16_bits(acc), mask=keep)
        else:
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def _block_hadamard_kernel(x_ptr, y_ptr, s_x, n, normal, scale, B: tl.constexpr, LOG2B: tl.constexpr,
                               TAIL: tl.constexpr, BF16: tl.constexpr):
        row = tl.program_id(0)
        blk = tl.program_id(1)
        n_blocks = normal // B
        if blk < n_blocks:
            r = tl.arange(0, B)
            x = _widen(tl.load(x_ptr + row * s_x + blk * B + r), BF16)
            for i in tl.static_range(LOG2B):  # spans 1, 2, 4, ..., B/2
                x = _stage(x, B, 2 ** i)
            x = x * scale
            if BF16:  # y_ptr: the bfloat16 output viewed as int16
                tl.store(y_ptr + row * n + blk * B + r, _bf16_bits(x))
            else:
                tl.store(y_ptr + row * n + blk * B + r, x.to(y_ptr.dtype.element_ty))
        else:  # the outlier channels, copied
            t = tl.arange(0, TAIL)
            m = normal + t < n
            v = tl.load(x_ptr + row * s_x + normal + t, mask=m, other=0.0)
            tl.store(y_ptr + row * n + normal + t, v, mask=m)


MAX_BLOCK = 128


def _check(which: str, x: torch.Tensor) -> None:
    from lowbit.kernels.linear_params import KernelError

    if triton is None:
        raise KernelError(f"the Triton {which} Hadamard needs triton installed")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{which} Hadamard: float32/bfloat16/float16 input, got {x.dtype}")


def _rows_and_output(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """x as rows with a unit last stride (bfloat16 viewed as int16 bit patterns, see _bf16_bits),
    the output of x's shape and dtype, and whether it is bfloat16."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    bf16 = x.dtype == torch.bfloat16
    return (x2.view(torch.int16) if bf16 else x2), torch.empty(x.shape, dtype=x.dtype, device=x.device), bf16


def block_hadamard_triton(x: torch.Tensor, normal: int, block: int) -> torch.Tensor:
    """``lowbit.kernels.cpu.hadamard.block_hadamard_reference`` by the Triton kernel (float32,
    bfloat16 or float16 rows with a unit last stride; any leading shape)."""
    from lowbit.kernels.cpu.hadamard import inverse_sqrt_f32

    _check("block", x)
    n = x.shape[-1]
    if not 2 <= block <= MAX_BLOCK or block & (block - 1) or not 0 <= normal <= n or normal % block:
        raise ValueError(f"block Hadamard: block {block} must be a power of two in [2, {MAX_BLOCK}] dividing "
                         f"normal {normal} <= {n}")
    x2, y, bf16 = _rows_and_output(x)
    rows, tail = x2.shape[0], n - normal
    if rows and n:
        grid = (rows, normal // block + (1 if tail else 0))
        _block_hadamard_kernel[grid](x2, y.view(torch.int16) if bf16 else y, x2.stride(0), n, normal, inverse_sqrt_f32(block),
                                     B=block, LOG2B=block.bit_length() - 1, TAIL=triton.next_power_of_2(max(tail, 1)), BF16=bf16)
    return y


MAX_TILE = 16384  # p x (m padded): the largest row one program holds (n = 14336 = 512 x 28 fits)


def input_fits(n: int) -> bool:
    """Whether the Triton kernel takes rows of ``n`` values (else the torch path runs)."""
    p, m = factor(n)
    return p * triton.next_power_of_2(m) <= MAX_TILE if triton is not None else False


@functools.lru_cache(maxsize=None)
def _signs_on(m: int, device: str) -> torch.Tensor:
    from lowbit.kernels.cpu.hadamard import _small_signs

    return _small_signs(m).to(device)


def input_hadamard_triton(x: torch.Tensor) -> torch.Tensor:
    """``lowbit.kernels.cpu.hadamard.input_hadamard_reference`` by the Triton kernel (float32,
    bfloat16 or float16 rows; any leading shape; ``input_fits(n)``)."""
    from lowbit.kernels.cpu.hadamard import inverse_sqrt_f32

    _check("input", x)
    n = x.shape[-1]
    if not input_fits(n):
        raise ValueError(f"input Hadamard: rows of {n} exceed the Triton kernel's tile of {MAX_TILE} values")
    p, m = factor(n)
    x2, y, bf16 = _rows_and_output(x)
    mp = triton.next_power_of_2(m)
    if x2.shape[0]:
        _input_hadamard_kernel[(x2.shape[0],)](x2, y.view(torch.int16) if bf16 else y, _signs_on(m, str(x.device)),
                                               x2.stride(0), n, inverse_sqrt_f32(n), P=p, M=m, MP=mp, LOG2P=p.bit_length() - 1,
                                               BF16=bf16, num_warps=8 if p * mp > 4096 else 4)
    return y
