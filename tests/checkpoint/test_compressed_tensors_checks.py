"""A compressed-tensors folder whose config and tensors contradict each other is refused by name,
never read as another model: each quantized layer's tensors must have the exact dtypes and shapes
its config (bits, group, symmetry, weight_shape) and its module (bias) give, nothing left over;
only the files the model names are read (lowbit's own exporter makes the folders)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lowbit.checkpoint.compressed_tensors import load_compressed_tensors
from lowbit.errors import CheckpointError
from lowbit.export import export_compressed_tensors
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.overrides import apply_overrides
from tests.checkpoint.checkpoints import IDS
from tests.tiny_models import tiny_model

CASES = {"asym": ("llama", "w4a16", ["weights.group_size=32", "weights.symmetric=false", "lm_head.bits=16"]),
         "w8a8-asym": ("llama", "w8a8", ["weights.symmetric=false"]),
         "qwen2": ("qwen2", "w4a16", ["weights.group_size=32", "lm_head.bits=16"])}
Q = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    out = {}
    for key, (arch, preset, sets) in CASES.items():
        model = tiny_model(arch)
        quantize_model(model, apply_overrides(get_scheme(preset), sets), IDS, progress=False)
        folder = tmp_path_factory.mktemp(key) / "ct"
        export_compressed_tensors(model, folder)
        out[key] = folder, _logits(folder)
    return out


def _logits(folder):
    model, _ = load_compressed_tensors(folder)
    with torch.no_grad():
        return model(IDS).logits


def _copy(exports, key, tmp_path):
    return shutil.copytree(exports[key][0], tmp_path / key)


def _edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg["quantization_config"]["config_groups"]["group_0"]["weights"])
    (d / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(d, fn):
    f = d / "model.safetensors"
    state = load_file(str(f))
    fn(state)
    save_file(state, str(f), metadata={"format": "pt"})


@pytest.mark.parametrize("key,edit,match", [
    ("asym", lambda w: w.update(symmetric=True), "symmetric weights, but weight_zero_point holds nonzero"),
    ("w8a8-asym", lambda w: w.update(symmetric=True), "symmetric weights, but weight_zero_point holds nonzero"),
    ("asym", lambda w: w.update(num_bits=2), r"weight_packed is torch.int32 \[64, 8\].*INT2.*\[64, 4\]"),
    ("asym", lambda w: w.update(group_size=64), r"weight_scale is torch.float32 \[64, 2\].*\[64, 1\]"),
    ("asym", lambda w: w.update(symmetric="false"), "weights.symmetric='false'"),
])
def test_a_config_that_contradicts_its_tensors_is_refused(exports, tmp_path, key, edit, match):
    d = _copy(exports, key, tmp_path)
    _edit_config(d, edit)
    with pytest.raises(CheckpointError, match=match):
        load_compressed_tensors(d)


@pytest.mark.parametrize("key,edit,match", [
    ("asym", lambda s: s.update({f"{Q}.weight_packed": s[f"{Q}.weight_packed"].float()}), "weight_packed is torch.float32"),
    ("w8a8-asym", lambda s: s.update({f"{Q}.weight": s[f"{Q}.weight"].float() * 1.5}), "weight is torch.float32"),
    ("w8a8-asym", lambda s: s.update({f"{Q}.weight": s[f"{Q}.weight"][:, :32].contiguous()}),
     r"weight is torch.int8 \[64, 32\]"),
    ("asym", lambda s: s.update({f"{Q}.weight_zero_point": s[f"{Q}.weight_zero_point"][:4].contiguous()}),
     r"weight_zero_point is torch.int32 \[4, 2\]"),
    ("asym", lambda s: s.update({f"{Q}.weight_shape": torch.tensor([1, 1])}), r"weight_shape is \[1, 1\]"),
    ("asym", lambda s: s.update({f"{Q}.foo": torch.zeros(3)}), r"\['foo'\] are not part of"),
    ("asym", lambda s: s.pop(f"{Q}.weight_zero_point"), r"\['weight_zero_point'\] missing"),
    ("qwen2", lambda s: s.pop(f"{Q}.bias"), r"\['bias'\] missing"),
    ("asym", lambda s: s.update({f"{Q}.bias": torch.zeros(64)}), r"\['bias'\] are not part of .* without a bias"),
])
def test_tensors_that_do_not_fit_their_layer_are_refused(exports, tmp_path, key, edit, match):
    d = _copy(exports, key, tmp_path)
    _edit_tensors(d, edit)
    with pytest.raises(CheckpointError, match=f"{Q}: .*{match}"):
        load_compressed_tensors(d)


def test_zero_points_of_a_symmetric_layer_are_accepted_only_when_zero(exports, tmp_path):
    """Some writers store symmetric weights' zero points (all zero): they change nothing."""
    d = _copy(exports, "qwen2", tmp_path)
    _edit_tensors(d, lambda s: s.update({f"{Q}.weight_zero_point": torch.full((8, 2), 0x88888888 - 2 ** 32,
                                                                                 dtype=torch.int32)}))
    assert torch.equal(_logits(d), exports["qwen2"][1])


def test_only_the_files_the_model_names_are_read(exports, tmp_path):
    d = _copy(exports, "asym", tmp_path)
    state = load_file(str(d / "model.safetensors"))
    save_file({"model.embed_tokens.weight": state["model.embed_tokens.weight"] * 0}, str(d / "model_backup.safetensors"))
    assert torch.equal(_logits(d), exports["asym"][1])  # a stray backup no longer replaces a tensor
    # a sharded folder: its index names the shards; a tensor in two shards is refused
    names = sorted(state)
    save_file({k: state[k] for k in names[:5]}, str(d / "a.safetensors"))
    save_file({k: state[k] for k in names[4:]}, str(d / "b.safetensors"))
    (d / "model.safetensors").unlink()
    index = {"weight_map": {k: "a.safetensors" if i < 5 else "b.safetensors" for i, k in enumerate(names)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"tensor {names[4]} is stored twice|{names[4]} is in b.safetensors"):
        load_compressed_tensors(d)
    save_file({k: state[k] for k in names[5:]}, str(d / "b.safetensors"))
    assert torch.equal(_logits(d), exports["asym"][1])


def test_a_truncated_file_is_a_checkpoint_error_naming_it(exports, tmp_path):
    d = _copy(exports, "asym", tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is missing, truncated or corrupt"):
        load_compressed_tensors(d)
