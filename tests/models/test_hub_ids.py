"""A Hugging Face id resolves as transformers resolves it: from the local HF cache, offline."""

import pytest

from lowbit.models import ModelNotFoundError
from lowbit.checkpoint import load_model
from tests.tiny_models import tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fake_cache(root, repo_id):
    """The hub cache layout: models--ORG--NAME/{refs/main, snapshots/COMMIT/...}."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / COMMIT
    tiny_model("llama").save_pretrained(snap)
    (snap / "tokenizer_config.json").write_text("{}")  # transformers needs one; no tokenizer is built here
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


def test_cached_id_loads_offline(tmp_path, monkeypatch):
    from lowbit.models.loading import resolve

    snap = _fake_cache(tmp_path / "hub", "tiny-org/tiny-llama")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve("tiny-org/tiny-llama") == str(snap)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub is the default cache
    assert resolve("tiny-org/tiny-llama") == str(snap)


def test_cached_id_loads_as_a_model(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    _fake_cache(tmp_path / "hub", "tiny-org/tiny-llama")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(lambda cls, path, **kw: path))
    model, tok = load_model("tiny-org/tiny-llama")
    assert model.config.num_hidden_layers == 2 and tok.endswith(COMMIT)


def test_unknown_id_offline_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="neither a folder nor a Hugging Face id in the local cache"):
        load_model("no-org/no-model")
    with pytest.raises(ModelNotFoundError, match="no model directory"):
        load_model(str(tmp_path / "a" / "b" / "c"))
