"""``--dtype`` is what runs, and what the JSON records: honoured for a float model, refused (not
silently ignored) for a lowbit checkpoint, which computes in float32."""

import copy
import json

import torch

from lowbit.cli import main
from lowbit.checkpoint import save_quantized
from lowbit.quantize import get_scheme, quantize_model


def test_dtype_runs_and_is_recorded(tmp_path, tiny, tokenizer, capsys):
    folder = tmp_path / "tiny"
    tiny.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    ev = ["--dataset", str(text), "--seqlen", "32", "--max-windows", "2", "--no-progress"]
    assert main(["eval", "ppl", "--model", str(folder), "--dtype", "bfloat16", "--json", str(tmp_path / "bf.json"), *ev]) == 0
    assert json.loads((tmp_path / "bf.json").read_text())["dtype"] == "bfloat16"

    model = copy.deepcopy(tiny)
    quantize_model(model, get_scheme("w4a4-rtn"), torch.randint(0, 1000, (1, 32)), progress=False)
    ckpt = save_quantized(model, tmp_path / "q", tokenizer)
    assert main(["eval", "ppl", "--model", str(ckpt), "--json", str(tmp_path / "q.json"), *ev]) == 0
    assert json.loads((tmp_path / "q.json").read_text())["dtype"] == "float32"
    capsys.readouterr()
    assert main(["eval", "ppl", "--model", str(ckpt), "--dtype", "bfloat16", "--json", str(tmp_path / "q16.json"), *ev]) == 2
    assert "runs in float32" in capsys.readouterr().err and not (tmp_path / "q16.json").exists()
