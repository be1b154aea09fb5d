"""``lowbit export``: the output folder is checked before any work (one error line, nothing
overwritten), then a compressed-tensors folder is written."""

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="needs the export extra (compressed-tensors==0.17.0)")

from lowbit.cli import main  # noqa: E402
from lowbit.checkpoint import save_quantized  # noqa: E402
from lowbit.quantize import get_scheme, quantize_model  # noqa: E402
from tests.tiny_models import tiny_model  # noqa: E402


def test_cli_checks_the_output_before_work_and_exports(tmp_path, capsys):
    model = tiny_model("llama")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    quantize_model(model, get_scheme("w8a8"), ids, progress=False)
    save_quantized(model, tmp_path / "ckpt")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err  # one line through lowbit's error path
    assert err.startswith("lowbit: error: ") and "refusing to overwrite" in err and err.count("\n") == 1
    assert main(["export", str(tmp_path / "ckpt"), "--format", "compressed-tensors", "--out", str(tmp_path / "ct")]) == 0
    assert {p.name for p in (tmp_path / "ct").iterdir()} == {"config.json", "model.safetensors"}
    out = " ".join(capsys.readouterr().out.split())  # the activation grid the readers will not share is said
    assert "activations were quantized on lowbit's grid" in out and "activations.scale_rule=compressed-tensors" in out
    assert (tmp_path / "taken" / "x").read_text() == "mine"
