"""lowbit's batched int8 kernel (W8A8 and W4A4 ``gemm``): the same bits as the GEMV kernels
(``native``) and as its own portable build, at the boundaries of its tiles (6 tokens x 32 rows, 4
or 8 channels per step): tokens 1..17, odd widths and row counts, groups, outliers, extreme codes,
thread counts."""

import pytest
import torch

from lowbit.kernels import from_float
from lowbit.kernels.cpu import act_sym, i8_gemm, w4a4, w8a8
from lowbit.kernels.linear_params import KernelError
from tests.kernels.cpu.builds import amx_builds, bf16_edge_values, portable_build, variant_builds
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(not i8_gemm.available(), reason="no C compiler for the native kernel")


def _portable():
    return portable_build(i8_gemm.library, i8_gemm.PORTABLE_FLAGS)


@pytest.mark.parametrize("out,n", [(37, 333), (16, 4), (33, 200), (64, 96), (1, 1)])
def test_w8a8_gemm_equals_gemv_and_portable_for_1_to_17_tokens(out, n):
    torch.manual_seed(out * n)
    p = from_float(torch.randn(out, n), "w8a8", bias=torch.randn(out))
    gemm, gemv = w8a8.prepare(p, "gemm"), w8a8.prepare(p, "native")
    x = torch.randn(17, n) * 20
    y = w8a8.run(x, gemm)
    assert y.shape == (17, out)
    assert torch.equal(y, w8a8.run(x, gemv))
    assert torch.equal(y, w8a8.run(x, w8a8.prepare(p, "float")))
    c = i8_gemm.act_codes(x, 0, gemm.weight, 8, 1.0)
    assert torch.equal(i8_gemm.run_codes(c, gemm.weight, lib=_portable()) + p.bias, y)
    for t in range(1, 17):  # every tail of the 6-token tiles: a token's bits do not depend on its batch
        assert torch.equal(w8a8.run(x[:t], gemm), y[:t])


