"""Outlier channels (+oN) and the block Hadamard (+h) around the all-reduce codecs: names and wire
sizes, the fast split/merge against a plain reference, the distributed result on 2 and 3 gloo
ranks (bit-identical on every rank, equal to the one-process simulation, within the error bound,
the outlier channels exact) and the clear errors."""

import pytest
import torch
import channel_workers as cw

from lowbit.comm.channel_accuracy import channel_error_bound, merge_reference, simulate_channels, split_reference
from lowbit.comm.channels import ChannelPlan, transform_bound
from lowbit.comm.codecs import encode, parse_spec
from lowbit.parallel.launch import check_results, run_ranks


def test_names_and_wire_sizes():
    assert parse_spec("INT4+o16+h").name == "int4+h+o16"
    assert parse_spec("int3+h32").hadamard == 32 and parse_spec("int4+h").hadamard == 64
    s = parse_spec("int4+o16")
    assert s.bits_per_value(torch.bfloat16, 576) - 4.5 == pytest.approx(16 * 16 / 576)  # +0.44
    assert 16 / s.bits_per_value(torch.bfloat16, 576) >= 3.0  # >= 3x fewer bytes than bf16
    assert s.wire_bytes(576 * 10, torch.bfloat16, 576) == 3 * 1152 + 10 * 16 * 2
    assert parse_spec("int4+h").wire_bytes(5000, torch.float32) == 3 * 1152
    for bad, msg in [("int4+x", "unknown option"), ("fp+o4", "raw values"), ("int4+o0", "at least one"),
                     ("int4+h+h32", "twice"), ("int9+h", "unknown codec")]:
        with pytest.raises(ValueError, match=msg):
            parse_spec(bad)


def test_plan_errors():
    ok = cw.channels_for(16)
    for spec, hidden, chans, msg in [
        ("int4+o16", 576, None, "needs its 16 outlier channels"),
        ("int4+o16", 576, ok[:8], "needs 16 outlier channels, got 8"),
        ("int4+o16", 576, torch.cat([ok[:15], ok[:1]]), "distinct"),
        ("int4+o16", 576, torch.cat([ok[:15], torch.tensor([576])]), r"\[0, 576\)"),
        ("int4+o16", 576, ok.float(), "integers"),
        ("int4+o16", 16, torch.arange(16), "fewer than 16"),
        ("int4+h", 100, None, "multiple of the Hadamard block 64"),
        ("int4+h", None, None, "needs the hidden size"),
        ("int4", 576, ok, "no \\+oN option"),
    ]:
        with pytest.raises(ValueError, match=msg):
            ChannelPlan.make(spec, hidden, chans)
    plan = ChannelPlan.make("int4+o16", 576, ok)
    with pytest.raises(ValueError, match="hidden size 576"):
        plan.split(torch.zeros(4, 288))
    assert ChannelPlan.make("int4", 576) is None


