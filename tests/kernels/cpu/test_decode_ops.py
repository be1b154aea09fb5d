"""lowbit's native decode ops (RMSNorm, rotary embedding, one-token attention) against references.

- rope: the same bits as Hugging Face's ``apply_rotary_pos_emb`` (each product and the sum are
  rounded as torch rounds them).
- rms_norm: its statistic is summed in double, torch's in float32, so 1/rms can differ by half the
  float32 sum's error (≤ n/2·2^-24 relative); a float32 output differs by at most that plus a few
  roundings, a bf16 one by at most one step and in practice rarely at all.
- attention: float32 scores (error ≤ D·2^-24·Σ|q||k|·scale each), an exp within 2^-21 relative, and
  float32 sums over L rows (≤ L·2^-24 relative); the softmax-weighted mean of v is then off by at
  most (2·max score error + 2^-20 + 2L·2^-24)·max|v|, plus the final rounding to bf16 (2^-9).
"""

import pytest
import torch
import torch.nn.functional as F

from lowbit.kernels.cpu import decode_ops as ops
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(ops.library() is None, reason="no C compiler for the native ops")
PORTABLE = ("-O3",)  # no AVX2, no OpenMP
DTYPES = [torch.float32, torch.bfloat16]


def _attention_bound(q, k, v, scale, out_dtype):
    groups = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(groups, 1)
    D, L = q.shape[-1], k.shape[2]
    score_err = D * 2.0 ** -24 * (q.double().abs() @ kk.abs().transpose(-1, -2)).amax(-1) * scale  # [B, Hq, 1]
    vmax = v.double().abs().amax(dim=(2, 3)).repeat_interleave(groups, 1)[..., None]  # [B, Hq, 1]
    err = (2 * score_err + 2.0 ** -20 + 2 * L * 2.0 ** -24) * vmax
    err = err.transpose(1, 2)[..., None]  # → [B, 1, Hq, 1], the output's layout
    ref = ops.attention_decode_reference(q.double(), k.double(), v.double(), scale)
    if out_dtype == torch.bfloat16:
        return ref, 2 * err + 2.0 ** -8 * ref.abs()
    return ref, err


def _qkv(B, Hq, Hkv, L, D, dtype, seed=0, scale_q=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, 1, Hq, D, generator=g) * scale_q).to(dtype).transpose(1, 2)  # HF's strided view
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hq,Hkv,L,D", [(1, 9, 3, 256, 64), (2, 4, 4, 1, 64), (3, 6, 2, 37, 48), (1, 2, 1, 300, 7),
                                          (2, 8, 2, 129, 128), (1, 4, 2, 5, 256)])
def test_attention_within_bound(dtype, B, Hq, Hkv, L, D):
    q, k, v = _qkv(B, Hq, Hkv, L, D, dtype, seed=L + D)
    scale = D ** -0.5
    out = ops.attention_decode(q, k, v, scale)
    ref, bound = _attention_bound(q, k, v, scale, dtype)
    assert out.shape == (B, 1, Hq, D) and out.dtype == dtype and out.is_contiguous()
    assert torch.all((out.double() - ref).abs() <= bound)
    portable = ops.attention_decode(q, k, v, scale, lib=ops.library(PORTABLE))
    assert torch.all((portable.double() - ref).abs() <= bound)


def test_attention_matches_sdpa_layout_and_strided_cache():
    """A cache slice (strided rows) gives what sdpa gives on the same tensors, within the bound."""
    q, _, _ = _qkv(2, 6, 3, 8, 64, torch.float32)
    big_k, big_v = torch.randn(2, 3, 50, 64), torch.randn(2, 3, 50, 64)
    k, v = big_k[:, :, 10:40], big_v[:, :, 10:40]
    out = ops.attention_decode(q, k, v, 0.125)
    sdpa = F.scaled_dot_product_attention(q, k, v, scale=0.125, enable_gqa=True).transpose(1, 2)
    ref, bound = _attention_bound(q, k, v, 0.125, torch.float32)
    assert torch.all((out.double() - ref).abs() <= bound)
    assert torch.allclose(out, sdpa, atol=1e-5)


def test_attention_large_scores_are_stable():
    q, k, v = _qkv(1, 4, 2, 64, 64, torch.float32, scale_q=300.0)  # scores in the thousands
    out = ops.attention_decode(q, k, v, 0.125)
    ref, bound = _attention_bound(q, k, v, 0.125, torch.float32)
    assert torch.isfinite(out).all() and torch.all((out.double() - ref).abs() <= bound)


