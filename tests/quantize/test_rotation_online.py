"""R4, the online Hadamard at the down_proj input: the float model with it computes the original's
function, calibration sees the rotated input, the packed down_proj keeps the transform through
save/load and the CPU kernels, and what cannot hold it (compressed-tensors, --tp) refuses it.

Bound (fp32): as in test_rotation.py, 2e-5·max|logit| (the down_proj weights are rotated in
float64 and rounded once; the online transform adds log2(p) + m + 2 rounded steps per element,
covered by the same margin; observed ≈ 7e-7).
"""

import pytest
import torch
from torch import nn

from lowbit.accelerate import accelerate
from lowbit.checkpoint import load_quantized, save_quantized
from lowbit.export import ExportError, export_compressed_tensors
from lowbit.formats.hadamard import HadamardSizeError, fast_transform
from lowbit.formats.scheme import RotationArgs, Scheme, SchemeError, TPArgs
from lowbit.nn import QuantLinear
from lowbit.nn.online_hadamard import HadamardInputLinear, InputHadamard, OnlineTransformError
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.overrides import apply_overrides
from lowbit.quantize.rotation import rotate_model
from tests.tiny_models import TINY_ARCHS, tiny_model

IDS = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
REL = 2e-5


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _downs(model):
    return [m for n, m in model.named_modules() if n.endswith("down_proj")]


@pytest.mark.parametrize("r2", [True, False])
@pytest.mark.parametrize("kind", ["hadamard", "random-hadamard"])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_float_model_with_r4_equals_the_original(arch, kind, r2):
    model = tiny_model(arch)
    ref = _logits(model)
    rotate_model(model, RotationArgs(kind=kind, seed=5, r2=r2, r4=True))
    downs = _downs(model)
    assert downs and all(isinstance(m, HadamardInputLinear) for m in downs)
    got = _logits(model)
    assert (got - ref).abs().max() <= REL * ref.abs().max()


def test_random_signs_go_into_the_up_rows_only():
    """Against the same rotation without R4: gate_proj equal, each up_proj row ± its R1-only value."""
    r1, r4 = tiny_model("llama"), tiny_model("llama")
    rotate_model(r1, RotationArgs(kind="random-hadamard", seed=2))
    rotate_model(r4, RotationArgs(kind="random-hadamard", seed=2, r4=True))
    m1, m4 = r1.model.layers[0].mlp, r4.model.layers[0].mlp
    assert torch.equal(m1.gate_proj.weight, m4.gate_proj.weight)
    ratio = (m4.up_proj.weight / m1.up_proj.weight)[:, 0]
    assert torch.equal(m4.up_proj.weight, m1.up_proj.weight * ratio[:, None])
    assert set(ratio.tolist()) == {1.0, -1.0}


def test_calibration_hooks_see_the_rotated_input():
    model = tiny_model("llama")
    rotate_model(model, RotationArgs(kind="hadamard", r4=True))
    down = model.model.layers[0].mlp.down_proj
    seen = {}
    down.register_forward_pre_hook(lambda m, a: seen.__setitem__("raw", a[0].detach().clone()), prepend=True)
    down.register_forward_hook(lambda m, a, o: seen.__setitem__("hooked", a[0].detach().clone()))
    _logits(model)
    assert torch.allclose(seen["hooked"], fast_transform(seen["raw"]), atol=1e-6)


def test_packed_down_proj_keeps_the_transform_through_save_load_and_kernels(tmp_path):
    scheme = apply_overrides(get_scheme("w4a4"), ["rotation.kind=random-hadamard", "rotation.r4=true",
                                                   "outliers.count=8"])
    model = tiny_model("llama")
    quantize_model(model, scheme, IDS, progress=False)
    down = model.model.layers[0].mlp.down_proj
    assert isinstance(down, QuantLinear) and down.layout.input_transform == {"kind": "hadamard", "n": 128}
    assert down.input_transform is not None and down.input_perm is not None
    got = _logits(model)
    save_quantized(model, tmp_path / "q")
    again, _ = load_quantized(tmp_path / "q")
    assert again.lowbit_scheme.rotation.r4 and again.model.layers[1].mlp.down_proj.layout.input_transform
    assert torch.equal(_logits(again), got)
    counts = accelerate(again)
    kl = again.model.layers[0].mlp.down_proj
    assert type(kl).__name__ == "KernelLinear" and kl.input_transform is not None, counts
    fast = _logits(again)
    assert (fast - got).abs().max() <= 1e-3 * got.abs().max()


