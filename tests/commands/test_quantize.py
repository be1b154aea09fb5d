"""``lowbit quantize`` end to end on a tiny random model that uses the default tokenizer."""

import json

import pytest
import torch

from lowbit.cli import main
from lowbit.checkpoint import load_model
from lowbit.models import load_tokenizer
from tests.tiny_models import tiny_model


def _tiny_folder(tmp_path):
    """A tiny random Llama saved with the default model's tokenizer (so calibration text works)."""
    tok = load_tokenizer("default")
    src = tmp_path / "tiny"
    tiny_model("llama", vocab_size=len(tok)).save_pretrained(src)
    tok.save_pretrained(src)
    return src


@pytest.mark.model
def test_cli_quantizes_saves_and_reloads(tmp_path):
    src, out, log = _tiny_folder(tmp_path), tmp_path / "q", tmp_path / "r.jsonl"
    rc = main(["quantize", str(src), "--scheme", "w4a4-kv4", "--samples", "2", "--seqlen", "16",
               "--eval-windows", "0", "--out", str(out), "--json", str(log)])
    assert rc == 0
    rec = json.loads(log.read_text())
    assert rec["scheme"]["name"] == "w4a4-kv4" and rec["decoder_bytes_quantized"] < rec["decoder_bytes_float"] / 3
    model, tok2 = load_model(str(out))
    assert tok2 is not None and model.lowbit_scheme.kv_cache.bits == 4
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_cli_rejects_bad_override(capsys):
    assert main(["quantize", "default", "--set", "outliers.bogus=1"]) == 2
    assert "unknown field 'bogus'" in capsys.readouterr().err


@pytest.mark.model
def test_cli_quantizes_from_disk_for_two_ranks(tmp_path):
    src, out, log = _tiny_folder(tmp_path), tmp_path / "q", tmp_path / "r.jsonl"
    rc = main(["quantize", str(src), "--scheme", "w4a4", "--tp", "2", "--from-disk", "--samples", "2", "--seqlen", "16",
               "--eval-windows", "0", "--out", str(out), "--json", str(log)])
    assert rc == 0
    rec = json.loads(log.read_text())
    assert rec["scheme"]["name"] == "w4a4-tp2" and rec["scheme"]["tensor_parallel"]["world"] == 2
    layout = json.loads((out / "lowbit_config.json").read_text())["layout"]
    assert "model.layers.0.self_attn.o_proj" in layout["row_sharded"]
    assert main(["quantize", str(src), "--tp", "0"]) == 2