def test_attention_nan_poisons_only_its_heads():
    q, k, v = _qkv(2, 6, 3, 20, 64, torch.float32)
    clean = ops.attention_decode(q, k, v, 0.125)
    k = k.clone()
    k[0, 1, 5, 3] = float("nan")  # batch 0, kv head 1 → query heads 2 and 3 of batch 0
    out = ops.attention_decode(q, k, v, 0.125)
    assert out[0, 0, 2:4].isnan().all()
    keep = torch.ones_like(out, dtype=torch.bool)
    keep[0, 0, 2:4] = False
    assert torch.equal(out[keep], clean[keep])


def test_attention_same_bits_for_any_thread_count():
    q, k, v = _qkv(32, 9, 3, 300, 64, torch.bfloat16)  # large enough to run on the OpenMP threads
    expect = ops.attention_decode(q, k, v, 0.125)
    assert_same_for_thread_counts(lambda: ops.attention_decode(q, k, v, 0.125), expect)


def test_attention_declines_what_it_does_not_do():
    q, k, v = _qkv(1, 4, 2, 8, 64, torch.float32)
    assert ops.attention_decode(q.half(), k.half(), v.half(), 0.1) is None  # fp16
    assert ops.attention_decode(q.expand(1, 4, 2, 64), k, v, 0.1) is None  # two query tokens
    assert ops.attention_decode(q, k.bfloat16(), v, 0.1) is None  # mixed dtypes
    assert ops.attention_decode(q[:, :3], k, v, 0.1) is None  # 3 heads over 2 kv heads
    assert ops.attention_decode(q, k[:, :, :0], v[:, :, :0], 0.1) is None  # empty cache
    big = _qkv(1, 2, 1, 4, 264, torch.float32)
    assert ops.attention_decode(*big, 0.1) is None  # head dim over 256
    assert ops.attention_decode(q.requires_grad_(), k, v, 0.1) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,S,D", [(1, 9, 1, 64), (2, 3, 5, 64), (1, 4, 17, 128), (3, 2, 2, 6)])
def test_rope_same_bits_as_hugging_face(dtype, B, H, S, D):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(B * S + D)
    x = torch.randn(B, S, H, D).to(dtype).transpose(1, 2)  # [B, H, S, D] view, as in the attention
    cos, sin = torch.randn(B, S, D).to(dtype), torch.randn(B, S, D).to(dtype)
    ref, _ = apply_rotary_pos_emb(x, x, cos, sin)
    assert torch.equal(ops.rope(x, cos, sin), ref)
    assert torch.equal(ops.rope(x, cos, sin, lib=ops.library(PORTABLE)), ref)
    assert torch.equal(ops.rope_reference(x, cos, sin), ref)
    if B > 1:  # one cos/sin row shared by the batch
        assert torch.equal(ops.rope(x, cos[:1], sin[:1]), apply_rotary_pos_emb(x, x, cos[:1], sin[:1])[0])


def test_rope_declines_what_it_does_not_do():
    x, cos = torch.randn(1, 2, 3, 8), torch.randn(1, 3, 8)
    assert ops.rope(x[..., :7], cos[..., :7], cos[..., :7]) is None  # odd head dim
    assert ops.rope(x.half(), cos.half(), cos.half()) is None
    assert ops.rope(x, cos.bfloat16(), cos.bfloat16()) is None
    assert ops.rope(x, torch.randn(1, 4, 8), torch.randn(1, 4, 8)) is None  # other sequence length


