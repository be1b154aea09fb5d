"""The one checkpoint opener and the meta-device loader: no float model is built first, only the
recorded tensors file is read, and a file that cannot serve a read is a clear CheckpointError."""

import json
import shutil

import pytest
import torch

from lowbit.checkpoint import CONFIG_NAME, WEIGHTS_NAME, load_quantized, open_folder
from lowbit.errors import CheckpointError
from tests.checkpoint.checkpoints import IDS, save_tiny


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_tiny(tmp_path_factory, "w4a4", "opener")


def test_the_model_is_built_on_the_meta_device_only(saved, monkeypatch):
    import transformers

    devices = []
    real = transformers.AutoModelForCausalLM.from_config

    def spy(*a, **k):
        m = real(*a, **k)
        devices.extend({p.device.type for p in m.parameters()})
        return m

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", spy)
    model, _ = load_quantized(saved[0])
    assert devices and set(devices) == {"meta"}
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, saved[1])


def test_the_opener_verifies_and_reads_lazily(saved):
    ck = open_folder(saved[0])
    assert ck.scheme.name == "w4a4" and ck.config.model_type == "llama"
    assert "model.layers.0.mlp.up_proj.qweight" in ck.tensors and ck.layout["quant_linears"]
    assert ck.tensors.full("model.layers.0.mlp.up_proj.qweight").dtype == torch.uint8


def test_a_stray_tensors_file_beside_the_checkpoint_is_not_read(saved, tmp_path):
    from safetensors.torch import save_file

    d = tmp_path / "stray"
    shutil.copytree(saved[0], d)
    save_file({"model.layers.0.mlp.up_proj.qweight": torch.zeros(1, dtype=torch.uint8)}, str(d / "other.safetensors"))
    model, _ = load_quantized(d)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, saved[1])


def test_a_trusted_truncated_file_fails_with_a_clear_message(saved, tmp_path):
    d = tmp_path / "trunc"
    shutil.copytree(saved[0], d)
    data = (d / WEIGHTS_NAME).read_bytes()
    (d / WEIGHTS_NAME).write_bytes(data[: len(data) - 64])  # the header still reads; the last tensor does not
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_quantized(d, trust_edits=True)


def test_a_missing_base_config_is_named(saved, tmp_path):
    d = tmp_path / "noconfig"
    shutil.copytree(saved[0], d)
    (d / "config.json").unlink()
    meta = json.loads((d / CONFIG_NAME).read_text())
    assert meta["files"]  # the lowbit config itself is intact: only the base config is gone
    with pytest.raises(CheckpointError, match="config.json"):
        load_quantized(d)


def _retype(d, name, dtype):
    """Rewrite the header's dtype of tensor ``name`` (same byte size): what a hand edit could do."""
    import struct

    f = d / WEIGHTS_NAME
    b = f.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    header[name]["dtype"] = dtype
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    f.write_bytes(struct.pack("<Q", len(h)) + h + b[8 + n:])


@pytest.mark.parametrize("name,dtype", [("model.layers.0.self_attn.q_proj.wscale", "BF16"),
                                        ("model.layers.0.self_attn.q_proj.qweight", "I8"),
                                        ("model.layers.0.input_layernorm.perm", "F64")])
def test_trusted_edits_never_cast_a_tensor_to_its_layouts_dtype(saved, tmp_path, name, dtype):
    """Trusting edits waives the hashes, not the structure: a cast would load another model."""
    d = tmp_path / "retyped"
    shutil.copytree(saved[0], d)
    _retype(d, name, dtype)
    with pytest.raises(CheckpointError, match=f"{name} is stored as torch.*its layout needs"):
        load_quantized(d, trust_edits=True)


def test_half_precision_float_parts_load_into_float32(tmp_path):
    """A model quantized in bfloat16 saves its embeddings and norms so; they widen exactly."""
    from lowbit.checkpoint import save_quantized
    from lowbit.quantize import get_scheme, quantize_model
    from tests.tiny_models import tiny_model

    model = tiny_model("llama").to(torch.bfloat16)
    quantize_model(model, get_scheme("w4a16"), IDS, progress=False)
    save_quantized(model, tmp_path / "q")
    again, _ = load_quantized(tmp_path / "q")
    assert again.model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight.float())
