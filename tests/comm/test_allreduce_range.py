"""QuickAllReduce at the edges of every dtype's range (fp32 1e6 / 3e38 / FLT_MAX, bf16's max,
fp16 65504 with a true sum of 65503): finite, bit-identical on every rank in both codec paths,
equal to the one-process replay and within the two-stage bound."""

import torch
import qr_workers as wk

from lowbit.comm.accuracy import error_bound, exact_sum, simulate
from lowbit.comm.codecs import CODECS
from lowbit.parallel.launch import check_results, run_ranks

CASES = [(c, d, 4096 + 77, 50 + i, nat) for i, c in enumerate(CODECS) for d in ("float32", "bfloat16", "float16")
         for nat in (True, False)]


def test_range_edges_reduce_finite_identical_and_within_bound():
    res = check_results(run_ranks(wk.range_cases, 2, CASES, timeout_s=30, deadline_s=120))
    for i, (codec, dtype, n, seed, nat) in enumerate(CASES):
        outs = [r[i] for r in res]
        assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8)), (codec, dtype, nat)
        assert bool(torch.isfinite(outs[0]).all()), (codec, dtype, nat, outs[0][~torch.isfinite(outs[0])])
        inputs = [wk.range_input(r, n, dtype, seed) for r in range(2)]
        assert torch.equal(outs[0].view(torch.uint8), simulate(inputs, codec).view(torch.uint8)), (codec, dtype, nat)
        err = (outs[0].double() - exact_sum(inputs)).abs()
        assert bool((err <= error_bound(inputs, codec)).all()), (codec, dtype, nat)
