"""QuickAllReduce on real process groups (gloo, local ranks): bit-identical results on every rank,
equal to the single-process replay, within the two-stage error bound; fallbacks; faults."""

import time

import pytest
import torch
import qr_workers as wk

from lowbit.comm.accuracy import error_bound, exact_sum, simulate
from lowbit.parallel.launch import check_results, run_ranks

ALL = [(c, d, 5000, 1, False) for c in ("fp", "int8", "int6", "int4", "int3", "fp4") for d in ("float32", "bfloat16", "float16")]
FEW = [("int4", "bfloat16", 7000, 2, False), ("fp4", "float16", 3000, 3, True), ("int3", "float32", 2100, 4, False),
       ("fp", "bfloat16", 900, 5, False), ("int8", "float32", 1, 6, False)]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_bit_identical_on_every_rank_and_within_bound(world):
    cases = ALL + [("int4", "bfloat16", 3000, 2, True), ("int4", "float16", 20000, 7, False, True),
                   ("fp4", "bfloat16", 9000, 8, True, True)] if world == 2 else FEW + [("int8", "bfloat16", 30000, 9, False, True)]
    res = check_results(run_ranks(wk.reduce_cases, world, cases, timeout_s=30, deadline_s=150))
    for i, (codec, dtype, n, seed, *_) in enumerate(cases):
        outs = [r[0][i] for r in res]
        for o in outs[1:]:
            assert torch.equal(o.view(torch.uint8), outs[0].view(torch.uint8)), (world, codec, dtype)
        inputs = [wk.rank_input(r, n, wk.DTYPES[dtype], seed) for r in range(world)]
        assert torch.equal(outs[0].view(torch.uint8), simulate(inputs, codec).view(torch.uint8))
        err = (outs[0].double() - exact_sum(inputs)).abs()
        assert bool((err <= error_bound(inputs, codec)).all()), (world, codec, dtype)
    warned = any("INT3" in m for m in res[0][1])
    assert warned == (world > 2 and any(c[0] == "int3" for c in cases))


@pytest.fixture(scope="module")
def two_rank_checks():
    return check_results(run_ranks(wk.faults_and_fallbacks, 2, timeout_s=30, deadline_s=150))


def test_fallback_to_plain_all_reduce(two_rank_checks):
    for r in two_rank_checks:
        f = r["fallback"]
        assert f["small_path"] == "plain" and f["small_equal"]
        assert f["max_path"] == "plain" and f["max_equal"]
        assert f["env_path"] == "int4"  # LOWBIT_QR_MIN_BYTES=0 beats the argument
        assert f["ints"] == [3 * i for i in range(10)]  # integer tensors: plain and exact


@pytest.mark.parametrize("kind", ["size", "dtype"])
def test_mismatch_is_a_clear_error_on_every_rank(two_rank_checks, kind):
    for r in two_rank_checks:
        assert r[kind].startswith("MetadataMismatchError"), r[kind]
        assert "rank 0:" in r[kind] and "rank 1:" in r[kind]
    # the group is still usable afterwards
    a, b = (r["after_mismatch"] for r in two_rank_checks)
    assert torch.equal(a, b)


@pytest.mark.parametrize("codec", ["int4", "fp4"])
def test_nonfinite_poisons_only_its_block(two_rank_checks, codec):
    y = two_rank_checks[0]["nonfinite"][codec]
    assert torch.equal(y.view(torch.uint8), two_rank_checks[1]["nonfinite"][codec].view(torch.uint8))
    inputs = [wk.rank_input(r, 3 * 2048, torch.float32, 11) for r in range(2)]
    bad = torch.zeros(3 * 2048, dtype=torch.bool)
    bad[96:128] = True  # x[100] = NaN
    bad[4992:5024] = True  # x[5000] = inf
    assert bool(torch.isnan(y[bad]).all())
    assert torch.equal(y[~bad], simulate(inputs, codec)[~bad])


def test_fp_codec_nonfinite_is_elementwise(two_rank_checks):
    y = two_rank_checks[0]["nonfinite"]["fp"]
    assert torch.isnan(y[100]) and y[5000] == float("inf")
    assert int((~torch.isfinite(y)).sum()) == 2


@pytest.mark.parametrize("codec", ["int8", "int3", "fp4", "fp"])
def test_fp16_overflow_matches_dist_all_reduce(two_rank_checks, codec):
    for r in two_rank_checks:
        y, ref = r["overflow"][codec]
        assert torch.equal(torch.isinf(y), torch.isinf(ref))
        assert torch.equal(torch.sign(y[torch.isinf(y)]), torch.sign(ref[torch.isinf(ref)]))
        assert not bool(torch.isnan(y).any())


def test_dead_rank_fails_the_others_within_the_timeout():
    t0 = time.monotonic()
    res = run_ranks(wk.dead_peer, 3, timeout_s=10, deadline_s=90)
    assert time.monotonic() - t0 < 80
    assert res[2][0] == "error"  # the rank that died reports nothing
    for status, msg in res[:2]:
        assert status == "ok" and msg.startswith("AllReduceError"), msg


@pytest.mark.parametrize("world", [2, 3])
def test_fp_codec_equals_dist_all_reduce_up_to_summation_order(world):
    """The FP codec sends raw values (fp32 too): at W = 2 the sum is dist.all_reduce's bit for bit
    (one addition, commutative); at W = 3 only the order of two fp32 additions may differ."""
    cases = [("float32", 70000, 21), ("float32", 5000, 22)]
    res = check_results(run_ranks(wk.fp_and_plain, world, cases, timeout_s=30, deadline_s=120))
    for i, (dtype, n, seed) in enumerate(cases):
        inputs = [wk.rank_input(r, n, wk.DTYPES[dtype], seed) for r in range(world)]
        mag = sum(x.double().abs() for x in inputs)
        for r in range(world):
            got, ref = res[r][i]
            assert torch.equal(got.view(torch.uint8), res[0][i][0].view(torch.uint8))
            if world == 2:
                assert torch.equal(got, ref)
            else:  # two fp32 roundings per element in either order
                assert bool(((got.double() - ref.double()).abs() <= 2 * 2.0**-24 * mag * 2).all())


@pytest.mark.parametrize("world", [2, 3])
def test_pipelined_rounds_equal_the_unpipelined_algorithm(world):
    """Rounds overlapped in flight (async collectives) give the one-round result bit for bit, on every rank."""
    cases = [("int4", "bfloat16", 7 * world * 2048 + 123, 31), ("int3", "float32", 5 * world * 2048, 32),
             ("fp", "float16", 3 * world * 2048 + 1, 33), ("fp4", "bfloat16", 2048, 34)]
    res = check_results(run_ranks(wk.pipeline_variants, world, cases, timeout_s=30, deadline_s=120))
    for i, (codec, dtype, n, seed) in enumerate(cases):
        inputs = [wk.rank_input(r, n, wk.DTYPES[dtype], seed) for r in range(world)]
        want = simulate(inputs, codec).view(torch.uint8)
        for r in range(world):
            for got in res[r][i]:
                assert torch.equal(got.view(torch.uint8), want), (world, codec, dtype, r)


def test_buffers_from_inference_mode_work_outside_it():
    res = check_results(run_ranks(wk.inference_mode_then_normal, 2, timeout_s=30, deadline_s=90))
    for outs in res:
        assert all(torch.equal(o, res[0][0]) for o in outs)
