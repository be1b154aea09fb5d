"""lowbit's packed KV cache in C (``kernels/cpu/kv_packed``): the row quantizer bit for bit as the
generic one; the attention from the codes within float32 rounding of float64 attention over the
dequantized cache; and ``kv_decode_step``, a whole decode step in one call, against the steps it
replaces called one by one: the bits of ``fast_transform`` (the rotation), ``kv_quant_rows`` (the
new rows), ``attention_decode_packed`` and the cast; there nothing may differ at all."""

import pytest
import torch

from lowbit.formats.hadamard import fast_transform
from lowbit.kernels.cpu import decode_ops, kv_packed as ops
from lowbit.nn.kv_cache import PackedKV
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(ops.library() is None, reason="no C compiler for the native ops")


@pytest.mark.parametrize("bits,symmetric,group,Hq,Hkv,D,L", [
    (4, False, 0, 6, 2, 64, 37), (4, True, 0, 3, 3, 32, 5), (4, False, 16, 4, 1, 64, 20), (8, False, 0, 6, 3, 48, 9),
    (8, True, 8, 2, 2, 16, 1), (4, False, 8, 2, 1, 16, 7)])  # the last: g = 8, the scalar path
def test_packed_attention_equals_attention_over_the_dequantized_cache(bits, symmetric, group, Hq, Hkv, D, L):
    """Decode attention read straight from a packed KV cache's codes equals float64 attention over
    the cache's dequantized values (those are exact in float32: a small integer times an fp16
    scale), within float32 rounding; appended in pieces, as prefill then decode steps store it."""
    torch.manual_seed(bits + L)
    B = 2
    k, v = PackedKV(bits, symmetric, group=group), PackedKV(bits, symmetric, group=group)
    kx, vx = torch.randn(B, Hkv, L, D) * 3, torch.randn(B, Hkv, L, D)
    for a, b in ((0, max(1, L // 2)), (max(1, L // 2), L)):
        if a < b:
            k.append(kx[:, :, a:b]), v.append(vx[:, :, a:b])
    q = torch.randn(B, Hq, 1, D)
    got = ops.attention_decode_packed(q, k.codes, k.scale, k.zero, v.codes, v.scale, v.zero, bits, group or D, D ** -0.5)
    ref = decode_ops.attention_decode_reference(q.double(), k.dequantize(torch.float32).double(),
                                         v.dequantize(torch.float32).double(), D ** -0.5)
    torch.testing.assert_close(got.double(), ref[:, 0], rtol=2e-5, atol=2e-5)


def test_packed_attention_refuses_what_it_does_not_take():
    q = torch.randn(1, 2, 1, 16)
    assert not ops.packed_decode_applies(q, 3, 16, 16)  # 3-bit codes: two planes, not this kernel's layout
    assert not ops.packed_decode_applies(q, 4, 5, 16)  # groups that do not divide the head
    assert not ops.packed_decode_applies(torch.randn(1, 2, 2, 16), 4, 16, 16)  # two query tokens
    k = PackedKV(4, False)
    k.append(torch.randn(1, 2, 3, 16))
    with pytest.raises(ValueError, match="one packed cache"):
        ops.attention_decode_packed(q, k.codes, k.scale.float(), k.zero, k.codes, k.scale, k.zero, 4, 16, 0.25)
    # each of these once reached the C, which trusts the sizes: reads past the tensors, or a crash
    good = (k.codes, k.scale, k.zero, k.codes, k.scale, k.zero)
    bad = {"rows of 8 bytes read as 8-bit groups of 16": ((q, *good, 8, 16), "codes must be"),
           "short zero points": ((q, k.codes, k.scale, k.zero[..., :1], k.codes, k.scale, k.zero, 4, 16), "one packed"),
           "int32 zero points": ((q, k.codes, k.scale, k.zero.int(), k.codes, k.scale, k.zero, 4, 16), "one packed"),
           "int8 value codes": ((q, k.codes, k.scale, k.zero, k.codes.view(torch.int8), k.scale, k.zero, 4, 16),
                                "one packed"),
           "one side symmetric": ((q, k.codes, k.scale, k.zero, k.codes, k.scale, None, 4, 16), "one packed"),
           "a cache on the meta device": ((q, k.codes.to("meta"), *good[1:], 4, 16), "CPU tensors"),
           "heads that do not share out": ((torch.randn(1, 3, 1, 16), *good, 4, 16), "query heads"),
           "two query tokens": ((torch.randn(1, 2, 2, 16), *good, 4, 16), "one query token")}
    for name, (args, match) in bad.items():
        with pytest.raises(ValueError, match=match):
            ops.attention_decode_packed(*args, 0.25)
            pytest.fail(name)


@pytest.mark.parametrize("bits", [4, 8])
def test_kv_quant_rows_is_the_generic_quantizer_bit_for_bit(bits):
    """The packed KV cache's native row quantizer gives choose_qparams / quantize / pack's codes,
    fp16 scales and zero points exactly: rows across magnitudes (fp16-subnormal scales, scales that
    the fp16 rounding would shrink, near the fp16 limit), all-zero and one-signed rows, ties."""
    from lowbit.formats import PerToken, choose_qparams, pack, quantize

    torch.manual_seed(bits)
    g = 32
    mags = torch.tensor([1e-7, 3e-6, 1e-4, 0.02, 1.0, 7.3, 300.0, 9000.0, 5.0e4])
    x = torch.randn(len(mags) * 40, g) * mags.repeat_interleave(40)[:, None]
    x[0] = 0.0
    x[1] = x[1].abs()
    x[2] = -x[2].abs()
    x[3] = torch.arange(g) * 0.5  # halves: ties under the row's scale
    got = ops.kv_quant_rows(x, bits)
    assert got is not None
    qp = choose_qparams(x, bits, symmetric=False, granularity=PerToken(), scale_dtype=torch.float16)
    codes = pack(quantize(x, qp), bits)
    assert torch.equal(got[0], codes) and torch.equal(got[1], qp.scale) and torch.equal(got[2], qp.zero_point.to(torch.uint8))


def test_kv_quant_rows_leaves_bad_rows_to_the_generic_path():
    x = torch.randn(4, 16)
    x[2, 3] = float("nan")
    assert ops.kv_quant_rows(x, 4) is None
    assert ops.kv_quant_rows(torch.full((1, 16), 1.0e6) * torch.linspace(-1, 1, 16), 4) is None  # scale beyond fp16
    assert ops.kv_quant_rows(torch.randn(2, 16), 3) is None


def _cache(bits, group, B, Hkv, L, D, seed):
    """Key and value sides holding L positions, with room for at least one more."""
    g = torch.Generator().manual_seed(seed)
    sides = []
    for _ in range(2):
        side = PackedKV(bits, False, group=group)
        side.append(torch.randn(B, Hkv, L, D, generator=g) * 2)
        side.reserve((B, Hkv), D // (group or D))
        sides.append(side)
    return sides


def _by_steps(q, k, v, keys, values, bits, group, rotate, scale):
    """The reference: each step by its own call, on copies of the cache's buffers."""
    D = q.shape[-1]
    g = group or D
    out_sides = []
    for side, x in ((keys, k), (values, v)):
        x = x.float()
        rows = fast_transform(x) if rotate else x
        codes, sc, zero = ops.kv_quant_rows(rows.reshape(-1, g).contiguous(), bits)
        B, H = x.shape[:2]
        out_sides.append([torch.cat((side.codes, codes.reshape(B, H, -1, codes.shape[-1])), 2),
                          torch.cat((side.scale, sc.reshape(B, H, -1)), 2), torch.cat((side.zero, zero.reshape(B, H, -1)), 2)])
    qr = fast_transform(q.float()) if rotate else q
    (kc, ks, kz), (vc, vs, vz) = out_sides
    out = ops.attention_decode_packed(qr, kc, ks, kz, vc, vs, vz, bits, g, scale)
    if rotate:
        out = fast_transform(out)
    return out.to(q.dtype).unsqueeze(1), out_sides


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits,group,rotate,B,Hq,Hkv,D,L", [
    (4, 0, True, 1, 9, 3, 64, 40), (4, 0, False, 2, 4, 2, 64, 1), (8, 0, True, 2, 6, 3, 32, 17),
    (4, 16, True, 1, 4, 1, 64, 9), (4, 8, False, 3, 2, 2, 16, 5),  # g = 8: the scalar rows
    (4, 0, True, 1, 20, 2, 128, 33), (8, 12, False, 1, 2, 1, 24, 3)])  # 10 heads a kv head: parts of 8
def test_one_call_is_its_steps_bit_for_bit(dtype, bits, group, rotate, B, Hq, Hkv, D, L):
    torch.manual_seed(bits + D + L)
    keys, values = _cache(bits, group, B, Hkv, L, D, seed=L)
    q = torch.randn(B, 1, Hq, D).to(dtype).transpose(1, 2)  # HF's strided view
    k, v = (torch.randn(B, 1, Hkv, D).to(dtype).transpose(1, 2) * 3 for _ in range(2))
    want, sides = _by_steps(q, k, v, keys, values, bits, group, rotate, 0.125)
    per = D // (group or D)
    got = ops.kv_decode_step(q, k, v, keys._bufs, values._bufs, keys.rows // per, bits, group or D, rotate, 0.125)
    assert got is not None and got.dtype == dtype and got.shape == (B, 1, Hq, D)
    assert torch.equal(got, want)
    for side, (codes, scale, zero) in zip((keys, values), sides):
        side.rows += per  # the call wrote the new rows in place
        assert torch.equal(side.codes, codes) and torch.equal(side.scale, scale) and torch.equal(side.zero, zero)


def test_one_call_same_bits_for_any_thread_count():
    keys, values = _cache(4, 0, 2, 2, 400, 64, seed=1)  # 2·2·401·64 values: over the pool's threshold
    q, k, v = torch.randn(2, 6, 1, 64), torch.randn(2, 2, 1, 64), torch.randn(2, 2, 1, 64)
    step = lambda: ops.kv_decode_step(q, k, v, keys._bufs, values._bufs, 400, 4, 64, True, 0.125)  # noqa: E731
    assert_same_for_thread_counts(step, step())


def test_one_call_declines_what_its_steps_must_handle():
    """None, and no position counted, wherever the step-by-step path has to decide (and raise)."""
    keys, values = _cache(4, 0, 1, 2, 5, 16, seed=2)
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
    bufs = keys._bufs, values._bufs
    assert ops.kv_decode_step(q, k, v, *bufs, 5, 4, 16, True, 0.125) is not None
    bad = k.clone()
    bad[0, 1, 0, 3] = float("nan")
    assert ops.kv_decode_step(q, bad, v, *bufs, 5, 4, 16, True, 0.125) is None  # NaN: the generic path raises
    huge = torch.full_like(k, 1.0e6) * torch.linspace(-1, 1, 16)
    assert ops.kv_decode_step(q, huge, v, *bufs, 5, 4, 16, False, 0.125) is None  # a scale beyond fp16
    assert ops.kv_decode_step(q, k, v, *bufs, keys._bufs[0].shape[2], 4, 16, True, 0.125) is None  # no room left
    assert ops.kv_decode_step(q, k.half(), v, *bufs, 5, 4, 16, True, 0.125) is None  # mixed dtypes
    assert ops.kv_decode_step(torch.randn(1, 4, 1, 24), torch.randn(1, 2, 1, 24), torch.randn(1, 2, 1, 24),
                              *bufs, 5, 4, 24, True, 0.125) is None  # a rotation of order 24: the dense path
    assert ops.kv_decode_step(q, k, v, (keys._bufs[0], keys._bufs[1].float(), keys._bufs[2]), values._bufs, 5, 4, 16,
                              True, 0.125) is None  # not a packed cache's buffers
    assert ops.kv_decode_step(torch.randn(1, 4, 2, 16), k, v, *bufs, 5, 4, 16, True, 0.125) is None  # two tokens


@pytest.mark.parametrize("x_dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                               (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("bits,group,rotate,D", [(4, 0, True, 64), (8, 0, True, 32), (4, 16, False, 64), (4, 8, True, 16),
                                                 (8, 12, False, 24)])
def test_append_read_is_append_then_dequantize_bit_for_bit(x_dtype, out_dtype, bits, group, rotate, D):
    """A prefill's cache update in one call (``kv_append_read``) against the two steps: the same
    codes, scales and zero points, and the same dequantized (rotated-back) cache, over appends of
    130 positions (3 work items a head), 1 and 7 after stored ones."""
    torch.manual_seed(D + bits)
    one, two = PackedKV(bits, False, rotate, group), PackedKV(bits, False, rotate, group)
    for t in (130, 1, 7):
        x = (torch.randn(2, 3, t, D) * 4).to(x_dtype)
        got = one.append_read(x, out_dtype)
        two.append(x)
        assert torch.equal(got, two.dequantize(out_dtype)), t
        assert torch.equal(one.codes, two.codes) and torch.equal(one.scale, two.scale) and torch.equal(one.zero, two.zero)


def test_append_read_native_call_and_what_it_leaves_to_the_steps():
    side = PackedKV(4, False, True)
    side.append(torch.randn(1, 2, 3, 64))
    bufs = side.reserve((1, 2), 4)
    x = torch.randn(1, 2, 4, 64)
    out = ops.kv_append_read(x, bufs, 3, 4, 64, True, torch.float32)
    assert out is not None and out.shape == (1, 2, 7, 64)
    def step():
        fresh = PackedKV(4, False)
        fresh.head_dim = 64
        return ops.kv_append_read(torch.randn(4, 2, 200, 64, generator=torch.Generator().manual_seed(0)),
                                  fresh.reserve((4, 2), 200), 0, 4, 64, True, torch.bfloat16)

    assert_same_for_thread_counts(step, step())
    bad = x.clone()
    bad[0, 1, 2, 5] = float("inf")
    assert ops.kv_append_read(bad, bufs, 3, 4, 64, True, torch.float32) is None  # the steps raise for it
    assert ops.kv_append_read(x, bufs, 3 + 300, 4, 64, True, torch.float32) is None  # no room
    assert ops.kv_append_read(x.half(), bufs, 3, 4, 64, True, torch.float32) is None  # float16: the steps
    assert ops.kv_append_read(x, bufs, 3, 4, 64, True, torch.float16) is None
    assert ops.kv_append_read(x[..., :48], bufs, 3, 4, 48, True, torch.float32) is None  # order 48: the dense rotation
    with pytest.raises(ValueError, match="NaN|Inf|finite"):
        PackedKV(4, False, True).append_read(bad, torch.float32)
