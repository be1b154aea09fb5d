"""Tiny random Llama models that share the default model's tokenizer (no hub needed)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tokenizer():
    from lowbit.models import ModelNotFoundError, load_tokenizer

    try:
        return load_tokenizer("default")
    except ModelNotFoundError as e:
        pytest.skip(f"default tokenizer unavailable: {e}")


def make_tiny(vocab: int = 49152, ctx: int = 256, seed: int = 0, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ctx, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a larger init spread makes the distributions less flat, so tests see real differences
        model.model.embed_tokens.weight.normal_(0, 1.0)
    return model


@pytest.fixture(scope="session")
def tiny():
    return make_tiny()


@pytest.fixture(scope="session")
def tiny_other():
    return make_tiny(seed=1)


@pytest.fixture()
def text_file(tmp_path):
    """A few hundred tokens of ordinary English in a file, usable as an evaluation dataset."""
    lines = [
        "The quick brown fox jumps over the lazy dog near the river bank.",
        "Quantization maps real numbers to a small set of integers and a scale.",
        "Perplexity is the exponential of the mean negative log-likelihood per token.",
        "A transformer predicts the next token from every token before it.",
    ]
    path = tmp_path / "eval.txt"
    path.write_text("\n\n".join(lines * 6), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def make_model():
    """The factory itself, for tests that need an odd model (small context, small vocab, NaN)."""
    return make_tiny