@pytest.mark.parametrize("spec", ["int4+o16", "int4+h", "int4+h32+o8", "int3+h+o16"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_split_and_merge_equal_the_reference(spec, dtype):
    s = parse_spec(spec)
    plan = ChannelPlan.make(s, 576, cw.channels_for(s.outliers) if s.outliers else None)
    x = cw.channel_input(0, 5, dtype, 2)
    rest, outl = plan.split(x)
    ref_rest, ref_outl = split_reference(x, plan)
    assert torch.equal(outl, ref_outl)
    zeroed = x.float().index_fill(1, plan.channels, 0.0)
    bound = transform_bound(zeroed, plan.block) if plan.block else torch.zeros(1)
    assert bool(((rest.double() - ref_rest).abs() <= bound).all())
    osum = outl.float() * 3
    out = plan.merge(rest.clone(), osum, torch.empty(5, 576, dtype=torch.float32))
    ref = merge_reference(rest, osum, plan)
    back = transform_bound(rest.abs(), plan.block) if plan.block else torch.zeros(1)
    assert bool(((out.double() - ref).abs() <= back).all())
    assert torch.equal(out[:, plan.channels], osum)
    # split then merge is the identity up to the two transforms' rounding
    assert torch.allclose(out.index_fill(1, plan.channels, 0.0), zeroed, rtol=0, atol=1e-4 * float(x.float().abs().max()))


CASES = [("int4+o16", "bfloat16", 7, 1, "twoshot"), ("int4+h", "float32", 5, 2, "oneshot"),
         ("int3+h+o16", "float16", 9, 3, "twoshot"), ("int4+h32+o8", "bfloat16", 4, 4, "oneshot"),
         ("int8+h+o4", "float32", 40, 5, "twoshot"), ("fp4+o16", "bfloat16", 3, 6, "oneshot")]


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_bit_identical_and_equal_to_the_simulation(world):
    res = check_results(run_ranks(cw.channel_cases, world, CASES, timeout_s=30, deadline_s=180))
    for i, (spec, dtype, tokens, seed, shot) in enumerate(CASES):
        outs = [r["out"][i] for r in res]
        for o in outs[1:]:
            assert torch.equal(o.view(torch.uint8), outs[0].view(torch.uint8)), (world, spec)
        s = parse_spec(spec)
        plan = ChannelPlan.make(s, 576, cw.channels_for(s.outliers) if s.outliers else None)
        inputs = [cw.channel_input(r, tokens, dtype, seed) for r in range(world)]
        sim = simulate_channels(inputs, s, plan, shot)
        assert torch.equal(outs[0].view(torch.uint8), sim.view(torch.uint8)), (world, spec)
        exact = sum(x.double() for x in inputs)
        err = (outs[0].double() - exact).abs().reshape(-1)
        bound = channel_error_bound(inputs, s, plan)
        assert bool((err <= bound).all()), (world, spec, float((err / bound).max()))
        if s.outliers:  # the outlier channels: float32 sums, one cast
            assert torch.equal(outs[0][:, plan.channels], exact[:, plan.channels].float().to(outs[0].dtype)) or \
                bool((err.view(exact.shape)[:, plan.channels] <= bound.view(exact.shape)[:, plan.channels]).all())
        assert res[0]["paths"][i] == (s.name, shot)
        assert all(r["checks"][i] == 1 for r in res)  # two calls, one metadata exchange


def test_outliers_and_hadamard_beat_the_plain_codec():
    """On residual-like messages (a few huge channels) the options cut the error, as on the real model."""
    inputs = [cw.channel_input(r, 16, "float32", 9) for r in range(2)]
    exact = sum(x.double() for x in inputs)
    errs = {}
    for spec in ("int4", "int4+h", "int4+o16", "int4+h+o16"):
        s = parse_spec(spec)
        plan = ChannelPlan.make(s, 576, cw.channels_for(s.outliers) if s.outliers else None) or ChannelPlan.make("int4+h", 576)
        got = simulate_channels(inputs, s, plan) if not s.plain_codec else None
        if got is None:
            from lowbit.comm.accuracy import simulate
            got = simulate([x.reshape(-1) for x in inputs], s.codec).view(exact.shape)
        errs[spec] = float(((got.double() - exact) ** 2).mean())
    assert errs["int4+o16"] < errs["int4"] / 4 and errs["int4+h"] < errs["int4"] and errs["int4+h+o16"] < errs["int4+h"]


def test_per_call_plans_and_a_noncontiguous_message():
    a, b = check_results(run_ranks(cw.per_call_plans, 2, timeout_s=30, deadline_s=120))
    for k in ("a", "b", "noncontig"):
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
    assert torch.equal(a["a"], a["noncontig"]) and a["untouched"]
    plan = ChannelPlan.make("int4+o8", 576, cw.channels_for(8))
    sim = simulate_channels([cw.channel_input(r, 6, "bfloat16", 3) for r in range(2)], "int4+o8", plan)
    assert torch.equal(a["a"], sim)
    assert a["checks"] == 2  # two channel sets: two jobs, the repeated one cached


@pytest.mark.parametrize("kind,err,text", [("channels", "MetadataMismatchError", "outlier channels #"),
                                           ("shape", "ValueError", "hidden size 576")])
def test_bad_jobs_fail_clearly_on_every_rank(kind, err, text):
    res = check_results(run_ranks(cw.bad_jobs, 2, kind, timeout_s=30, deadline_s=120))
    for r in res:
        assert r.startswith(err) and text in r, r


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_c_split_and_merge_equal_the_torch_path(dtype):
    from lowbit.comm.codecs import native

    if not native.available():
        pytest.skip("no C compiler: the torch path is the only one")
    g = torch.Generator().manual_seed(5)
    for spec, n, tokens in [("int4+h+o16", 16, 37), ("int4+o16", 16, 5), ("int4+h32", 0, 9), ("int3+h+o3", 3, 64)]:
        plan = ChannelPlan.make(spec, 576, torch.randperm(576, generator=g)[:n] if n else None)
        x = (torch.randn(tokens, 576, generator=g) * torch.rand(576, generator=g) * 100).to(dtype)
        x[0, 3] = float("nan")
        if dtype != torch.float16:  # blocks whose scale is beyond fp16: the extended scales' general path
            x[1, 100:300] *= 1e30
        x[2, :128] = -0.0  # the encode keeps its zeros' signs (only the merge adds +0)
        rc, oc = plan.split(x, {})
        rt, ot = plan.split_torch(x)
        assert torch.equal(rc.view(torch.int32), rt.view(torch.int32)) and torch.equal(oc.view(torch.uint8), ot.view(torch.uint8))
        for codec in ("int4", "int3", "fp4", "int8"):
            c = parse_spec(codec).codec
            wire = torch.empty((tokens * 576 + 2047) // 2048, c.row_bytes, dtype=torch.uint8)
            outl = torch.empty(tokens, n, dtype=dtype)
            plan.encode(x, c, wire, outl)  # fused per row in C
            assert torch.equal(wire, encode(rt.reshape(-1), c)) and torch.equal(outl.view(torch.uint8), ot.view(torch.uint8))
        osum = torch.randn(tokens, n, generator=g) * 1e4
        for odt in (torch.float32, torch.bfloat16, torch.float16):
            a = plan.merge(rc, osum, torch.empty(tokens, 576, dtype=odt))
            b = plan.merge_torch(rc.clone(), osum, torch.empty(tokens, 576, dtype=odt))
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (spec, dtype, odt)
    with pytest.raises(ValueError, match="sorted, distinct"):
        native.split_channels(torch.zeros(576), 576, torch.tensor([5, 3]), 2, 0, 1.0)
    with pytest.raises(ValueError, match="whole tokens"):
        native.split_channels(torch.zeros(577), 576, torch.tensor([3, 5]), 2, 0, 1.0)


@pytest.mark.parametrize("odt", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_decode_merge_equals_decode_sum_then_merge(odt):
    """The one-shot's local step in one C pass per row (decode every rank's rows, float32 sum in
    rank order, inverse block Hadamard, outlier sums in, one cast) against the torch path, and the
    portable build against the native one."""
    from lowbit.comm.codecs import decode, decode_add, native

    if not native.available():
        pytest.skip("no C compiler: the torch path is the only one")
    portable = native.variant(native.PORTABLE_FLAGS)
    g = torch.Generator().manual_seed(7)
    for spec, n, tokens, world in [("int4+h+o16", 16, 37, 3), ("int4+o16", 16, 5, 2), ("int4+h32", 0, 9, 2),
                                   ("int3+h+o3", 3, 64, 1), ("fp4+h", 0, 4, 2), ("int4+h+o16", 16, 37, 1),
                                   ("int4+h", 0, 64, 1)]:
        plan = ChannelPlan.make(spec, 576, torch.randperm(576, generator=g)[:n] if n else None)
        c = parse_spec(spec).codec
        wires = []
        for _ in range(world):
            x = (torch.randn(tokens, 576, generator=g) * torch.rand(576, generator=g) * 100).to(odt)
            wire = torch.empty((tokens * 576 + 2047) // 2048, c.row_bytes, dtype=torch.uint8)
            plan.encode(x, c, wire, torch.empty(tokens, n, dtype=odt))
            wires.append(wire)
        osum = torch.randn(tokens, n, generator=g) * 1e4
        acc = decode(wires[0], c, tokens * 576, torch.float32, fp_wire=torch.float32)
        for w in wires[1:]:
            decode_add(acc, w, c, fp_wire=torch.float32)
        want = plan.merge_torch(acc.view(tokens, 576), osum, torch.empty(tokens, 576, dtype=odt))
        got = plan.decode_merge(wires, c, osum, torch.empty(tokens, 576, dtype=odt))
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (spec, odt)
        if portable is not None:
            p = native.decode_merge_channels(wires, 0 if c.kind == "int" else 1, c.bits, c.row_bytes, c.code_bytes, 576,
                                             plan.channels, n, plan.block, plan.scale, osum if n else None,
                                             torch.empty(tokens * 576, dtype=odt), lib=portable)
            assert torch.equal(p.view(torch.uint8), want.view(-1).view(torch.uint8)), (spec, odt, "portable")
    plan = ChannelPlan.make("int4+o2", 576, torch.tensor([1, 9]))
    c = parse_spec("int4").codec
    with pytest.raises(ValueError, match="outlier sums"):
        plan.decode_merge([torch.zeros(1, c.row_bytes, dtype=torch.uint8)], c, None, torch.empty(1, 576))
    with pytest.raises(ValueError, match="wire 1"):
        plan.decode_merge([torch.zeros(1, c.row_bytes, dtype=torch.uint8), torch.zeros(2, c.row_bytes, dtype=torch.uint8)],
                          c, torch.zeros(1, 2), torch.empty(1, 576))


def test_float16_sums_at_the_limit_stay_finite_and_bad_outlier_sums_are_refused():
    """FP4 decodes float16 65504 as 65520, which float16 rounds to inf: the channel options' merge
    keeps such a sum at 65504, as the plain codec does (it came back inf), in the torch path, the C
    merge and the fused decode_merge; NaN stays NaN. The outlier sums must be float32 CPU
    [tokens, N]: a transposed one (merged silently before) or a meta one (its pointer handed to C)
    is refused by both merges."""
    from lowbit.comm.codecs import native

    c = parse_spec("fp4").codec
    plan = ChannelPlan.make("fp4+o2", 64, torch.tensor([10, 20]))
    x = torch.zeros(32, 64, dtype=torch.float16)
    x[0, 0], x[0, 1], x[1, 3] = 65504.0, -65504.0, float("nan")
    wire = torch.empty(1, c.row_bytes, dtype=torch.uint8)
    outl = torch.empty(32, 2, dtype=torch.float16)
    plan.encode(x, c, wire, outl)
    y = plan.decode_merge([wire], c, outl.float(), torch.empty_like(x))
    assert y[0, 0].item() == 65504.0 and y[0, 1].item() == -65504.0 and bool(torch.isnan(y[1, 3]))
    rest, _ = plan.split_torch(x)
    assert plan.merge_torch(rest.clone(), outl.float(), torch.empty_like(x))[0, 0].item() == 65504.0
    for bad in (outl.float().T.contiguous(), outl.float().to("meta"), None):
        with pytest.raises(ValueError, match="outlier sums"):
            plan.merge(rest, bad, torch.empty_like(x))
        with pytest.raises(ValueError, match="outlier sums"):
            plan.decode_merge([wire], c, bad, torch.empty_like(x))
    if native.available():
        with pytest.raises(ValueError, match="cannot hold"):  # three rows of input, one row of wire: rows were dropped
            native.encode_rows(torch.ones(3 * 2048), 0, 8, 1, parse_spec("int8").codec.row_bytes,
                               parse_spec("int8").codec.code_bytes)


def test_decode_merge_with_a_tiny_hadamard_scale_keeps_the_portable_bits():
    """AVX512_BF16's cast flushes subnormal inputs; decoded sums stay normal only for a Hadamard
    scale that keeps 2^-25 normal (ChannelPlan's 1/sqrt(B) does). The C entry point takes any
    scale: below that bound the build must fall back to the exact rounding (found by review)."""
    from lowbit.comm.codecs import native

    portable = native.variant(native.PORTABLE_FLAGS)
    if not native.available() or portable is None:
        pytest.skip("no C compiler")
    c = parse_spec("int4").codec
    g = torch.Generator().manual_seed(11)
    wire = torch.randint(0, 256, (2, c.row_bytes), dtype=torch.uint8, generator=g)
    wire[:, c.code_bytes:] = torch.tensor([0x3C00], dtype=torch.int16).view(torch.uint8).repeat(64)  # scales 1.0
    chans = torch.zeros(0, dtype=torch.int64)
    for scale in (2.0 ** -128, 2.0 ** -100, 0.125):
        got, want = (native.decode_merge_channels([wire], 0, 4, c.row_bytes, c.code_bytes, 512, chans, 0, 32, scale, None,
                                                  torch.empty(4096, dtype=torch.bfloat16), lib=lib)
                     for lib in (None, portable))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), scale


@pytest.mark.parametrize("world,chunk_bytes,depth", [(2, 1 << 16, 3), (3, 1 << 16, 1), (2, 0, 3)])
def test_two_shot_rounds_of_whole_tokens_equal_the_simulation(world, chunk_bytes, depth):
    """The channel plan's two-shot runs rounds of whole tokens and rows (32 tokens of 576 at the
    smallest; 100 tokens: four rounds, the last a short tail) through the fused encode and
    decode-merge; every rank and every round size and depth give the simulation's bits."""
    res = check_results(run_ranks(cw.two_shot_rounds, world, 100, chunk_bytes, depth, timeout_s=60, deadline_s=180))
    for spec, dtype in (("int4+h+o8", "bfloat16"), ("int3+h", "float16")):
        s = parse_spec(spec)
        plan = ChannelPlan.make(s, 576, cw.channels_for(s.outliers) if s.outliers else None)
        sim = simulate_channels([cw.channel_input(r, 100, dtype, 11) for r in range(world)], s, plan, "twoshot")
        for r in res:
            assert r[spec][1] == "twoshot"
            assert torch.equal(r[spec][0].view(torch.uint8), sim.view(torch.uint8)), (world, spec, chunk_bytes)


def test_decoded_zeros_are_positive_before_the_inverse_hadamard():
    """A zero code decodes to -0 under a negative scale; the merge adds +0 before the inverse block
    Hadamard, so no -0 comes out of it (x - x is +0 anyway), and the C path's integer stages for one
    INT4 wire (which never see the scale's sign on a zero) give the torch path's bits."""
    from lowbit.comm.codecs import decode

    c = parse_spec("int4").codec
    plan = ChannelPlan.make("int4+h", 576)
    g = torch.Generator().manual_seed(3)
    tokens = 32  # 9 full rows
    wire = torch.empty(9, c.row_bytes, dtype=torch.uint8)
    codes = torch.tensor([0x88, 0x89, 0x98, 0x78, 0x87, 0x8A], dtype=torch.uint8)  # zeros and +-1, +-2
    wire[:, : c.code_bytes] = codes[torch.randint(0, 6, (9, c.code_bytes), generator=g)]
    wire[:4, : c.code_bytes] = 0x88  # whole rows of zero codes
    signs = torch.randint(0, 2, (9, 64), generator=g, dtype=torch.int32)
    wire[:, c.code_bytes :] = (torch.where(signs == 1, 0xB800, 0x3800).to(torch.int16)  # -0.5 / +0.5 in fp16
                               .view(torch.uint8).view(9, 128))
    for odt, wires in [(torch.float32, [wire]), (torch.bfloat16, [wire]), (torch.float32, [wire, wire])]:
        acc = decode(wire, c, tokens * 576, torch.float32, fp_wire=torch.float32)
        if len(wires) == 2:
            acc += acc  # -0 + -0 stays -0
        assert bool((torch.signbit(acc) & (acc == 0)).any())  # the -0 the rule is about
        want = plan.merge_torch(acc.view(tokens, 576), None, torch.empty(tokens, 576, dtype=odt))
        got = plan.decode_merge(wires, c, None, torch.empty(tokens, 576, dtype=odt))
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (odt, len(wires))
        zero = got.float() == 0
        assert bool(zero.any()) and not bool((torch.signbit(got.float()) & zero).any()), (odt, len(wires))


@pytest.mark.parametrize("shot", ["twoshot", "oneshot"])
def test_a_dead_rank_fails_the_channel_paths_clearly(shot):
    """A peer that dies before a channel-plan all-reduce: the others raise AllReduceError naming the
    step, within the process group's timeout (the two-shot's first collective is the outlier
    channels' all-gather, then the rounds')."""
    res = run_ranks(cw.dead_peer_channels, 3, shot, timeout_s=10, deadline_s=90)
    assert res[2][0] == "error"  # the rank that died reports nothing
    for status, msg in res[:2]:
        assert status == "ok" and msg.startswith("AllReduceError") and "peer rank died" in msg, msg