@pytest.mark.parametrize("out,n,k,group", [(37, 333, 13, 64), (48, 128, 0, 128), (17, 640, 5, 128),
                                           (96, 200, 32, 64), (33, 256, 1, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a4_gemm_equals_gemv_and_portable_for_1_to_17_tokens(out, n, k, group, dtype):
    torch.manual_seed(out + n + k)
    p = from_float(torch.randn(out, n + k), "w4a4", group=group, n_outliers=k, act_clip=0.9,
                   bias=torch.randn(out))
    gemm, gemv = w4a4.prepare(p, "gemm"), w4a4.prepare(p, "native")
    x = (torch.randn(17, n + k) * 3).to(dtype)
    y = w4a4.run(x, gemm)
    assert torch.equal(y, w4a4.run(x, gemv))  # outliers fused here, a second call and a torch add there
    c = i8_gemm.act_codes(x, k, gemm.normal, 4, 0.9)
    assert torch.equal(i8_gemm.run_codes(c, gemm.normal, gemm.outlier, lib=_portable()) + p.bias, y)
    for t in (1, 2, 5, 6, 7, 12, 13):
        assert torch.equal(w4a4.run(x[:t], gemm), y[:t])


@pytest.mark.parametrize("out,n,k,group", [(37, 333, 13, 64), (64, 576, 0, 128), (50, 1024, 128, 128),
                                           (17, 640, 5, 0), (96, 200, 32, 64), (24, 1600, 0, 0)])
def test_tiles_of_many_tokens_equal_the_portable_build(out, n, k, group):
    """An AMX build runs int8 tiles (32 tokens x 32 rows, groups padded to 64-channel steps, INT8
    panels read in place where they fit, 4-bit ones unpacked) from 8 tokens (W8A8) or 48 (W4A4); a
    build with the threshold at 1 runs them for every batch. Both give the portable loop's bits at
    the tiles' edges (1, 15-17, 31-33, 70 tokens), with and without outliers. Without AMX this
    compares the vector tiles over as many tokens."""
    torch.manual_seed(out + n + k)
    p4 = from_float(torch.randn(out, n + k), "w4a4", group=group, n_outliers=k, act_clip=0.9)
    p8 = from_float(torch.randn(out, n), "w8a8")
    s4, s8 = w4a4.prepare(p4, "gemm"), w8a8.prepare(p8, "gemm")
    x = torch.randn(70, n + k) * 3
    c4 = i8_gemm.act_codes(x, k, s4.normal, 4, 0.9)
    c8 = i8_gemm.act_codes(x[:, :n] * 7, 0, s8.weight, 8, 1.0)
    y4 = i8_gemm.run_codes(c4, s4.normal, s4.outlier, lib=_portable())
    y8 = i8_gemm.run_codes(c8, s8.weight, lib=_portable())
    for lib in amx_builds(i8_gemm.library):
        for t in (1, 15, 16, 17, 31, 32, 33, 70):
            c4t = type(c4)(*(getattr(c4, f)[:t] for f in ("xq", "scale", "xsum", "outlier", "outlier_scale")))
            c8t = type(c8)(*(getattr(c8, f)[:t] for f in ("xq", "scale", "xsum", "outlier", "outlier_scale")))
            assert torch.equal(i8_gemm.run_codes(c4t, s4.normal, s4.outlier, lib=lib), y4[:t]), (t, lib)
            assert torch.equal(i8_gemm.run_codes(c8t, s8.weight, lib=lib), y8[:t]), (t, lib)
    assert torch.equal(w4a4.run(x, s4), w4a4.run(x, w4a4.prepare(p4, "native")))


@pytest.mark.parametrize("bits,n", [(8, 512), (8, 448), (4, 384)])
def test_grouped_tiles_two_groups_a_pass_equal_the_portable_build(bits, n):
    """Groups of 128 go through the AMX tiles two at a time (one pass over the float sums): INT8
    panels read in place (unsigned, z * sum(x) subtracted) and unpacked 4-bit ones (signed), an even
    and an odd number of groups, tokens at the tiles' edges."""
    torch.manual_seed(bits + n)
    lo = -(2 ** (bits - 1))
    codes = torch.randint(lo, -lo, (48, n), dtype=torch.int8)
    codes[0], codes[1] = lo, -lo - 1  # the extreme codes in whole rows
    ng = -(-n // 128)
    w = i8_gemm.pack(codes, torch.rand(48, ng) + 0.1, bits, 128, n)
    x = torch.randn(70, n) * 3
    c = i8_gemm.act_codes(x, 0, w, bits, 1.0)
    want = i8_gemm.run_codes(c, w, lib=_portable())
    for lib in amx_builds(i8_gemm.library) + variant_builds(i8_gemm.library):  # + the products without VNNI
        for t in (1, 17, 32, 33, 70):
            ct = type(c)(*(getattr(c, f)[:t] for f in ("xq", "scale", "xsum", "outlier", "outlier_scale")))
            assert torch.equal(i8_gemm.run_codes(ct, w, lib=lib), want[:t]), (t, lib)


def test_thread_counts_and_zero_tokens():
    p = from_float(torch.randn(200, 300), "w4a4", group=64, n_outliers=12)
    st = w4a4.prepare(p, "gemm")
    x = torch.randn(9, 300)  # 288 normal channels + 12 outliers
    y = w4a4.run(x, st)
    assert_same_for_thread_counts(lambda: w4a4.run(x, st), y)
    assert w4a4.run(x[:0], st).shape == (0, 200)


def test_extreme_codes_do_not_overflow():
    """INT8 weights -128 / 127 against activations -128 over 4096 channels: the largest int32 sums
    (the unsigned form's intermediate Σ u·x wraps; the product it gives back must not)."""
    codes = torch.full((32, 4096), -128, dtype=torch.int8)
    codes[16:] = 127
    w = i8_gemm.pack(codes, torch.ones(32, 1), 8, 4096, 4096)
    xq = torch.full((7, 4096), -128, dtype=torch.int16)
    from lowbit.kernels.cpu.act_sym import NativeCodes

    c = NativeCodes(xq, torch.ones(7, 1), torch.zeros(7, 1, dtype=torch.int32), torch.zeros(7, 0, dtype=torch.int16),
                    torch.ones(7))
    expect = torch.tensor([4096 * 128 * 128] * 16 + [-4096 * 127 * 128] * 16, dtype=torch.float32)
    for lib in [None, _portable(), *variant_builds(i8_gemm.library)]:
        y = i8_gemm.run_codes(c, w, lib=lib)
        assert torch.equal(y, expect.expand(7, 32)), lib


def test_bad_codes_are_an_error_not_a_read():
    p = from_float(torch.randn(16, 128), "w8a8")
    st = w8a8.prepare(p, "gemm")
    c = i8_gemm.act_codes(torch.randn(2, 128), 0, st.weight, 8, 1.0)
    c.xq = c.xq[:, :64]
    with pytest.raises(ValueError, match="int16"):
        i8_gemm.run_codes(c, st.weight)
    with pytest.raises(ValueError, match="NaN"):
        w8a8.run(torch.full((1, 128), float("nan")), st)
    with pytest.raises(KernelError, match="method"):
        w8a8.prepare(p, "fastest")


def test_default_method_follows_the_build():
    p8 = from_float(torch.randn(16, 128), "w8a8")
    p4 = from_float(torch.randn(16, 128), "w4a4")
    simd = i8_gemm.simd()
    assert w4a4.prepare(p4).method == ("gemm" if simd else "native")
    assert w8a8.prepare(p8).method == ("gemm" if w8a8.gemm_is_default(128) else "native")
    assert w8a8.gemm_is_default(128) == (simd % 2 == 1 or simd == 512)


@pytest.mark.parametrize("out,n,k,group", [(37, 333, 13, 64), (48, 128, 0, 128), (96, 200, 32, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_call_linear_equals_codes_then_gemm_with_a_permutation(out, n, k, group, dtype):
    """i8_gemm.linear (one C call: gather, codes, products, bf16 rounding) is act_codes on x[:, perm]
    then run_codes, rounded by torch, in this build and the portable one, for 1..13 tokens."""
    torch.manual_seed(out + n)
    p = from_float(torch.randn(out, n + k), "w4a4", group=group, n_outliers=k, act_clip=0.9)
    st = w4a4.prepare(p, "gemm")
    perm = torch.randperm(n + k)
    x = (torch.randn(13, n + k) * 3).to(dtype)
    want = i8_gemm.run_codes(i8_gemm.act_codes(x.index_select(1, perm), k, st.normal, 4, 0.9), st.normal, st.outlier)
    for lib in (None, _portable()):
        y = i8_gemm.linear(x, st.args, out, perm, keep_bf16=True, lib=lib)
        assert y.dtype == dtype and torch.equal(y, want.to(dtype)), lib
        assert torch.equal(i8_gemm.linear(x, st.args, out, perm, lib=lib), want)  # float32 unless asked
    for t in (1, 5, 7):
        assert torch.equal(i8_gemm.linear(x[:t], st.args, out, perm), want[:t])
    assert torch.equal(i8_gemm.linear(x.reshape(13, 1, n + k), st.args, out, perm), want.reshape(13, 1, out))


def _orders(n: int) -> dict[str, torch.Tensor]:
    """Permutations of n channels by how long their rising head is (the part row_order.h copies by
    vector compresses, the rest gathered): lowbit's outlier reorders, and every edge of the head."""
    from lowbit.quantize.outliers import outlier_permutation

    g = torch.Generator().manual_seed(n)
    sq = torch.rand(n, generator=g)
    moved = torch.arange(n).roll(-1)  # channel 0 last: the head is all but one
    head = torch.randperm(n, generator=g)[: n // 2].sort().values
    rest = torch.tensor(sorted(set(range(n)) - set(head.tolist())))
    return {"identity": torch.arange(n), "outliers 13": outlier_permutation(sq, min(13, n)),
            "outliers 1": outlier_permutation(sq, 1), "one moved": moved, "reversed": torch.arange(n).flip(0),
            "random head, shuffled tail": torch.cat([head, rest[torch.randperm(rest.numel(), generator=g)]])}


@pytest.mark.parametrize("n_in", [17, 40, 333, 576])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_shape_of_reorder_reads_the_permuted_input(n_in, dtype):
    """The reorder in C (vector compresses of the rising head, then gathers) is x[:, perm] exactly,
    in this build and the portable one, for heads that end at every place in a vector step, rows not
    a multiple of 8 or 16, and several tokens (a step's whole-vector store must not reach the next
    token's row)."""
    k = 3 if n_in < 64 else 13
    p = from_float(torch.randn(24, n_in), "w4a4", group=n_in - k if n_in < 64 else 64, n_outliers=k, act_clip=0.9)
    st = w4a4.prepare(p, "gemm")
    torch.manual_seed(n_in)
    x = (torch.randn(9, n_in) * 3).to(dtype)
    for name, perm in _orders(n_in).items():
        want = i8_gemm.linear(x.index_select(1, perm), st.args, 24, keep_bf16=True)
        order = i8_gemm.InputOrder(perm)  # planned once, one plan per build
        for lib in (None, _portable()):
            for t in (1, 2, 9):
                for given in (perm, order):
                    got = i8_gemm.linear(x[:t], st.args, 24, given, keep_bf16=True, lib=lib)
                    assert torch.equal(got, want[:t]), (name, t, lib, type(given).__name__)


def test_a_permutation_index_outside_the_input_is_refused_by_the_c_call():
    """The C call checks every index before its gathers read through them (a wrong one would read
    outside the input): ValueError, in this build and the portable one, for either bound."""
    p = from_float(torch.randn(32, 160), "w4a4", group=64, n_outliers=16, act_clip=0.9)
    st = w4a4.prepare(p, "gemm")
    x = torch.randn(3, 160).bfloat16()
    for bad in (160, -1):
        perm = torch.randperm(160)
        perm[7] = bad
        for lib in (None, _portable()):
            with pytest.raises(ValueError, match=r"index outside \[0, 160\)"):
                i8_gemm.linear(x, st.args, 32, perm, keep_bf16=True, lib=lib)


@pytest.mark.parametrize("t", [9, 16, 17, 31, 32, 33])
def test_short_calls_share_their_passes_out_with_the_same_bits(t):
    """Calls of 9-32 tokens run their per-token passes (codes, reorder, int8 form) in items of 8
    tokens over the threads, larger calls in items of 32: every token's codes are written by the
    item that converts them, so the bits are those of the portable build for 1-4 threads, repeated
    (a mismatch of the two passes' blocks is a race that a single call may not show)."""
    torch.manual_seed(t)
    p = from_float(torch.randn(48, 576), "w4a4", group=128, n_outliers=64, act_clip=0.9)
    st = w4a4.prepare(p, "gemm")
    order = i8_gemm.InputOrder(_orders(576)["outliers 13"])
    x = (torch.randn(t, 576) * 3).bfloat16()
    want = i8_gemm.linear(x, st.args, 48, order, keep_bf16=True, lib=_portable())
    for _ in range(5):
        assert_same_for_thread_counts(lambda: i8_gemm.linear(x, st.args, 48, order, keep_bf16=True), want,
                                      counts=(1, 2, 3, 4))


def test_an_input_order_is_checked_when_planned_and_matched_to_the_linear():
    """InputOrder checks its indices in C once, when a layer is prepared (ValueError, either bound,
    this build and the portable one), refuses what is no 1-D integer tensor, and a call whose input
    width is not the order's is refused before C reads through it."""
    for bad in (160, -1):
        perm = torch.randperm(160)
        perm[7] = bad
        for lib in (None, _portable()):
            with pytest.raises(ValueError, match=r"index outside \[0, 160\)"):
                i8_gemm.InputOrder(perm, lib=lib)
    for wrong in (torch.rand(160), torch.arange(160).reshape(16, 10), [0, 1], torch.ones(160, dtype=torch.bool)):
        with pytest.raises(ValueError, match="1-D integer tensor"):
            i8_gemm.InputOrder(wrong)
    p = from_float(torch.randn(32, 160), "w4a4", group=64, n_outliers=16, act_clip=0.9)
    st = w4a4.prepare(p, "gemm")
    with pytest.raises(ValueError, match="input order of 159 channels for a linear of 160 inputs"):
        i8_gemm.linear(torch.randn(2, 160), st.args, 32, i8_gemm.InputOrder(torch.randperm(159)))
    # a plan is its build's (its vector width): the C of another build refuses it (-3), never reads it
    order, best, portable = i8_gemm.InputOrder(torch.randperm(160)), i8_gemm.library(), _portable()
    if i8_gemm.simd(best):
        x = torch.randn(2, 160)
        y = torch.empty(2, 32)
        rc = portable.i8_gemm_linear_ordered(*st.args, order.plan(best), x.data_ptr(), 0, 2, y.data_ptr(), 0, 1)
        assert rc == -3


def test_a_prepared_reorder_survives_copies_and_pickles():
    """A prepared W4A4 linear with an input reorder holds its plan (a raw pointer in C): a deep copy
    and a pickle round trip plan again, so they give the same bits after the original is gone
    (a shared plan would be read after its free)."""
    import copy
    import gc
    import pickle

    from lowbit.kernels.dispatch import prepare

    torch.manual_seed(9)
    p = from_float(torch.randn(48, 200), "w4a4", group=64, n_outliers=8, act_clip=0.9)
    perm = torch.randperm(200)
    x = (torch.randn(5, 200) * 3).bfloat16()
    prepared = prepare(p, "cpu", cpu_method="gemm", input_perm=perm)
    want = prepared.batched(x)
    assert torch.equal(want, prepare(p, "cpu", cpu_method="gemm").batched(x.index_select(1, perm)))
    copies = [copy.deepcopy(prepared), pickle.loads(pickle.dumps(prepared))]
    orders = [c._direct.keywords["perm"] for c in (prepared, *copies)]  # each its own plan in C
    assert all(isinstance(o, i8_gemm.InputOrder) for o in orders)
    assert len({o.plan(i8_gemm.library()) for o in orders}) == 3
    del prepared, orders
    gc.collect()
    for c in copies:
        assert torch.equal(c.batched(x), want)


def test_bf16_output_of_amx_tiles_is_torch_rounding_of_the_float32_output():
    """Calls of many tokens (AMX tiles where the build has them, vector tiles elsewhere) write
    bfloat16 straight from their float32 sums: the same bits as rounding the float32 output with
    torch, W8A8 and W4A4 with outliers, at the tiles' edges."""
    torch.manual_seed(5)
    s4 = w4a4.prepare(from_float(torch.randn(80, 640), "w4a4", group=128, n_outliers=64), "gemm")
    s8 = w8a8.prepare(from_float(torch.randn(80, 576), "w8a8"), "gemm")
    x = (torch.randn(70, 640) * 3).bfloat16()
    for lib in amx_builds(i8_gemm.library):
        for t in (1, 17, 33, 70):
            for st, xt in ((s4, x[:t]), (s8, x[:t, :576])):
                want = i8_gemm.linear(xt, st.args, 80, lib=lib)
                got = i8_gemm.linear(xt, st.args, 80, keep_bf16=True, lib=lib)
                assert got.dtype == torch.bfloat16 and torch.equal(got, want.bfloat16()), (t, lib)


def test_every_channel_an_outlier_through_the_tiles():
    """No normal group at all (every input channel an INT8 outlier): the tiles' float sums start
    from zero, not from a previous call's memory; the portable build's bits at AMX sizes."""
    st = w4a4.prepare(from_float(torch.randn(32, 64), "w4a4", group=64, n_outliers=64), "gemm")
    x = torch.randn(70, 64)
    want = i8_gemm.linear(x, st.args, 32, lib=_portable())
    for lib in amx_builds(i8_gemm.library):
        i8_gemm.linear(x * 1e3, st.args, 32, lib=lib)  # leaves other sums in the per-thread buffers
        assert torch.equal(i8_gemm.linear(x, st.args, 32, lib=lib), want), lib


def test_output_rounding_matches_torch_at_bf16_edges():
    v = bf16_edge_values()
    nan = v.isnan()
    want = v.bfloat16()
    for lib in (None, _portable()):
        got = i8_gemm.round_bf16(v, lib)
        # NaN stays NaN (payload bits differ within torch itself: 0x7FC0 scalar, 0xFFFF vectorized)
        assert torch.equal(got.isnan(), nan), lib
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16)), lib


def test_one_call_linear_refuses_bad_input_without_reading_it():
    p = from_float(torch.randn(16, 128), "w4a4", group=64, n_outliers=8)
    st = w4a4.prepare(p, "gemm")
    bad = torch.arange(128)
    bad[3] = 128
    with pytest.raises(ValueError, match="outside"):
        i8_gemm.linear(torch.randn(2, 128), st.args, 16, bad)
    with pytest.raises(ValueError, match="int64"):
        i8_gemm.linear(torch.randn(2, 128), st.args, 16, torch.arange(128, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[\.\.\., 128\]"):
        i8_gemm.linear(torch.randn(2, 120), st.args, 16)
    with pytest.raises(ValueError, match="NaN"):
        i8_gemm.linear(torch.full((1, 128), float("inf")), st.args, 16)
    with pytest.raises(ValueError, match="outlier panels"):
        i8_gemm.linear_args(st.normal, None, 8, 128, 4, 1.0)


def test_outlier_codes_the_c_would_misread_are_refused():
    """The C reads the outlier codes as int16 [t, k], their scales as [t] and the outlier panels as
    bytes: int8 codes (read as int16), codes of one token for four, and 4-bit panels had returned
    wrong numbers or read past the tensors."""
    torch.manual_seed(0)
    st = w4a4.prepare(from_float(torch.randn(16, 192), "w4a4", group=64, n_outliers=64), "gemm")
    c = i8_gemm.act_codes(torch.randn(4, 192), 64, st.normal, 4, 1.0)
    ref = i8_gemm.run_codes(c, st.normal, st.outlier)
    nibbles = i8_gemm.pack(torch.randint(-7, 7, (16, 64)), torch.rand(16, 1), 4, 64, 64)
    cases = {"int8 codes": (dict(outlier=c.outlier.to(torch.int8)), st.outlier),
             "one token's codes": (dict(outlier=c.outlier[:1].clone(), outlier_scale=c.outlier_scale[:1].clone()),
                                   st.outlier),
             "one token's scales": (dict(outlier_scale=c.outlier_scale[:1].clone()), st.outlier),
             "4-bit panels": ({}, nibbles)}
    for name, (change, panels) in cases.items():
        bad = act_sym.NativeCodes(**{**vars(c), **change})
        with pytest.raises(ValueError, match="outlier"):
            i8_gemm.run_codes(bad, st.normal, panels)
            pytest.fail(name)
    with pytest.raises(ValueError, match="outlier panels"):
        i8_gemm.linear_args(st.normal, nibbles, 64, 192, 4, 1.0)
    assert torch.equal(i8_gemm.run_codes(c, st.normal, st.outlier), ref)


@pytest.mark.parametrize("bits,group,k_pad,ng", [(8, 0, 64, 1), (8, 6, 64, 11), (4, 12, 64, 6), (8, 16, 62, 4),
                                                 (4, 16, 60, 4), (8, 16, 64, 3), (4, 16, 48, 2), (3, 16, 64, 4)])
def test_pack_refuses_groups_the_kernel_cannot_step_over(bits, group, k_pad, ng):
    """Group 0 gave all-zero outputs, groups off the 4- / 8-channel steps or scales of another group
    count silently wrong ones."""
    codes = torch.randint(-7, 7, (16, min(k_pad, 64)))
    with pytest.raises(ValueError, match="i8 gemm"):
        i8_gemm.pack(codes, torch.rand(16, ng), bits, group, k_pad)


@pytest.mark.parametrize("level,narrow,wide", [(0, "native", "native"), (256, "native", "gemm"), (257, "gemm", "gemm"),
                                               (512, "gemm", "gemm"), (513, "gemm", "gemm")])
def test_w8a8_default_method_by_build_and_width(level, narrow, wide, monkeypatch):
    """W8A8's default: the batched kernel on VNNI and AVX-512 builds; on AVX2 builds only from
    GEMM_MIN_IN_AVX2 inputs (the GEMV leads narrower layers from 64 tokens); the GEMV elsewhere."""
    monkeypatch.setattr(i8_gemm, "simd", lambda lib=None: level)
    for n_in, want in ((576, narrow), (w8a8.GEMM_MIN_IN_AVX2 - 4, narrow), (w8a8.GEMM_MIN_IN_AVX2, wide)):
        p = from_float(torch.randn(16, n_in), "w8a8")
        assert w8a8.prepare(p).method == want, (level, n_in)
