"""The A/B scripts' side-by-side decode timing (``lowbit.bench.decode_ab``) on a tiny model."""

import types

import pytest
import torch
from transformers import DynamicCache

from lowbit.bench.decode_ab import decode_rates, greedy
from tests.tiny_models import tiny_model


def _gen(model):
    return greedy(model, types.SimpleNamespace(eos_token_id=0), lambda: DynamicCache(config=model.config))


def test_rates_of_two_equal_variants_and_their_ratios():
    model = tiny_model("llama")
    a, calls = _gen(model), []

    def b(ids, n):
        calls.append(n)
        return a(ids, n)

    ids = torch.randint(1, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    row = decode_rates({"a": a, "b": b}, ids, repeats=3, new=4)
    assert calls == [8] + [2, 6] * 3  # the check of equal tokens, then each repeat's 2 and 2 + new
    assert len(row["raw_tok_s"]["a"]) == 3 and all(r > 0 for r in row["raw_tok_s"]["b"])
    assert row["ratio"] == pytest.approx(row["a_tok_s"] / row["b_tok_s"])
    assert row["a_tok_s"] == sorted(row["raw_tok_s"]["a"])[1]


def test_variants_that_generate_other_tokens_are_not_compared():
    ids = torch.randint(1, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="other tokens"):
        decode_rates({"a": _gen(tiny_model("llama", seed=0)), "b": _gen(tiny_model("llama", seed=1))}, ids, repeats=1)
    with pytest.raises(ValueError, match="two or more"):
        decode_rates({"a": _gen(tiny_model("llama"))}, ids, repeats=1)
