"""The one-shot path on real gloo groups: bit-identical on every rank and equal, bit for bit, to
decode-then-sum by the reference codec; one metadata exchange per job, not per call."""

import pytest
import torch
import qr_workers as wk

from lowbit.comm.oneshot import oneshot_reference
from lowbit.parallel.launch import check_results, run_ranks

CASES = [("int4", "bfloat16", 5000, 1, False), ("int8", "float32", 2100, 2, False), ("fp4", "float16", 3000, 3, False),
         ("int3", "bfloat16", 700, 4, False), ("int6", "float16", 4096, 5, False), ("fp", "float32", 1000, 6, False),
         ("fp", "bfloat16", 2049, 7, False), ("int4", "bfloat16", 5000, 1, True), ("int8", "float16", 3000, 8, True)]


@pytest.mark.parametrize("world", [2, 3])
def test_oneshot_equals_decode_then_sum_reference(world):
    res = check_results(run_ranks(wk.oneshot_cases, world, CASES, timeout_s=30, deadline_s=150))
    for i, (codec, dtype, n, seed, ties) in enumerate(CASES):
        outs = [r["out"][i] for r in res]
        for o in outs[1:]:
            assert torch.equal(o.view(torch.uint8), outs[0].view(torch.uint8)), (world, codec, dtype)
        inputs = [wk.oneshot_input(r, n, dtype, seed, ties) for r in range(world)]
        # +m/-m ties in a block: the fast codecs' own bytes (they break the tie unlike reference.py)
        ref = oneshot_reference(inputs, codec, codecs="fast" if ties else "reference")
        assert torch.equal(outs[0].view(torch.uint8), ref.view(torch.uint8)), (world, codec, dtype, ties)
        assert res[0]["paths"][i] == (codec, "oneshot", "oneshot")
    assert all(c == 1 for r in res for c in r["checks"])  # three calls, one exchange each job


def test_oneshot_nonfinite_and_fp16_overflow():
    res = check_results(run_ranks(wk.oneshot_edges, 2, timeout_s=30, deadline_s=120))
    a, b = res
    assert a["shot"] == "oneshot"
    assert torch.equal(a["nonfinite"].view(torch.uint8), b["nonfinite"].view(torch.uint8))
    y = a["nonfinite"]
    bad = torch.zeros(y.numel(), dtype=torch.bool)
    bad[96:128] = bad[4992:5024] = True  # the poisoned blocks of x[100] and x[5000]
    assert bool(torch.isnan(y[bad]).all()) and bool(torch.isfinite(y[~bad]).all())
    h, ref = a["f16"], a["f16_ref"]
    assert bool(torch.isinf(ref[10])) and torch.equal(h[10:12], ref[10:12])  # ±inf, as dist.all_reduce


def test_metadata_always_still_catches_a_size_change():
    res = check_results(run_ranks(wk.always_checked, 2, timeout_s=30, deadline_s=120))
    for r in res:
        assert r["err"].startswith("MetadataMismatchError"), r["err"]
        assert r["always_checks"] == 2 and r["cached_checks"] == 1


def test_check_metadata_setting_is_validated():
    res = check_results(run_ranks(wk.bad_check_setting, 2, timeout_s=30, deadline_s=60))
    assert all(r.startswith("ValueError") and "'always'" in r for r in res)
