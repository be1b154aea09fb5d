import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from lowbit.eval.harness import LowbitLM  # noqa: E402
from lowbit.eval.loglik import Request, encode_pair, score_reference  # noqa: E402


def _inst(kind, args, i=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def test_registered_with_the_harness():
    from lm_eval.api.registry import get_model

    assert get_model("lowbit") is LowbitLM


def test_loglikelihood_matches_reference(tiny, tokenizer):
    lm = LowbitLM.from_model(tiny, tokenizer, batch_size=3)
    pairs = [("Question: is water wet?\nAnswer:", " yes"), ("Question: is water wet?\nAnswer:", " no"), ("", "Hello there")]
    got = lm.loglikelihood([_inst("loglikelihood", p, i) for i, p in enumerate(pairs)])
    for (c, x), (lp, greedy) in zip(pairs, got):
        ref = score_reference(tiny, encode_pair(tokenizer, c, x))
        assert lp == pytest.approx(ref.logprob, rel=1e-5) and greedy == ref.greedy


def test_loglikelihood_rolling_predicts_every_token_once(tiny, tokenizer):
    text = "Perplexity is the exponential of the mean negative log-likelihood. " * 4
    ids = tokenizer(text, add_special_tokens=False).input_ids
    eos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        logp = torch.log_softmax(tiny(input_ids=torch.tensor([[eos] + ids[:-1]])).logits[0].double(), -1)
    full = float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())
    (got,) = LowbitLM.from_model(tiny, tokenizer).loglikelihood_rolling([_inst("loglikelihood_rolling", (text,))])
    assert got == pytest.approx(full, rel=1e-5)
    # with a short max_length the text is scored in disjoint windows: each token exactly once
    short = LowbitLM.from_model(tiny, tokenizer, max_length=16)
    (chunked,) = short.loglikelihood_rolling([_inst("loglikelihood_rolling", (text,))])
    # the harness's rule: window k predicts ids[s:e] from the max_length tokens before e (the
    # last window keeps a full context but scores only its new tokens)
    windows = [Request([eos], ids[:16])]
    for s in range(16, len(ids), 16):
        e = min(s + 16, len(ids))
        windows.append(Request(ids[max(0, e - 17) : s], ids[s:e]))
    ref = sum(score_reference(tiny, w).logprob for w in windows)
    assert chunked == pytest.approx(ref, rel=1e-5)


def test_generate_until_is_greedy_and_stops(tiny, tokenizer):
    lm = LowbitLM.from_model(tiny, tokenizer)
    ctx = "The meaning of life is"
    (free,) = lm.generate_until([_inst("generate_until", (ctx, {"until": [], "max_gen_toks": 5}))])
    ids = tokenizer(ctx, add_special_tokens=False).input_ids
    with torch.inference_mode():
        gen = tiny.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = tokenizer.decode(gen[0, len(ids) :], skip_special_tokens=True)
    assert free == expected
    if len(free) > 2:
        stop = free[1:3]
        (cut,) = lm.generate_until([_inst("generate_until", (ctx, {"until": [stop], "max_gen_toks": 5}))])
        assert cut == free.split(stop)[0]


def test_max_length_beyond_context_is_an_error(make_model, tokenizer):
    with pytest.raises(ValueError, match="exceeds the model's context"):
        LowbitLM.from_model(make_model(ctx=32), tokenizer, max_length=64)
