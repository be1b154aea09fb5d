import pytest
import torch

from lowbit.eval.kl import ReferenceTopK, kl_coarsened, kl_divergence, kl_exact, reference_topk
from lowbit.eval.windows import eval_windows


def reference_kl(ref, model, windows):
    """Straightforward full-logit computation with torch's own kl_div, in float64."""
    with torch.inference_mode():
        p = torch.log_softmax(ref(input_ids=windows).logits[:, :-1].double(), -1)
        q = torch.log_softmax(model(input_ids=windows).logits[:, :-1].double(), -1)
    kl = torch.nn.functional.kl_div(q, p, log_target=True, reduction="none").sum(-1)
    agree = (p.argmax(-1) == q.argmax(-1)).double().mean()
    return kl.flatten(), float(agree)


def test_same_model_has_zero_kl(tiny, tokenizer, text_file):
    r = kl_divergence(tiny, tiny, tokenizer, text_file, seqlen=32, progress=False)
    assert r.mean_kl == pytest.approx(0.0, abs=1e-6) and r.top1_agreement == 1.0 and r.ppl == pytest.approx(r.ref_ppl)


def test_matches_straightforward_computation(tiny, tiny_other, tokenizer, text_file):
    r = kl_divergence(tiny, tiny_other, tokenizer, text_file, seqlen=40, max_windows=3, batch_size=2, progress=False)
    kl, agree = reference_kl(tiny, tiny_other, eval_windows(tokenizer, text_file, 40, 3))
    assert r.n_tokens == kl.numel() == 3 * 39 and r.method == "exact"
    assert r.mean_kl == pytest.approx(float(kl.mean()), rel=1e-4)
    assert r.median_kl == pytest.approx(float(kl.median()), rel=1e-3)
    assert r.top1_agreement == pytest.approx(agree)
    assert r.mean_kl > 0.01


def test_topk_reference_is_a_lower_bound_and_exact_at_full_vocab(tiny, tiny_other, tokenizer, text_file, tmp_path):
    exact = kl_divergence(tiny, tiny_other, tokenizer, text_file, seqlen=24, max_windows=2, progress=False)
    small = reference_topk(tiny, tokenizer, text_file, seqlen=24, max_windows=2, k=8, progress=False)
    path = tmp_path / "ref.safetensors"
    small.save(path)
    loaded = ReferenceTopK.load(path)
    assert torch.equal(loaded.idx, small.idx) and loaded.vocab == 49152 and loaded.k == 8
    approx = kl_divergence(loaded, tiny_other, tokenizer, text_file, seqlen=24, progress=False)
    assert approx.method == "top8" and approx.n_tokens == exact.n_tokens
    assert approx.mean_kl <= exact.mean_kl + 1e-6
    assert approx.top1_agreement == pytest.approx(exact.top1_agreement)
    assert approx.ref_ppl == pytest.approx(exact.ref_ppl, rel=1e-5)
    assert approx.ppl == pytest.approx(exact.ppl, rel=1e-5)


def test_coarsened_equals_exact_when_k_is_the_vocab():
    g = torch.Generator().manual_seed(0)
    p = torch.log_softmax(torch.randn(5, 50, generator=g) * 3, 1)
    q = torch.log_softmax(torch.randn(5, 50, generator=g) * 3, 1)
    vals, idx = p.topk(50, dim=1)
    assert torch.allclose(kl_coarsened(vals, idx, q), kl_exact(p, q), atol=1e-5)
    v4, i4 = p.topk(4, dim=1)
    assert (kl_coarsened(v4, i4, q) <= kl_exact(p, q) + 1e-6).all()


def test_mismatches_are_clear_errors(tiny, make_model, tokenizer, text_file):
    with pytest.raises(ValueError, match="vocabulary sizes differ"):
        kl_divergence(tiny, make_model(vocab=50000), tokenizer, text_file, seqlen=32, progress=False)
    ref = reference_topk(tiny, tokenizer, text_file, seqlen=24, max_windows=1, k=4, progress=False)
    with pytest.raises(ValueError, match="reference was computed on"):
        kl_divergence(ref, tiny, tokenizer, text_file, seqlen=32, progress=False)
    with pytest.raises(FileNotFoundError):
        ReferenceTopK.load(str(text_file) + ".missing")
