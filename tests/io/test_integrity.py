"""A lowbit checkpoint is known by its own marker, and an edit of its config or of its tensors is
caught on load: never a plain transformers model with random weights, never a silent mismatch."""

import json
import shutil

import pytest
import torch

from lowbit.checkpoint import CONFIG_NAME, WEIGHTS_NAME, is_quantized_dir, load_quantized
from lowbit.errors import CheckpointError
from lowbit.checkpoint import load_model
from tests.tiny_models import tiny_model
from tests.checkpoint.checkpoints import IDS, save_tiny

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_tiny(tmp_path_factory, "w4a4", "integrity")


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_config(d, fn):
    meta = json.loads((d / CONFIG_NAME).read_text())
    fn(meta)
    (d / CONFIG_NAME).write_text(json.dumps(meta))


def test_folder_without_lowbit_config_is_an_error_not_a_random_llama(saved, tmp_path):
    d = _copy(saved[0], tmp_path / "noconfig")
    (d / CONFIG_NAME).unlink()
    assert is_quantized_dir(d)  # the marker in the tensors file still says lowbit
    with pytest.raises(CheckpointError, match="incomplete lowbit checkpoint"):
        load_model(str(d))


def test_temporary_folder_of_a_killed_save_never_loads(saved, tmp_path):
    d = _copy(saved[0], tmp_path / ".tmp-lowbit-12345-abc")
    with pytest.raises(CheckpointError, match="unfinished lowbit save"):
        load_model(str(d))


def test_plain_checkpoint_with_missing_weights_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_model("llama").save_pretrained(tmp_path / "hf")
    f = tmp_path / "hf" / "model.safetensors"
    state = load_file(str(f))
    state.pop("model.layers.1.mlp.up_proj.weight")
    save_file(state, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="randomly initialised"):
        load_model(str(tmp_path / "hf"))


@pytest.mark.parametrize("edit", [
    lambda m: m["scheme"]["kv_cache"].update(bits=8),
    lambda m: m["scheme"].update(name="renamed"),
    lambda m: m["layout"]["quant_linears"]["model.layers.0.mlp.up_proj"].update(w_group=64),
    lambda m: m["extra"].update(note="x"),
])
def test_edited_config_is_detected(saved, tmp_path, edit):
    d = _copy(saved[0], tmp_path / "edited")
    _edit_config(d, edit)
    with pytest.raises(CheckpointError, match="edited after saving"):
        load_quantized(d)


def test_removed_hash_and_flipped_bytes_are_refused(saved, tmp_path):
    d = _copy(saved[0], tmp_path / "nohash")
    _edit_config(d, lambda m: m["weights"].pop("sha256"))
    data = bytearray((d / WEIGHTS_NAME).read_bytes())
    data[-10] ^= 0xFF
    (d / WEIGHTS_NAME).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="recorded hash of the tensors is missing"):
        load_quantized(d)


def test_trusted_edit_loads_and_the_env_var_is_the_same_switch(saved, tmp_path, monkeypatch):
    out, logits = saved
    d = _copy(out, tmp_path / "trusted")
    _edit_config(d, lambda m: m["scheme"].update(name="my-name"))
    model, _ = load_quantized(d, trust_edits=True)
    assert model.lowbit_scheme.name == "my-name"
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, logits)
    monkeypatch.setenv("LOWBIT_TRUST_EDITED_CHECKPOINT", "1")
    assert load_quantized(d)[0].lowbit_scheme.name == "my-name"
    with pytest.raises(CheckpointError, match="edited"):
        load_quantized(d, trust_edits=False)  # the argument wins over the environment


def test_scheme_must_match_the_stored_layout_even_when_trusted(saved, tmp_path):
    d = _copy(saved[0], tmp_path / "bits")
    _edit_config(d, lambda m: m["scheme"]["weights"].update(bits=8))
    with pytest.raises(CheckpointError, match="stored as"):
        load_quantized(d, trust_edits=True)
    d = _copy(saved[0], tmp_path / "key")
    _edit_config(d, lambda m: m["layout"].update(bogus=[]))
    with pytest.raises(CheckpointError, match="unknown layout key"):
        load_quantized(d, trust_edits=True)
    d = _copy(saved[0], tmp_path / "name")
    _edit_config(d, lambda m: m["layout"]["quant_linears"].update(
        {"model.layers.7.mlp.up_proj": m["layout"]["quant_linears"]["model.layers.0.mlp.up_proj"]}))
    with pytest.raises(CheckpointError, match="does not fit the model"):
        load_quantized(d, trust_edits=True)


