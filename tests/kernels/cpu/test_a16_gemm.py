"""lowbit's batched W4A16 / W8A16 kernel (``gemm``): the GEMV kernels' bits (``native``, which are
tested against the float64 reference within their int16 bound) and its portable build's, at the
boundaries of its tiles (4 tokens x 32 rows; 8-channel steps; work items of 128 rows for few tokens):
tokens 1..17, odd widths and rows,
groups, zero points, bfloat16 in and out, non-finite tokens, thread counts."""

import pytest
import torch
import torch.nn.functional as F

from lowbit.kernels import from_float
from lowbit.kernels.cpu import a16_gemm, w4_gemv, w8_gemv, w4a16, w8a16
from lowbit.kernels.linear_params import LinearParams
from tests.kernels.cpu.builds import amx_builds, portable_build
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(not a16_gemm.available(), reason="no C compiler for the native kernel")


def _portable():
    return portable_build(a16_gemm.library, a16_gemm.PORTABLE_FLAGS)


def _asymmetric(out: int, n: int, group: int, seed: int) -> LinearParams:
    g = torch.Generator().manual_seed(seed)
    ng = -(-n // group)
    return LinearParams("w4a16", torch.randint(0, 16, (out, n), generator=g, dtype=torch.uint8),
                        torch.rand(out, ng, generator=g) * 0.1 + 0.01, torch.randint(0, 16, (out, ng), generator=g),
                        group, torch.zeros(out, 0, dtype=torch.int8), torch.ones(out), torch.randn(out, generator=g))


@pytest.mark.parametrize("out,n,group", [(37, 333, 64), (16, 64, 64), (33, 200, 0), (80, 1024, 128), (1, 128, 64),
                                         (140, 256, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a16_gemm_equals_gemv_and_portable(out, n, group, dtype):
    torch.manual_seed(out + n)
    p = from_float(torch.randn(out, n), "w4a16", group=group, bias=torch.randn(out))
    gemm, gemv = w4a16.prepare(p, "gemm"), w4a16.prepare(p, "native")
    x = (torch.randn(17, n) * 3).to(dtype)
    y = w4a16.run(x, gemm)
    assert y.dtype == dtype and y.shape == (17, out)
    assert torch.equal(y, w4a16.run(x, gemv))
    assert torch.equal(a16_gemm.run(x, gemm, _portable()), y)
    for t in range(1, 17):  # every tail of the token tiles: a token's bits do not depend on its batch
        assert torch.equal(w4a16.run(x[:t], gemm), y[:t])


def test_w4a16_gemm_zero_points_and_nonfinite_tokens():
    p = _asymmetric(50, 320, 64, seed=1)
    gemm, gemv = a16_gemm.prepare_w4(p), w4_gemv.prepare(p)
    x = torch.randn(9, 320) * torch.linspace(0.01, 10, 320)
    x[3, 7] = float("nan")
    x[6, 300] = float("inf")
    y = a16_gemm.run(x, gemm)
    torch.testing.assert_close(y, w4_gemv.run(x, gemv), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(y, a16_gemm.run(x, gemm, _portable()), rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(y[3]).all() and torch.isnan(y[6]).all() and torch.isfinite(y[[0, 1, 2, 4, 5, 7, 8]]).all()


@pytest.mark.parametrize("out,n", [(37, 333), (16, 32), (48, 600), (1, 1), (140, 256)])
def test_w8a16_gemm_equals_gemv_and_portable(out, n):
    torch.manual_seed(out * n)
    p = from_float(torch.randn(out, n), "w8a16", bias=torch.randn(out))
    gemm, gemv = w8a16.prepare(p, "gemm"), w8a16.prepare(p, "native")
    x = torch.randn(17, n) * torch.linspace(0.01, 10, n)
    y = w8a16.run(x, gemm)
    assert torch.equal(y, w8a16.run(x, gemv))
    assert torch.equal(a16_gemm.run(x, gemm, _portable()), y)
    assert torch.equal(w8a16.run(x.bfloat16(), gemm), w8_gemv.run(x.bfloat16(), gemv))
    for t in (1, 2, 3, 5, 9):
        assert torch.equal(w8a16.run(x[:t], gemm), y[:t])


def test_thread_counts_and_shapes():
    p = from_float(torch.randn(200, 512), "w4a16", group=128)
    st = w4a16.prepare(p, "gemm")
    x = torch.randn(2, 3, 512)  # [..., in] straight into the kernel
    y = w4a16.run(x.reshape(6, 512), st)
    assert_same_for_thread_counts(lambda: w4a16.run(x.reshape(6, 512), st), y)
    assert torch.equal(a16_gemm.run(x, st), y.reshape(2, 3, 200))
    assert a16_gemm.run(x[:0], st).shape == (0, 3, 200)
    with pytest.raises(ValueError, match="512"):
        a16_gemm.run(torch.randn(2, 500), st)


@pytest.mark.parametrize("kind,out,n,group", [("w4", 37, 333, 64), ("w4", 50, 333, 0), ("w4", 64, 1024, 128),
                                              ("w4", 48, 640, 192), ("w8", 40, 600, 0), ("w8", 32, 1024, 0)])
def test_tiles_of_many_tokens_equal_the_portable_build(kind, out, n, group):
    """An AMX build splits each int16 code into its signed high and unsigned low byte and runs two
    int8 tile products per group (32 tokens x 32 rows, groups padded to 64-channel steps, INT8
    panels read in place where they fit, 4-bit ones unpacked) from 8 tokens; a build with the
    threshold at 1 runs them for every batch. Both give the portable loop's bits at the tiles'
    edges (1, 15-17, 31-33, 70 tokens), with zero points. Without AMX this compares the vector
    tiles over as many tokens."""
    torch.manual_seed(out + n)
    p = _asymmetric(out, n, group or n, seed=out) if kind == "w4" else from_float(torch.randn(out, n), "w8a16")
    st = a16_gemm.prepare_w4(p) if kind == "w4" else w8a16.prepare(p, "gemm")
    x = torch.randn(70, n) * torch.linspace(0.01, 10, n)
    y = a16_gemm.run(x, st, _portable())
    for lib in amx_builds(a16_gemm.library):
        for t in (1, 15, 16, 17, 31, 32, 33, 70):
            assert torch.equal(a16_gemm.run(x[:t], st, lib), y[:t]), (t, lib)


def test_extreme_codes_split_exactly():
    """Codes ±32767 (high bytes ±127/-128, low bytes 255/1) against 4-bit codes 15 and 0 with zero
    points 0 and 15: the largest |P| the split must give back exactly."""
    out, n = 32, 1024
    u = torch.zeros(out, n, dtype=torch.uint8)
    u[:16] = 15
    zero = torch.zeros(out, 8, dtype=torch.int64)
    zero[16:] = 15
    p = LinearParams("w4a16", u, torch.ones(out, 8), zero, 128, torch.zeros(out, 0, dtype=torch.int8),
                     torch.ones(out), None)
    st = a16_gemm.prepare_w4(p)
    x = torch.ones(40, n)
    x[1::2] = -1
    x[2::4, ::3] = -1
    y = a16_gemm.run(x, st, _portable())
    expect = (x @ torch.cat([torch.full((16, n), 15.), torch.full((16, n), -15.)]).T)
    torch.testing.assert_close(y, expect, rtol=2e-4, atol=0)
    for lib in amx_builds(a16_gemm.library):
        assert torch.equal(a16_gemm.run(x, st, lib), y), lib


@pytest.mark.parametrize("kind,out,n,group", [("w4", 37, 333, 0), ("w4z", 50, 640, 64), ("w4", 64, 4096, 128),
                                              ("w8", 40, 600, 0), ("w8", 17, 33, 0)])
def test_weight_as_bf16_is_torchs_rounding(kind, out, n, group):
    """The C unpacking to bfloat16 (vector and portable builds) is torch's ((u - z) * s).to(bfloat16)
    bit for bit, at odd widths and rows (partial panels, channel tails)."""
    torch.manual_seed(out + n)
    if kind == "w4z":
        p = _asymmetric(out, n, group, seed=3)
    else:
        p = from_float(torch.randn(out, n), "w4a16" if kind == "w4" else "w8a16", group=group)
    st = a16_gemm.prepare_w4(p) if kind != "w8" else w8a16.prepare(p, "gemm")
    ref = p.dequantize().bfloat16()
    assert torch.equal(a16_gemm.dequantize_bf16(st), ref)
    assert torch.equal(a16_gemm.dequantize_bf16(st, _portable()), ref)


@pytest.mark.parametrize("kind", ["w4", "w8"])
def test_many_bf16_tokens_run_the_bf16_matmul(kind, monkeypatch):
    """From BF16_MIN_TOKENS bfloat16 tokens (on CPUs with bfloat16 matmuls and neither AMX-BF16 tiles
    nor AVX512_BF16 dot products in the build; forced here, the path runs anywhere) the call is torch's bfloat16 linear on the unpacked weight,
    bit for bit, and within 2^-8·Σ|x·w| + the bfloat16 output's rounding of the float64 product;
    below it, and for float32 activations, the exact int16 path (the GEMVs' bits)."""
    monkeypatch.setattr(a16_gemm, "bf16_matmul_native", lambda: True)
    monkeypatch.setattr(a16_gemm, "amx_bf16", lambda lib=None: False)
    monkeypatch.setattr(a16_gemm, "dpbf16", lambda lib=None: False)
    torch.manual_seed(7)
    p = from_float(torch.randn(48, 320), "w4a16" if kind == "w4" else "w8a16", group=64, bias=torch.randn(48))
    st = a16_gemm.prepare_w4(p) if kind == "w4" else w8a16.prepare(p, "gemm")
    gemv = w4a16.prepare(p, "native") if kind == "w4" else w8a16.prepare(p, "native")
    run_gemv = w4a16.run if kind == "w4" else w8a16.run
    t = a16_gemm.BF16_MIN_TOKENS[kind == "w4"]
    x = (torch.randn(t, 320) * torch.linspace(0.01, 10, 320)).bfloat16()
    wb = p.dequantize().bfloat16()
    y = a16_gemm.run(x, st)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, F.linear(x, wb) + p.bias.bfloat16())
    exact = x.double() @ p.dequantize().double().T + p.bias.double()
    bound = 2.0**-8 * (x.double().abs() @ p.dequantize().double().abs().T) + 2.0**-8 * exact.abs()
    assert ((y.double() - exact).abs() <= bound).all()
    assert torch.equal(a16_gemm.run(x[:-1], st), run_gemv(x[:-1], gemv))  # one token fewer: exact path
    assert torch.equal(a16_gemm.run(x.float(), st), run_gemv(x.float(), gemv))  # float32: exact path
    with pytest.raises(ValueError, match="320"):
        a16_gemm.run(torch.randn(t, 300).bfloat16(), st)


@pytest.mark.parametrize("cap,allowed", [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True),
                                         ("ALL", True), ("", True)])
def test_bf16_matmul_is_not_native_under_a_onednn_cap_below_bf16(cap, allowed, monkeypatch):
    """torch's bfloat16 matmul counts as native only where the CPU has bfloat16 products and oneDNN
    may use them: capped below (an AVX2-only CPU imitated) the exact int16 tiles keep the big calls."""
    # torch's own answer is stubbed: torch reads the cap once per process, and oneDNN takes it when
    # it starts, so the real call under a changed cap would cap every later test of this worker
    monkeypatch.setattr(a16_gemm, "_torch_onednn_bf16", lambda: True)
    monkeypatch.setattr(a16_gemm, "cpu_info", lambda: {"features": {"avx512_bf16": True}})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    a16_gemm.bf16_matmul_native.cache_clear()
    try:
        assert a16_gemm.bf16_matmul_native() == allowed
        monkeypatch.setattr(a16_gemm, "cpu_info", lambda: {"features": {"avx2": True}})
        a16_gemm.bf16_matmul_native.cache_clear()
        assert not a16_gemm.bf16_matmul_native()  # no bfloat16 products at all
    finally:
        monkeypatch.undo()
        a16_gemm.bf16_matmul_native.cache_clear()


def test_bf16_matmul_reuses_one_weight_buffer_across_shapes(monkeypatch):
    """The matmul path unpacks every weight into one per-thread buffer (grown to the largest): layers
    of different shapes called in turn, a smaller one after a larger, each give their own product;
    a wrong ``out`` for the unpacking is refused."""
    monkeypatch.setattr(a16_gemm, "bf16_matmul_native", lambda: True)
    monkeypatch.setattr(a16_gemm, "amx_bf16", lambda lib=None: False)
    monkeypatch.setattr(a16_gemm, "dpbf16", lambda lib=None: False)
    torch.manual_seed(11)
    t = a16_gemm.BF16_MIN_TOKENS[True]
    layers = [from_float(torch.randn(o, n), "w4a16", group=64) for o, n in ((48, 320), (96, 640), (16, 128))]
    panels = [a16_gemm.prepare_w4(p) for p in layers]
    xs = [torch.randn(t, p.codes.shape[1]).bfloat16() for p in layers]
    want = [F.linear(x, p.dequantize().bfloat16()) for x, p in zip(xs, layers)]
    for _ in range(2):
        for x, st, y in zip(xs, panels, want):
            assert torch.equal(a16_gemm.run(x, st), y)
    with pytest.raises(ValueError, match="contiguous bfloat16"):
        a16_gemm.dequantize_bf16(panels[0], out=torch.empty(320, 48, dtype=torch.bfloat16))


def _bf16_bound(x, wd, exact):
    """2^-8·Σ|x·w| + 2^-126·Σ|w| + half a bfloat16 ulp of the exact value (float64 tensors)."""
    ulp_half = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(2.0**-126))) - 8)
    return 2.0**-8 * (x.abs() @ wd.abs().T) + 2.0**-126 * wd.abs().sum(1) + ulp_half


def _products_span(nibbles: bool) -> tuple[int, int]:
    """The token range a test of the bfloat16 products runs over: the build's, an open end (the dot
    products) cut at 300 tokens past the start (past DP_MIN_CHUNK twice, so a call is split)."""
    lo, hi = a16_gemm.bf16_products(nibbles)
    return lo, hi if hi != a16_gemm.NO_END else lo + 300


NO_BF16_PRODUCTS = "neither AMX-BF16 tiles nor AVX512_BF16 dot products in this CPU's build"


@pytest.mark.skipif(not a16_gemm.bf16_products(True), reason=NO_BF16_PRODUCTS)
@pytest.mark.parametrize("kind,out,n,group", [("w4", 37, 333, 64), ("w4z", 50, 640, 64), ("w4", 64, 1024, 128),
                                              ("w4", 48, 320, 0), ("w8", 40, 600, 0), ("w8", 33, 96, 0),
                                              ("w4", 208, 256, 64), ("w8", 80, 127, 0)])
def test_bf16_calls_of_many_tokens_run_on_bf16_products(kind, out, n, group, monkeypatch):
    """bfloat16 calls of bf16_products' tokens multiply the unpacked bfloat16 weight on AMX-BF16
    tiles or AVX512_BF16 dot products: within 2^-8·Σ|x·w| + 2^-126·Σ|w| + the output's rounding of
    the float64 product of the same bfloat16 values, at the edges of both (tiles: 32 tokens a block,
    16 rows a panel, 32 channels a step, 8 steps a cache block; dot products: 4 tokens a tile, 1-4
    panels a block of rows, an odd channel count, calls split into chunks of tokens), with bias and
    [..., in] shapes; one token fewer than the range, and float32 calls, keep the exact int16 path
    (the GEMVs' bits); NaN/Inf spread as in a float linear. And 1 thread or 2, the same bits (each
    output is one tile's sums in one order)."""
    torch.manual_seed(out + n)
    if kind == "w8":
        p = from_float(torch.randn(out, n), "w8a16", bias=torch.randn(out))
        st, gemv, run_gemv = w8a16.prepare(p, "gemm"), w8a16.prepare(p, "native"), w8a16.run
    else:
        p = _asymmetric(out, n, group or n, seed=out) if kind == "w4z" else from_float(
            torch.randn(out, n), "w4a16", group=group, bias=torch.randn(out))
        st, gemv, run_gemv = a16_gemm.prepare_w4(p), w4a16.prepare(p, "native"), w4a16.run
    wd = a16_gemm.dequantize_bf16(st).double()
    lo, hi = _products_span(kind != "w8")
    for t in (lo, lo + 1, lo + 15, lo + 38, hi - 1):
        x = (torch.randn(t, n) * torch.linspace(0.01, 10, n)).bfloat16()
        y = a16_gemm.run(x, st)
        assert y.dtype == torch.bfloat16 and y.shape == (t, out)
        exact = x.double() @ wd.T
        ref = exact + (p.bias.bfloat16().double() if p.bias is not None else 0.0)
        assert ((y.double() - ref).abs() <= _bf16_bound(x.double(), wd, exact) + 2.0**-8 * ref.abs()).all()  # + bias rounding
        assert torch.equal(a16_gemm.run(x.reshape(1, t, n), st), y.reshape(1, t, out))
    x = (torch.randn(lo, n) * 3).bfloat16()
    assert torch.equal(a16_gemm.run(x, st), a16_gemm._bf16_products(x, st, a16_gemm.library()))  # routed there
    assert torch.equal(a16_gemm.run(x[:-1], st), run_gemv(x[:-1], gemv))  # below the range: exact path
    assert torch.equal(a16_gemm.run(x.float(), st), run_gemv(x.float(), gemv))  # float32: exact path
    assert_same_for_thread_counts(lambda: a16_gemm.run(x, st), a16_gemm.run(x, st))
    xs = (torch.randn(hi - 1, n) * 3).bfloat16()  # split into chunks on more threads (dot products)
    assert_same_for_thread_counts(lambda: a16_gemm.run(xs, st), a16_gemm.run(xs, st))
    bad = x.clone()
    bad[3, 5], bad[9, 0] = float("nan"), float("inf")
    y = a16_gemm.run(bad, st)
    assert torch.isnan(y[3]).all() and not torch.isfinite(y[9]).any() and torch.isfinite(y[[0, 1, 2, 4]]).all()


@pytest.mark.skipif(not (a16_gemm.available() and a16_gemm.library().a16_gemm_dpbf16()),
                    reason="no AVX512_BF16 dot products in this CPU's build")
@pytest.mark.parametrize("kind,out,n", [("w4", 80, 333), ("w8", 208, 128), ("w4", 64, 1024)])
def test_the_dot_products_themselves_on_any_bf16_cpu(kind, out, n):
    """The AVX512_BF16 dot products called directly (on AMX CPUs the tiles take run()'s calls, so
    this is where they are tested there): within the bfloat16 bound at 1-4 token tiles, blocks of
    1-4 panels, an odd channel count and calls split into chunks, the same bits for 1-3 threads."""
    torch.manual_seed(out + n)
    w = torch.randn(out, n)
    p = from_float(w, "w4a16", group=64) if kind == "w4" else from_float(w, "w8a16")
    st = a16_gemm.prepare_w4(p) if kind == "w4" else w8a16.prepare(p, "gemm")
    wd = a16_gemm.dequantize_bf16(st).double()
    lib = a16_gemm.library()
    for t in (1, 3, 6, 97, 250):
        x = (torch.randn(t, n) * torch.linspace(0.01, 10, n)).bfloat16()
        y = a16_gemm._bf16_products(x, st, lib, dot=True)
        exact = x.double() @ wd.T
        assert ((y.double() - exact).abs() <= _bf16_bound(x.double(), wd, exact)).all()
        assert_same_for_thread_counts(lambda: a16_gemm._bf16_products(x, st, lib, dot=True), y)


@pytest.mark.skipif(not a16_gemm.bf16_products(True), reason=NO_BF16_PRODUCTS)
def test_bf16_products_read_subnormal_activations_as_zero_within_the_bound():
    """Activations below bfloat16's normal range (AMX-BF16 and VDPBF16PS read them as zero): within
    the stated 2^-126·Σ|w| term, and exactly 0 where every activation of a token is subnormal."""
    p = from_float(torch.randn(32, 256), "w4a16", group=64)
    st = a16_gemm.prepare_w4(p)
    wd = a16_gemm.dequantize_bf16(st).double()
    x = torch.full((a16_gemm.bf16_products(True)[0], 256), 2.0**-130).bfloat16()
    x[1] = torch.randn(256).bfloat16()
    y = a16_gemm.run(x, st).double()
    exact = x.double() @ wd.T
    assert ((y - exact).abs() <= _bf16_bound(x.double(), wd, exact)).all()
    assert (y[0] == 0).all()


def test_int16_codes_near_half_integers_equal_the_portable_build():
    """int16 activation codes of values within ulps of rounding boundaries (where a product by 1/s
    would round differently than the division): the portable build's bits, and the GEMV's."""
    from tests.kernels.cpu.test_act_sym import near_half_integers, product_rounds_differently

    x, step = near_half_integers(9, 4 * 128, 32767, seed=5)
    x[:, ::128] = 32767 * step  # each group's absmax: s = 32767 step / 32767, step within an ulp
    assert product_rounds_differently(x, x[:, :1] / 32767) > 0
    p = _asymmetric(48, 512, 128, seed=3)
    gemm = w4a16.prepare(p, "gemm")
    y = a16_gemm.run(x, gemm, lib=_portable())
    assert torch.equal(a16_gemm.run(x, gemm), y)
    assert torch.equal(w4a16.run(x, w4a16.prepare(p, "native")), y)  # the GEMV's own library
