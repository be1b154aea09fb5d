"""The real default model (SmolLM2-135M: 9 heads, 3 KV heads) split over 2 ranks with plain
all-reduce: perplexity equals the single-process one (relative difference < 1e-4, fp32)."""

import pytest


@pytest.mark.model
def test_default_model_tp2_matches_single_process():
    from lowbit.eval.tp import run_tp_eval

    res = run_tp_eval("kl", "default", 2, "plain", seqlen=128, max_windows=2, deadline_s=600)
    assert res["n_windows"] == 2 and res["tp"] == 2
    assert abs(res["ppl"] - res["ref_ppl"]) / res["ref_ppl"] < 1e-4
    assert res["mean_kl"] < 1e-6 and res["top1_agreement"] > 0.999