def test_format_1_checkpoint_needs_trust(saved, tmp_path):
    d = _copy(saved[0], tmp_path / "v1")
    _edit_config(d, lambda m: m.update(format_version=1))
    with pytest.raises(CheckpointError, match="format 1 records no hash"):
        load_quantized(d)
    assert load_quantized(d, trust_edits=True)[0].lowbit_scheme.name == "w4a4"


class _Tokenizer:
    """Stands in for a tokenizer: save_pretrained writes one file beside the tensors."""

    def save_pretrained(self, folder):
        (folder / "special_tokens_map.json").write_text('{"bos_token": "<s>"}')


def test_edited_base_config_or_tokenizer_is_detected(tmp_path):
    from lowbit.checkpoint import save_quantized
    from lowbit.quantize import get_scheme, quantize_model

    model = tiny_model("llama")
    quantize_model(model, get_scheme("w4a16"), IDS, progress=False)
    save_quantized(model, tmp_path / "q", tokenizer=_Tokenizer())
    with torch.no_grad():
        logits = model(IDS).logits
    meta = json.loads((tmp_path / "q" / CONFIG_NAME).read_text())
    assert set(meta["file_sha256"]) == {"config.json", "special_tokens_map.json"}
    edits = {"config.json": lambda c: c.update(rms_norm_eps=0.5),  # loaded silently with other logits before
             "special_tokens_map.json": lambda c: c.update(bos_token="<x>")}
    for name, edit in edits.items():
        d = _copy(tmp_path / "q", tmp_path / f"edit-{name}")
        c = json.loads((d / name).read_text())
        edit(c)
        (d / name).write_text(json.dumps(c))
        with pytest.raises(CheckpointError, match=f"{name} was edited after saving"):
            load_quantized(d)
        load_quantized(d, trust_edits=True)  # trusting edits waives these hashes as the others
    d = _copy(tmp_path / "q", tmp_path / "gone")
    (d / "special_tokens_map.json").unlink()
    with pytest.raises(CheckpointError, match="special_tokens_map.json is missing"):
        load_quantized(d)
    d = _copy(tmp_path / "q", tmp_path / "hashes")  # the hashes are under the header's hash of the config
    _edit_config(d, lambda m: m["file_sha256"].update({"config.json": "0" * 64}))
    with pytest.raises(CheckpointError, match="edited after saving"):
        load_quantized(d)
    model, _ = load_quantized(tmp_path / "q")
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, logits)


def test_checkpoint_of_the_previous_version_without_file_hashes_loads(saved, tmp_path):
    """Saved before the file hashes existed: nothing recorded, nothing to verify; the rest is."""
    from safetensors.torch import load_file, save_file

    from lowbit.io.integrity import CONFIG_HASH_KEY, config_digest, sha256_file

    d = _copy(saved[0], tmp_path / "previous")
    meta = json.loads((d / CONFIG_NAME).read_text())
    del meta["file_sha256"]
    f = d / WEIGHTS_NAME
    save_file(load_file(str(f)), str(f), metadata={"format": "lowbit", "format_version": "2",
                                                   CONFIG_HASH_KEY: config_digest(meta)})
    meta["weights"].update(bytes=f.stat().st_size, sha256=sha256_file(f))
    (d / CONFIG_NAME).write_text(json.dumps(meta))
    model, _ = load_quantized(d)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, saved[1])
    b = bytearray(f.read_bytes())
    b[-10] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_quantized(d)


@pytest.mark.parametrize("name", [5, None, "", "..", "../other/model.safetensors", "/abs/model.safetensors"])
def test_weights_file_must_be_a_plain_name_even_when_trusted(saved, tmp_path, name):
    d = _copy(saved[0], tmp_path / "wfile")
    _edit_config(d, lambda m: m["weights"].update(file=name))
    for trust in (None, True):
        with pytest.raises(CheckpointError, match="weights.file must be a file name"):
            load_quantized(d, trust_edits=trust)