def test_without_the_online_transform_the_packed_model_is_wrong():
    """The transform is load-bearing: dropping it from the packed down_proj changes the output."""
    scheme = apply_overrides(get_scheme("w4a4-rtn"), ["rotation.kind=hadamard", "rotation.r4=true"])
    model = tiny_model("llama")
    quantize_model(model, scheme, IDS, progress=False)
    good = _logits(model)
    for m in _downs(model):
        m.input_transform = None
    assert (_logits(model) - good).abs().max() > 0.1 * good.abs().max()


def test_compressed_tensors_export_refuses_it_naming_the_layer(tmp_path):
    scheme = apply_overrides(get_scheme("w4a16"), ["rotation.kind=hadamard", "rotation.r4=true",
                                                    "weights.group_size=32", "lm_head.bits=16"])
    model = tiny_model("llama")
    quantize_model(model, scheme, IDS, progress=False)
    with pytest.raises(ExportError) as e:
        export_compressed_tensors(model, tmp_path / "out")
    line = next(x for x in str(e.value).splitlines() if "online hadamard" in x)
    assert "model.layers.0.mlp.down_proj" in line and "rotation.r4=false" in line
    assert not (tmp_path / "out").exists()
    plain = apply_overrides(get_scheme("w4a16"), ["rotation.kind=hadamard", "weights.group_size=32", "lm_head.bits=16"])
    ok = tiny_model("llama")
    quantize_model(ok, plain, IDS, progress=False)
    export_compressed_tensors(ok, tmp_path / "ok")  # R1 + R2 alone are plain weights: exports


def test_scheme_field_defaults_and_refusals():
    old = get_scheme("w4a4").to_dict()
    old["rotation"] = {"kind": "hadamard", "seed": 0}  # a checkpoint from before r2/r4 existed
    r = Scheme.from_dict(old).rotation
    assert r.r2 and not r.r4 and not r.online
    assert not RotationArgs(kind="none", r4=True).online
    with pytest.raises(SchemeError, match="rotation.r4 must be true or false"):
        RotationArgs(kind="hadamard", r4="yes")
    with pytest.raises(SchemeError, match="need quantized"):
        Scheme(rotation=RotationArgs(kind="hadamard", r4=True))
    with pytest.raises(SchemeError, match="tensor parallelism"):
        get_scheme("w4a4").with_(rotation=RotationArgs(kind="hadamard", r4=True), tensor_parallel=TPArgs(world=2))


def test_bad_transforms_are_refused():
    with pytest.raises(HadamardSizeError, match="order 52"):
        InputHadamard(52)
    for bad in ({"kind": "givens", "n": 4}, {"kind": "hadamard"}, {"kind": "hadamard", "n": -4}, [4]):
        with pytest.raises(OnlineTransformError):
            InputHadamard.from_dict(bad)
    with pytest.raises(OnlineTransformError, match="width 8"):
        InputHadamard(16)(torch.zeros(2, 8))
    h = InputHadamard(12)
    assert h(torch.ones(3, 12, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert InputHadamard.from_dict(h.to_dict()).n == 12


def test_a_down_proj_width_with_no_hadamard_fails_before_any_change():
    model = tiny_model("llama", intermediate_size=52)  # 52 = 4·13: no Hadamard matrix of that order here
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(HadamardSizeError, match="order 52"):
        rotate_model(model, RotationArgs(kind="hadamard", r4=True))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not any(isinstance(m, HadamardInputLinear) for m in model.modules())
    assert all(type(m) is nn.Linear for m in _downs(model))
