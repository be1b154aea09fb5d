import json
import os

import pytest
import torch

from lowbit.checkpoint import CONFIG_NAME, FORMAT_VERSION, WEIGHTS_NAME, load_quantized, save_quantized
from lowbit.errors import CheckpointError
from lowbit.io.outputs import OutputPathError
from lowbit.checkpoint import load_model
from tests.tiny_models import tiny_model
from lowbit.quantize import get_scheme, quantize_model
from tests.checkpoint.checkpoints import IDS, save_tiny

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_tiny(tmp_path_factory, "w4a4-kv4", "ckpt")


@pytest.mark.parametrize("arch,scheme", [("llama", "w4a4-kv4"), ("mixtral", "w4a4"), ("gemma", "w8a8")])
def test_save_load_reproduces_logits_bit_for_bit(tmp_path, arch, scheme):
    model = tiny_model(arch)
    quantize_model(model, get_scheme(scheme), IDS, progress=False)
    save_quantized(model, tmp_path / "q")
    again, tok = load_model(str(tmp_path / "q"), kernel="reference")  # the round trip itself; kernels: tests/accelerate
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, again(IDS).logits)
    assert again.lowbit_scheme == get_scheme(scheme) and tok is None
    meta = json.loads((tmp_path / "q" / CONFIG_NAME).read_text())
    assert meta["format_version"] == FORMAT_VERSION and meta["layout"]["quant_linears"]
    assert [p.name for p in tmp_path.iterdir()] == ["q"]  # no temporary folders left behind


def test_overwrite_existing_checkpoint_and_refuse_foreign_dir(saved, tmp_path):
    out, logits = saved
    model, _ = load_quantized(out)
    save_quantized(model, out)  # replacing a lowbit checkpoint is fine
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="not a lowbit checkpoint"):
        save_quantized(model, tmp_path / "other")
    with pytest.raises(ValueError, match="no lowbit scheme"):
        save_quantized(tiny_model("llama"), tmp_path / "x")


def _copy(src, dst):
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_truncated_corrupt_missing_and_unknown_version(saved, tmp_path):
    out, _ = saved
    d = _copy(out, tmp_path / "trunc")
    data = (d / WEIGHTS_NAME).read_bytes()
    (d / WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_quantized(d)
    d = _copy(out, tmp_path / "flip")
    b = bytearray(data)
    b[-10] ^= 0xFF
    (d / WEIGHTS_NAME).write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_quantized(d)
    d = _copy(out, tmp_path / "nohash")  # a file too short for its own header is refused, whatever was recorded
    meta = json.loads((d / CONFIG_NAME).read_text())
    meta["weights"] = {"file": WEIGHTS_NAME}
    (d / CONFIG_NAME).write_text(json.dumps(meta))
    (d / WEIGHTS_NAME).write_bytes(data[:100])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_quantized(d)
    d = _copy(out, tmp_path / "missing")
    os.remove(d / WEIGHTS_NAME)
    with pytest.raises(CheckpointError, match="missing"):
        load_quantized(d)
    d = _copy(out, tmp_path / "version")
    meta = json.loads((d / CONFIG_NAME).read_text())
    meta["format_version"] = 99
    (d / CONFIG_NAME).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="format_version 99"):
        load_quantized(d)
    d = _copy(out, tmp_path / "json")
    (d / CONFIG_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_quantized(d)
    with pytest.raises(CheckpointError, match="missing"):
        load_quantized(tmp_path / "nowhere")
