"""The float reference of ``lowbit quantize``: the float model itself, or a top-k file made once
and reused (the float model is not loaded again); the comparison fields match kl_divergence."""

import pytest

from lowbit.eval.float_comparison import REFERENCE_TOP_K, compare_to_float, float_reference
from lowbit.eval.kl import ReferenceTopK, kl_divergence


def test_reference_is_the_float_model_without_a_path(tiny, tiny_other, tokenizer, text_file):
    window = dict(dataset=text_file, seqlen=24, max_windows=2, progress=False)
    ref = float_reference(None, lambda: tiny, tokenizer, **window)
    assert ref is tiny
    got = compare_to_float(ref, tiny_other, tokenizer, **window)
    r = kl_divergence(tiny, tiny_other, tokenizer, text_file, seqlen=24, max_windows=2, progress=False)
    assert got["kl_method"] == "exact" and got["mean_kl"] == r.mean_kl and got["ratio"] == r.ppl / r.ref_ppl
    assert got["eval_tokens"] == 2 * 23 and got["eval_windows"] == 2 and got["eval_seqlen"] == 24


def test_reference_file_is_made_once_then_reused(tiny, tiny_other, tokenizer, text_file, tmp_path):
    window = dict(dataset=text_file, seqlen=24, max_windows=2, progress=False)
    path = tmp_path / "ref.safetensors"
    loads = []
    made = float_reference(path, lambda: loads.append(1) or tiny, tokenizer, **window)
    assert isinstance(made, ReferenceTopK) and made.k == REFERENCE_TOP_K and path.is_file() and loads == [1]

    def no_float():
        raise AssertionError("the float model was loaded although the reference file exists")

    again = float_reference(path, no_float, tokenizer, **window)
    first, second = (compare_to_float(r, tiny_other, tokenizer, **window) for r in (made, again))
    assert first == second and first["kl_method"] == f"top{REFERENCE_TOP_K}"
    exact = compare_to_float(tiny, tiny_other, tokenizer, **window)
    assert first["mean_kl"] <= exact["mean_kl"] + 1e-6  # the top-k KL is a lower bound
    assert first["ppl"] == pytest.approx(exact["ppl"], rel=1e-5)
