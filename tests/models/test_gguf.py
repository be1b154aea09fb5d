"""``--model path/to/file.gguf``: any GGUF transformers reads, converted once to a float checkpoint
in the cache (keyed by the file), as the default model is."""

import pytest
import torch

from lowbit.models import ModelNotFoundError
from lowbit.checkpoint import load_model
from lowbit.models.loading import default_gguf_path, gguf_cached_dir


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelNotFoundError, match="could not read it as a GGUF model"):
        load_model(str(bad))
    assert not any((tmp_path / "cache").rglob("config.json"))  # nothing half-written left in the cache


@pytest.mark.model
@pytest.mark.slow
def test_a_gguf_path_loads_as_the_default_model_does(tmp_path, monkeypatch):
    try:
        src = default_gguf_path()
    except ModelNotFoundError as e:
        pytest.skip(str(e))
    own = tmp_path / "mine" / "SmolLM2.gguf"
    own.parent.mkdir()
    own.symlink_to(src)  # a user's file at another path: its own cache entry
    ref, tok = load_model("default")
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    model, tok2 = load_model(str(own))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert tok2("hello").input_ids == tok("hello").input_ids
    cached = gguf_cached_dir(own)  # the second call finds the conversion
    assert cached.parent == tmp_path / "cache" / "models" and (cached / "config.json").is_file()