@pytest.mark.parametrize("xd,wd", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                   (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("shape", [(1, 1, 576), (4, 7, 64), (3, 1000), (5,)])
def test_rms_norm_against_hugging_face(xd, wd, shape):
    torch.manual_seed(sum(shape))
    n = shape[-1]
    x = (torch.randn(shape) * 3).to(xd)
    w = (torch.rand(n) + 0.5).to(wd)
    y = ops.rms_norm(x, w, 1e-5)
    ref = ops.rms_norm_reference(x, w, 1e-5)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    step = 2.0 ** -7 if ref.dtype == torch.bfloat16 else (n / 2 + 4) * 2.0 ** -24
    assert torch.all((y.double() - ref.double()).abs() <= step * ref.double().abs())
    if ref.dtype == torch.bfloat16:  # float32 outputs carry 1/rms's last-bit difference everywhere
        assert (y == ref).double().mean() >= 0.95
    assert torch.equal(ops.rms_norm(x, w, 1e-5, lib=ops.library(PORTABLE)), y)


@pytest.mark.parametrize("xd,wd", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                   (torch.bfloat16, torch.float32)])
def test_rms_norm_with_an_output_permutation_is_the_norm_then_a_gather(xd, wd):
    """A PermutedNorm's reorder written by the norm's own pass: exactly y[..., perm], every build."""
    torch.manual_seed(5)
    x, w, perm = (torch.randn(3, 9, 200) * 2).to(xd), (torch.rand(200) + 0.5).to(wd), torch.randperm(200)
    want = ops.rms_norm(x, w, 1e-5)[..., perm]
    for lib in (None, ops.library(PORTABLE)):
        assert torch.equal(ops.rms_norm(x, w, 1e-5, lib=lib, perm=perm), want)
    assert ops.rms_norm(x, w, 1e-5, perm=perm.int()) is None  # not int64: the caller gathers itself
    assert ops.rms_norm(x, w, 1e-5, perm=perm[:199]) is None
    bad = perm.clone()
    bad[17] = 200
    with pytest.raises(ValueError, match="outside"):
        ops.rms_norm(x, w, 1e-5, perm=bad)
    bad[17] = -1
    with pytest.raises(ValueError, match="outside"):
        ops.rms_norm(x, w, 1e-5, perm=bad)


@pytest.mark.parametrize("xd,wd", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                   (torch.bfloat16, torch.float32)])
def test_rms_norm_of_many_rows_is_shared_out_with_the_same_bits(xd, wd):
    """Prefill sizes (rows x width >= 65536) run over the work pool in blocks of 16 rows, through the
    vectorised bf16 loop where everything is bf16: the same bits for any thread count, as the
    portable build, and as one row at a time; with a reorder, exactly the norm then a gather."""
    torch.manual_seed(6)
    x, w, perm = (torch.randn(203, 576) * 4).to(xd), (torch.rand(576) + 0.5).to(wd), torch.randperm(576)
    want = torch.cat([ops.rms_norm(x[i:i + 1], w, 1e-5) for i in range(x.shape[0])])
    assert_same_for_thread_counts(lambda: ops.rms_norm(x, w, 1e-5), want)
    assert_same_for_thread_counts(lambda: ops.rms_norm(x, w, 1e-5, perm=perm), want[:, perm])
    assert torch.equal(ops.rms_norm(x, w, 1e-5, lib=ops.library(PORTABLE), perm=perm), want[:, perm])
    ref = ops.rms_norm_reference(x, w, 1e-5)
    step = 2.0 ** -7 if ref.dtype == torch.bfloat16 else (576 / 2 + 4) * 2.0 ** -24
    assert torch.all((want.double() - ref.double()).abs() <= step * ref.double().abs())


def test_rms_norm_nan_row_and_strided_input():
    x = torch.randn(4, 64)
    x[2, 7] = float("nan")
    y = ops.rms_norm(x, torch.ones(64), 1e-6)
    assert y[2].isnan().all() and torch.isfinite(y[[0, 1, 3]]).all()
    yb = ops.rms_norm(x.bfloat16(), torch.ones(64).bfloat16(), 1e-6, perm=torch.randperm(64))  # the bf16 loop
    assert yb[2].isnan().all() and torch.isfinite(yb[[0, 1, 3]]).all()
    xt = torch.randn(64, 4).t()  # not contiguous
    assert torch.allclose(ops.rms_norm(xt, torch.ones(64), 1e-6), ops.rms_norm_reference(xt, torch.ones(64), 1e-6))
    assert ops.rms_norm(torch.randn(0, 64), torch.ones(64), 1e-6).shape == (0, 64)


def test_parameters_run_natively_without_autograd():
    """A model's weights are parameters (requires_grad): under no_grad / inference_mode the native
    ops still run; with autograd recording they leave it to torch (they have no backward)."""
    w = torch.nn.Parameter(torch.ones(8))
    x = torch.randn(2, 8)
    assert ops.rms_norm(x, w, 1e-6) is None
    with torch.no_grad():
        assert ops.rms_norm(x, w, 1e-6) is not None
    with torch.inference_mode():
        assert ops.rms_norm(x, w, 1e-6) is not None
        q, k, v = _qkv(1, 2, 1, 4, 8, torch.float32)
        assert ops.attention_decode(q, k, v, 0.1) is not None
        assert ops.rope(k, torch.randn(1, 4, 8), torch.randn(1, 4, 8)) is not None


def test_rms_norm_declines_what_it_does_not_do():
    assert ops.rms_norm(torch.randn(2, 8).half(), torch.ones(8).half(), 1e-6) is None
    assert ops.rms_norm(torch.randn(2, 8), torch.ones(9), 1e-6) is None
    assert ops.rms_norm(torch.randn(2, 8, requires_grad=True), torch.ones(8), 1e-6) is None
