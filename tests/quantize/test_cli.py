"""``lowbit quantize`` end to end on a tiny random model that uses the default tokenizer."""

import json

import pytest
import torch

from lowbit.cli import main
from lowbit.models import load_model, load_tokenizer
from lowbit.models.tiny import tiny_model


@pytest.mark.model
def test_cli_quantizes_saves_and_reloads(tmp_path):
    tok = load_tokenizer("default")
    src = tmp_path / "tiny"
    tiny_model("llama", vocab_size=len(tok)).save_pretrained(src)
    tok.save_pretrained(src)
    out, log = tmp_path / "q", tmp_path / "r.jsonl"
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
    from lowbit.quantize import SchemeError

    with pytest.raises(SchemeError):
        main(["quantize", "default", "--set", "outliers.bogus=1"])
