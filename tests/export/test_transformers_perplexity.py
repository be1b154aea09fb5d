"""The default model's W8A8 export, quantized on compressed-tensors' activation grid, read by
transformers: its WikiText-2 perplexity equals lowbit's own evaluation of the checkpoint (the
reference forward) to 0.1 % (measured: to every digit). On lowbit's own grid it does not need to:
the readers quantize activations on theirs (README, export section)."""


import pytest
import torch

pytest.importorskip("compressed_tensors", reason="needs the export extra (compressed-tensors==0.17.0)")

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_transformers_perplexity_equals_lowbits_on_the_formats_grid(tmp_path):
    from transformers import AutoModelForCausalLM

    from lowbit.checkpoint import load_model
    from lowbit.data import calibration_ids
    from lowbit.eval.perplexity import window_perplexity
    from lowbit.eval.windows import eval_windows
    from lowbit.export import export_compressed_tensors
    from lowbit.quantize import get_scheme, quantize_model
    from lowbit.quantize.overrides import apply_overrides

    model, tok = load_model("default", dtype=torch.float32)
    scheme = apply_overrides(get_scheme("w8a8"), ["activations.scale_rule=compressed-tensors"])
    quantize_model(model, scheme, calibration_ids(tok, 2, 128), progress=False)
    folder = export_compressed_tensors(model, tmp_path / "ct", tok)
    windows = eval_windows(tok, "wikitext2", 256, 2)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        hf(windows[:1, :8])  # transformers decompresses the weights in its first whole forward
    ours, theirs = (window_perplexity(m.eval(), windows) for m in (model, hf))
    assert abs(theirs / ours - 1) <= 1e-3, (ours, theirs)
