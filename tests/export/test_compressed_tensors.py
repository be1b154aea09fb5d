"""Exports read back by the real readers: compressed-tensors' own decompressors (bit for bit
against lowbit's dequantized weights) and transformers' ``from_pretrained`` (same logits)."""

import json

import pytest
import torch

ct = pytest.importorskip("compressed_tensors", reason="needs the export extra (compressed-tensors==0.17.0)")

from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from lowbit.export import ExportError, export_compressed_tensors  # noqa: E402
from tests.tiny_models import tiny_model  # noqa: E402
from lowbit.nn.quant_linear import QuantLinear  # noqa: E402
from lowbit.quantize import get_scheme, quantize_model  # noqa: E402
from lowbit.quantize.overrides import apply_overrides  # noqa: E402

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))

# every scheme the format holds, each with a different corner: act order, zero points,
# per-channel, 8-bit packing, INT8 LM head, W8A8 with SmoothQuant folded into the norms, W4A4
EXPORTABLE = {
    "w4a16-g32-actorder": ("w4a16", ["weights.group_size=32"]),
    "w4a16-asym-g32": ("w4a16", ["weights.group_size=32", "weights.symmetric=false", "lm_head.bits=16"]),
    "w4a16-asym-channel": ("w4a16", ["weights.group_size=0", "weights.symmetric=false", "gptq.act_order=false"]),
    "w8a16-channel": ("w4a16", ["weights.bits=8", "weights.group_size=0", "lm_head.bits=16"]),
    "w8a8-smoothquant": ("w8a8", []),
    "w8a8-asym-weights": ("w8a8", ["weights.symmetric=false"]),
    "w8a8-ct-scale-rule": ("w8a8", ["activations.scale_rule=compressed-tensors"]),
    "w4a4-g32": ("w4a4-rtn", ["weights.group_size=32", "activations.group_size=32"]),
}


def _quantized(preset, sets, **over):
    model = tiny_model("llama", **over)
    quantize_model(model, apply_overrides(get_scheme(preset), sets), IDS, progress=False)
    return model


@pytest.fixture(scope="module", params=sorted(EXPORTABLE))
def exported(request, tmp_path_factory):
    model = _quantized(*EXPORTABLE[request.param])
    out = tmp_path_factory.mktemp("ct") / request.param
    export_compressed_tensors(model, out)
    return request.param, model, out


def _modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def test_compressed_tensors_decompresses_every_tensor_to_lowbits_weight(exported):
    _, model, out = exported
    qc = QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    state = load_file(str(out / "model.safetensors"))
    seen = set()
    for name, m in _modules(model).items():
        # the scheme compressed-tensors' own matching gives this module: exact name, then class
        scheme = next((g for g in qc.config_groups.values() if name in g.targets), qc.config_groups["group_0"])
        local = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
        seen |= {f"{name}.{k}" for k in local}
        dense = BaseCompressor.get_value_from_registry(scheme.format).decompress(local, scheme)
        assert torch.equal(dense["weight"], m.dequantized_weight()), name
    mods = _modules(model)  # nothing else in the file but the float tensors of the float modules
    assert all(k in seen or (k.endswith((".weight", ".bias")) and k.rsplit(".", 1)[0] not in mods) for k in state)


def test_transformers_loads_the_export_and_computes_lowbits_function(exported):
    from transformers import AutoModelForCausalLM

    key, model, out = exported
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ours, theirs = model(IDS).logits, hf(IDS).logits
    for name, m in _modules(model).items():
        assert torch.equal(hf.get_submodule(name).weight, m.dequantized_weight()), name
    if model.lowbit_scheme.activations.scale_rule == "compressed-tensors":
        assert torch.equal(ours, theirs)  # quantized on the reader's own activation grid: its function
    if model.lowbit_scheme.activations.enabled:
        # the reader quantizes activations with its own per-token grid (absmax/127.5, lowbit's
        # default is the signed absmax on -128): close; and really quantized, not dropped
        hf.model.layers[0].self_attn.q_proj.quantization_enabled = False
        with torch.no_grad():
            unquantized = hf(IDS).logits
        assert not torch.equal(unquantized, theirs)
        tol = 0.05 if key.startswith("w8a8") else 0.5
        assert (ours - theirs).abs().max() <= tol * ours.abs().max()
    else:
        assert torch.equal(ours, theirs)


def test_config_says_what_was_exported(exported):
    key, model, out = exported
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    g0 = q["config_groups"]["group_0"]
    assert q["quant_method"] == "compressed-tensors" and g0["targets"] == ["Linear"]
    assert q["format"] == ("int-quantized" if model.lowbit_scheme.activations.enabled else "pack-quantized")
    head = model.get_output_embeddings()
    assert ("lm_head" in q["ignore"]) == (not isinstance(head, QuantLinear))
    if key == "w4a16-g32-actorder":
        assert g0["weights"]["actorder"] == "static" and q["config_groups"]["group_1"]["targets"] == ["lm_head"]
    if key == "w8a8-smoothquant":
        assert g0["input_activations"]["strategy"] == "token" and g0["input_activations"]["dynamic"]


def _refusal(model, tmp_path, **kw):
    with pytest.raises(ExportError) as e:
        export_compressed_tensors(model, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))
    return str(e.value)


def test_refuses_atom_outliers_and_clipped_activations(tmp_path):
    msg = _refusal(_quantized("w4a4", []), tmp_path)
    lines = msg.splitlines()[1:]  # one line per kind of problem, naming its first layers
    assert any(x.strip().startswith("model.layers.0.input_layernorm") and "outliers.count=0" in x for x in lines)
    assert any(x.strip().startswith("model.layers.0.self_attn.q_proj") and "activations.clip_ratio=0.9" in x for x in lines)
    assert len(lines) <= 8  # not one per layer


def test_refuses_groups_that_do_not_divide_a_width_and_suggests_one(tmp_path):
    # hidden 96 like SmolLM2's 576: not a multiple of 128 (nor of 64)
    model = _quantized("w4a16", ["weights.group_size=64"], hidden_size=96, intermediate_size=192)
    msg = _refusal(model, tmp_path)
    line = next(x for x in msg.splitlines() if "weights.group_size=64 does not divide its 96 input columns" in x)
    assert line.strip().startswith("model.layers.0.self_attn.q_proj, ") and "more)" in line
    assert "--set weights.group_size=32 (divides every width)" in msg


def test_refuses_kv4_unless_asked_for_a_float_kv_cache(tmp_path):
    model = _quantized("w4a16", ["weights.group_size=32", "kv_cache.bits=4", "kv_cache.symmetric=false"])
    assert "kv_cache.bits=4" in _refusal(model, tmp_path) and "--kv-cache float" in _refusal(model, tmp_path)
    export_compressed_tensors(model, tmp_path / "out", kv_cache="float")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["kv_cache_scheme"] is None


def test_refuses_fp4_with_fp16_scales(tmp_path):
    msg = _refusal(_quantized("w4a4-fp4", ["outliers.count=0", "gptq.enabled=false"]), tmp_path)
    assert "weights.format='fp4'" in msg and "NVFP4" in msg


def test_out_that_is_a_file_is_refused_before_work(tmp_path):
    from lowbit.export.writer import check_out_dir
    from lowbit.io.outputs import OutputPathError

    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        check_out_dir(tmp_path / "f")
