"""The CLI tests' tiny models: Llama models sharing the default model's tokenizer (tests/eval_fixtures.py)."""

from tests.eval_fixtures import make_model, make_tiny, text_file, tiny, tiny_other, tokenizer  # noqa: F401
