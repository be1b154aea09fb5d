import pytest
import torch

from lowbit.eval.loglik import Request, encode_pair, prefix_token, score_reference, score_requests


def test_encode_pair_splits_like_the_harness(tokenizer):
    r = encode_pair(tokenizer, "The cat sat on the", " mat")
    whole = tokenizer("The cat sat on the mat", add_special_tokens=False).input_ids
    assert r.context + r.continuation == whole
    assert tokenizer.decode(r.continuation) == " mat"
    moved = encode_pair(tokenizer, "The cat sat on the ", "mat")  # trailing space moves to the continuation
    assert moved == r


def test_empty_context_uses_prefix_token(tokenizer):
    r = encode_pair(tokenizer, "", "Hello world")
    assert r.context == [prefix_token(tokenizer)]


def test_tokenizer_without_bos_or_eos_is_a_clear_error():
    class NoSpecial:
        bos_token_id = None
        eos_token_id = None

    with pytest.raises(ValueError, match="neither a BOS nor an EOS"):
        prefix_token(NoSpecial())


def test_empty_continuation_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="empty continuation"):
        encode_pair(tokenizer, "abc", "")


def _requests(tokenizer):
    pairs = [
        ("Question: what is two plus two?\nAnswer:", " four"),
        ("Question: what is two plus two?\nAnswer:", " five hundred and twelve"),
        ("A", " b"),
        ("Passage: a long passage about the weather in spring, summer and winter.\nQuestion: is it cold?\nAnswer:", " yes"),
        ("Passage: a long passage about the weather in spring, summer and winter.\nQuestion: is it cold?\nAnswer:", " no"),
        ("", "Once upon a time"),
    ]
    return [encode_pair(tokenizer, c, x) for c, x in pairs]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_batched_matches_unbatched_reference(tiny, tokenizer, batch_size):
    reqs = _requests(tokenizer)
    got = score_requests(tiny, reqs, batch_size=batch_size, progress=False)
    for r, g in zip(reqs, got):
        ref = score_reference(tiny, r)
        assert g.n_tokens == ref.n_tokens == len(r.continuation)
        assert g.logprob == pytest.approx(ref.logprob, rel=1e-5, abs=1e-4)
        assert g.greedy == ref.greedy


def test_greedy_flag_on_the_model_own_argmax(tiny, tokenizer):
    ctx = tokenizer("The weather today is", add_special_tokens=False).input_ids
    ids = list(ctx)
    with torch.inference_mode():
        for _ in range(3):
            ids.append(int(tiny(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    greedy = Request(list(ctx), ids[len(ctx) :])
    other = Request(list(ctx), ids[len(ctx) :-1] + [(ids[-1] + 1) % 49152])
    a, b = score_requests(tiny, [greedy, other], batch_size=2, progress=False)
    assert a.greedy and not b.greedy
    assert a.logprob > b.logprob


def test_left_truncation_to_context(make_model, tokenizer):
    small = make_model(ctx=16)
    r = Request(list(range(100, 130)), [200, 201])
    (got,) = score_requests(small, [r], progress=False)
    ref = score_reference(small, Request(list(range(115, 130)), [200, 201]))
    assert got.logprob == pytest.approx(ref.logprob, rel=1e-5)


def test_bad_ids_and_too_long_continuation(make_model):
    small = make_model(vocab=100, ctx=8)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        score_requests(small, [Request([1, 2], [500])], progress=False)
    with pytest.raises(ValueError, match="does not fit the model's context"):
        score_requests(small, [Request([1], list(range(3, 20)))], progress=False)
