"""``decode_ops.kv_decode_step``, a whole decode step over the packed KV cache in one native call,
against the steps it replaces called one by one: the bits of ``fast_transform`` (the rotation),
``kv_quant_rows`` (the new rows), ``attention_decode_packed`` and the cast. The attention's own
bound against float64 is ``test_decode_ops``'s; here nothing may differ at all."""

import pytest
import torch

from lowbit.formats.hadamard import fast_transform
from lowbit.kernels.cpu import decode_ops as ops
from lowbit.nn.kv_cache import PackedKV
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(ops.library() is None, reason="no C compiler for the native ops")


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
