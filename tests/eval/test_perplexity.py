import math

import pytest
import torch

from lowbit.eval.perplexity import perplexity, window_nll
from lowbit.eval.windows import eval_windows


def transformers_ppl(model, windows: torch.Tensor) -> float:
    """The independent reference: transformers' own loss, window by window, then exp of the mean."""
    with torch.inference_mode():
        losses = [float(model(input_ids=w[None], labels=w[None]).loss) for w in windows]
    return math.exp(sum(losses) / len(losses))


def test_matches_transformers_loss_on_text_file(tiny, tokenizer, text_file):
    r = perplexity(tiny, tokenizer, text_file, seqlen=64, progress=False)
    ref = transformers_ppl(tiny, eval_windows(tokenizer, text_file, 64))
    assert r.n_windows >= 3 and r.n_tokens == r.n_windows * 63
    assert r.ppl == pytest.approx(ref, rel=1e-5)
    assert r.nll == pytest.approx(math.log(r.ppl))


def test_matches_transformers_loss_on_wikitext_slice(tiny, tokenizer):
    r = perplexity(tiny, tokenizer, "wikitext2", seqlen=128, max_windows=3, progress=False)
    assert r.n_windows == 3 and r.dataset == "wikitext2" and r.seqlen == 128
    assert r.ppl == pytest.approx(transformers_ppl(tiny, eval_windows(tokenizer, "wikitext2", 128, 3)), rel=1e-5)


def test_batch_size_does_not_change_result(tiny, tokenizer, text_file):
    a = perplexity(tiny, tokenizer, text_file, seqlen=32, batch_size=1, progress=False)
    b = perplexity(tiny, tokenizer, text_file, seqlen=32, batch_size=3, progress=False)
    assert a.n_tokens == b.n_tokens
    assert b.ppl == pytest.approx(a.ppl, rel=1e-6)


def test_window_nll_matches_log_softmax(tiny, tokenizer, text_file):
    w = eval_windows(tokenizer, text_file, 48, 2)
    with torch.inference_mode():
        logp = torch.log_softmax(tiny(input_ids=w).logits.double(), dim=-1)
        ref = -logp[:, :-1].gather(2, w[:, 1:, None]).squeeze(2)
        got = window_nll(tiny, w)
    assert torch.allclose(got.double(), ref, atol=2e-5)


def test_window_longer_than_context_is_a_clear_error(make_model, tokenizer, text_file):
    small = make_model(ctx=32)
    with pytest.raises(ValueError, match="longer than the model's context"):
        perplexity(small, tokenizer, text_file, seqlen=64, progress=False)


def test_tokenizer_model_vocab_mismatch(make_model, tokenizer, text_file):
    small_vocab = make_model(vocab=100)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        perplexity(small_vocab, tokenizer, text_file, seqlen=32, progress=False)


@pytest.mark.parametrize("kw, msg", [({"seqlen": 1}, "at least 2"), ({"max_windows": 0}, "positive"), ({"batch_size": 0}, "positive"), ({"seqlen": 100000}, "fewer than one window")])
def test_bad_arguments(tiny, tokenizer, text_file, kw, msg):
    args = {"seqlen": 32, **kw}
    with pytest.raises(ValueError, match=msg):
        perplexity(tiny, tokenizer, text_file, progress=False, **args)


def test_unknown_dataset_and_missing_file(tiny, tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="unknown evaluation dataset"):
        perplexity(tiny, tokenizer, "wikitext103", seqlen=32, progress=False)
    with pytest.raises(FileNotFoundError):
        perplexity(tiny, tokenizer, str(tmp_path / "nope.txt"), seqlen=32, progress=False)


def test_nan_model_raises(make_model, tokenizer, text_file):
    broken = make_model()
    with torch.no_grad():
        broken.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="non-finite"):
        perplexity(broken, tokenizer, text_file, seqlen=32, max_windows=1, progress=False)


@pytest.mark.model
def test_real_model_against_transformers_and_float64():
    """The default model on two 512-token WikiText-2 windows.

    Against a float64 cross-entropy of the same logits we agree to 1e-6. transformers' own loss
    (fp32 log_softmax over 49152 logits) is itself off from float64 by ~1.6e-5 in NLL on this
    model, so the comparison with it uses 5e-5 (the 1e-5 check runs on the tiny models above).
    """
    from lowbit.checkpoint import load_model

    model, tok = load_model("default")
    r = perplexity(model, tok, "wikitext2", seqlen=512, max_windows=2, progress=False)
    w = eval_windows(tok, "wikitext2", 512, 2)
    with torch.inference_mode():
        nll64 = [float(torch.nn.functional.cross_entropy(model(input_ids=x[None]).logits[0, :-1].double(), x[1:])) for x in w]
    assert r.nll == pytest.approx(sum(nll64) / 2, rel=1e-6)
    assert r.ppl == pytest.approx(transformers_ppl(model, w), rel=5e-5)
    assert 15 < r.ppl < 60  # SmolLM2-135M on WikiText-2 is about 31 at this length
