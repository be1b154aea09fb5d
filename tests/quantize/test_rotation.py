"""The rotation pre-pass: a rotated float model computes the original's function, the scheme
field round-trips (old checkpoints without it still load), and rotated checkpoints are plain weights.

Logit bound (fp32): each rotated weight is computed in float64 and rounded once to fp32 (≤ u
relative, u = 2⁻²⁴), and the two models' fp32 forwards round differently over sums of up to
128 terms (the tiny models' widest input) in 2 layers, so |Δlogit| ≲ 2·128·u·max|logit| ≈
1.5e-5·max|logit|; the tests use 2e-5·max|logit| (observed ≈ 7e-7).
"""

import copy

import pytest
import torch
from torch import nn

from lowbit.checkpoint import load_quantized, save_quantized
from lowbit.errors import LowbitError
from lowbit.formats.hadamard import HadamardSizeError
from lowbit.formats.scheme import RotationArgs, Scheme, SchemeError
from lowbit.nn import QuantLinear
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.overrides import apply_overrides
from lowbit.quantize.rotation import RotationError, rotate_model
from tests.tiny_models import TINY_ARCHS, tiny_model

IDS = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
REL = 2e-5


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("kind", ["hadamard", "random-hadamard"])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_rotated_float_model_equals_the_original(arch, kind):
    model = tiny_model(arch)
    ref = _logits(model)
    rotate_model(model, RotationArgs(kind=kind, seed=5))
    got = _logits(model)
    assert (got - ref).abs().max() <= REL * ref.abs().max()


def test_weights_really_change_and_norms_are_folded():
    model = tiny_model("gemma")  # Gemma's norm is x̂ · (1 + w): folded, w becomes 0
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    rotate_model(model, RotationArgs(kind="hadamard"))
    layer = model.model.layers[0]
    assert not torch.allclose(layer.self_attn.q_proj.weight, before, atol=1e-3)
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
        assert torch.equal(norm.weight, torch.zeros_like(norm.weight))
    llama = tiny_model("llama")
    rotate_model(llama, RotationArgs(kind="hadamard"))
    assert torch.equal(llama.model.norm.weight, torch.ones_like(llama.model.norm.weight))


def test_the_residual_outliers_are_spread():
    """The point of it: the tiny models' 3 strong norm channels no longer dominate q_proj's input."""
    model = tiny_model("llama")
    acts = {}
    hook = lambda m, a, o: acts.__setitem__("x", a[0].detach())  # noqa: E731
    h = model.model.layers[1].self_attn.q_proj.register_forward_hook(hook)
    _logits(model)
    plain = acts["x"].abs().amax((0, 1))
    h.remove()
    rotate_model(model, RotationArgs(kind="hadamard"))
    model.model.layers[1].self_attn.q_proj.register_forward_hook(hook)
    _logits(model)
    rot = acts["x"].abs().amax((0, 1))  # normalized input times the folded scale now lives in the weight
    assert rot.max() / rot.median() < plain.max() / plain.median()


def test_tied_head_is_untied_and_the_config_says_so():
    model = tiny_model("llama", tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ref = _logits(model)
    rotate_model(model, RotationArgs(kind="hadamard"))
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert model.config.tie_word_embeddings is False
    assert (_logits(model) - ref).abs().max() <= REL * ref.abs().max()


def test_none_changes_nothing():
    model = tiny_model("qwen2")
    state = copy.deepcopy(model.state_dict())
    rotate_model(model, RotationArgs())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_scheme_field_defaults_round_trips_and_validates():
    s = get_scheme("w4a4")
    assert s.rotation == RotationArgs(kind="none", seed=0) and not s.rotation.enabled
    old = s.to_dict()
    del old["rotation"]  # checkpoints saved before the field existed
    assert Scheme.from_dict(old) == s
    r = apply_overrides(s, ["rotation.kind=random-hadamard", "rotation.seed=7"])
    assert r.rotation == RotationArgs(kind="random-hadamard", seed=7) and Scheme.from_dict(r.to_dict()) == r
    with pytest.raises(SchemeError, match="rotation.kind"):
        apply_overrides(s, ["rotation.kind=givens"])
    for bad in (-1, 1.5, True):
        with pytest.raises(SchemeError, match="rotation.seed"):
            RotationArgs(kind="hadamard", seed=bad)


def test_a_hidden_size_with_no_hadamard_matrix_fails_before_any_change():
    model = tiny_model("llama", hidden_size=52, head_dim=16)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(HadamardSizeError, match="order 52"):
        rotate_model(model, RotationArgs(kind="hadamard"))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_bad_models_are_refused():
    q = tiny_model("llama")
    quantize_model(q, get_scheme("w4a4-rtn"), IDS, progress=False)
    with pytest.raises(RotationError, match="already has quantized"):
        rotate_model(q, RotationArgs(kind="hadamard"))
    nan = tiny_model("llama")
    with torch.no_grad():
        nan.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(RotationError, match="NaN"):
        rotate_model(nan, RotationArgs(kind="hadamard"))
    lazy = tiny_model("llama")  # --from-disk: layers still on the meta device
    lazy.model.layers[1].mlp.up_proj.weight = nn.Parameter(torch.empty(128, 64, device="meta"), requires_grad=False)
    with pytest.raises(RotationError, match="not loaded"):
        rotate_model(lazy, RotationArgs(kind="hadamard"))
    assert issubclass(RotationError, LowbitError)


@pytest.mark.parametrize("head_bits", [16, 8])
def test_quantize_model_rotates_first_and_checkpoints_are_plain_weights(tmp_path, head_bits):
    scheme = apply_overrides(get_scheme("w4a4-kv4"), ["rotation.kind=hadamard", "outliers.count=8",
                                                      f"lm_head.bits={head_bits}"])
    model = tiny_model("llama", tie_word_embeddings=True)
    float_logits = _logits(model)
    quantize_model(model, scheme, IDS, progress=False)
    assert isinstance(model.model.layers[0].mlp.down_proj, QuantLinear)
    got = _logits(model)
    assert torch.isfinite(got).all() and (got - float_logits).abs().mean() < 0.5 * float_logits.abs().mean()
    save_quantized(model, tmp_path / "q")
    again, _ = load_quantized(tmp_path / "q")
    assert again.lowbit_scheme.rotation == RotationArgs(kind="hadamard")
    if head_bits == 16:  # the rotated head is an untied float copy
        assert isinstance(again.lm_head, nn.Linear) and again.lm_head.weight is not again.model.embed_tokens.weight
    else:  # the preset's INT8 head, quantized from the rotated weight
        assert isinstance(again.lm_head, QuantLinear) and again.lm_head.layout.w_bits == 8
    assert torch.equal(_logits(again), got)


def test_rotated_float_checkpoint_saves_and_loads(tmp_path):
    """No quantized linear at all (a KV-only scheme): the rotated float weights are the checkpoint."""
    scheme = apply_overrides(Scheme(name="rot"), ["rotation.kind=hadamard"])
    model = tiny_model("gemma")
    ref = _logits(model)
    quantize_model(model, scheme, None, progress=False)
    save_quantized(model, tmp_path / "r")
    again, _ = load_quantized(tmp_path / "r")
    assert torch.equal(_logits(again), _logits(model))
    assert (_logits(again) - ref).abs().max() <= REL * ref.abs().max()
