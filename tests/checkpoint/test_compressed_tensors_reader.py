"""compressed-tensors checkpoints made by compressed-tensors' own compressors (as llm-compressor
saves them), loaded by ``load_model`` onto lowbit's QuantLinear and compared with transformers'
reading of the same folder."""

import json

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="needs the export extra (compressed-tensors==0.17.0)")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,  # noqa: E402
                                             QuantizationScheme, apply_quantization_config)
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

from lowbit.errors import CheckpointError  # noqa: E402
from lowbit.checkpoint import load_quantized, save_quantized  # noqa: E402
from lowbit.checkpoint import load_model  # noqa: E402
from tests.tiny_models import tiny_model  # noqa: E402
from lowbit.nn.quant_linear import QuantLinear  # noqa: E402

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))

SCHEMES = {
    "w4a16-asym-g32": dict(weights=QuantizationArgs(num_bits=4, strategy="group", group_size=32, symmetric=False)),
    "w4a16-sym-g32": dict(weights=QuantizationArgs(num_bits=4, strategy="group", group_size=32, symmetric=True)),
    "w4a16-actorder-group": dict(weights=QuantizationArgs(num_bits=4, strategy="group", group_size=32, symmetric=True,
                                                          actorder="group")),
    "w8a8": dict(weights=QuantizationArgs(num_bits=8, strategy="channel", symmetric=True),
                 input_activations=QuantizationArgs(num_bits=8, strategy="token", symmetric=True, dynamic=True)),
}


def ct_checkpoint(out, scheme: dict, ignore=("lm_head",)):
    """What llm-compressor does with a min-max observer: scales from compressed-tensors'
    calculate_qparams, then its ModelCompressor packs and saves (bf16 model)."""
    model = tiny_model("llama").to(torch.bfloat16)
    qc = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], **scheme)}, ignore=list(ignore))
    apply_quantization_config(model, qc)
    for m in model.modules():
        s = getattr(m, "quantization_scheme", None)
        if s is None:
            continue
        w = m.weight.data
        if s.weights.actorder == "group":  # GPTQ act order: groups of columns in some other order
            gen = torch.Generator().manual_seed(w.shape[0])
            g_idx = (torch.arange(w.shape[1]) // s.weights.group_size)[torch.randperm(w.shape[1], generator=gen)]
            m.weight_g_idx.data.copy_(g_idx)
            w = w[:, torch.argsort(g_idx, stable=True)]
        blocks = w.reshape(w.shape[0], -1, s.weights.group_size if s.weights.strategy == "group" else w.shape[1])
        scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), s.weights)
        m.weight_scale.data.copy_(scale.reshape(m.weight_scale.shape))
        if hasattr(m, "weight_zero_point"):
            m.weight_zero_point.data.copy_(zp.reshape(m.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    return out


@pytest.mark.parametrize("key", sorted(SCHEMES))
def test_load_model_runs_a_compressed_tensors_checkpoint_on_quantlinear(tmp_path, key):
    from transformers import AutoModelForCausalLM

    out = ct_checkpoint(tmp_path / key, SCHEMES[key])
    ours, tok = load_model(str(out), kernel="reference")  # the reader itself; the kernels: below
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    mods = {n: m for n, m in ours.named_modules() if isinstance(m, QuantLinear)}
    assert len(mods) == 14 and tok is None  # 2 layers x 7 linears; lm_head stays float
    with torch.no_grad():
        a, b = ours(IDS).logits, theirs(IDS).logits  # transformers decompresses on its first forward
    for name, m in mods.items():
        w = theirs.get_submodule(name).weight
        if m.input_perm is not None:  # lowbit keeps act-order groups contiguous and permutes the input
            assert key == "w4a16-actorder-group"
            w = w[:, m.input_perm]
        assert torch.equal(m.dequantized_weight(), w), name
    if key == "w4a16-actorder-group":
        assert all(m.input_perm is not None for m in mods.values())
        assert torch.allclose(a, b, rtol=0, atol=1e-5)  # the same products, summed in another order
    elif key == "w8a8":
        assert all(m.act_args.bits == 8 and m.act_args.group_size == 0 for m in mods.values())
        # read with the format's own activation grid (absmax / 127.5 per token): transformers' logits
        assert all(m.act_args.scale_rule == "compressed-tensors" for m in mods.values())
        assert torch.equal(a, b)
    else:
        assert all(m.act_args is None for m in mods.values()) and torch.equal(a, b)
    # by default the same modules run the fast kernels, within tests/accelerate/test_linears.py's
    # bounds of one linear (A16: 2e-2, bf16 activations). A8 on compressed-tensors' grid: a token's
    # absmax lands on the tie x / s = ±127.5 by construction, so an input that differs in its last
    # bits (the fused kernels sum in another order) can move the negative absmax's code by one, 1/128
    # of that token's largest value, and that carries through the layers (measured 4e-3 here; with
    # lowbit's own grid the absmax is exact and the bound is 1e-4)
    fast, _ = load_model(str(out))
    assert not any(isinstance(m, QuantLinear) for m in fast.modules())
    with torch.no_grad():
        y = fast(IDS).logits
    assert (y - a).abs().max() <= 2e-2 * a.abs().max()
    # and lowbit can keep it as its own checkpoint
    save_quantized(ours, tmp_path / "lowbit")
    again, _ = load_quantized(tmp_path / "lowbit")
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, a)


def _edit_config(out, fn):
    p = out / "config.json"
    cfg = json.loads(p.read_text())
    fn(cfg["quantization_config"])
    p.write_text(json.dumps(cfg))


def test_refuses_what_lowbit_cannot_run_by_name(tmp_path):
    out = ct_checkpoint(tmp_path / "c", SCHEMES["w4a16-sym-g32"])
    _edit_config(out, lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="tensor", group_size=None))
    with pytest.raises(CheckpointError, match=r"model.layers.0.self_attn.q_proj: .*strategy='tensor'"):
        load_model(str(out))
    _edit_config(out, lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float"}))
    with pytest.raises(CheckpointError, match="kv_cache_scheme"):
        load_model(str(out))
