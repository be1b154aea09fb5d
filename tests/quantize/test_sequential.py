"""True-sequential GPTQ, float targets (asymmetric calibration) and the shared/early-stopping
statistics pass that makes them affordable."""

import pytest
import torch

from lowbit.models.adapters import InputGroup, get_adapter
from tests.tiny_models import tiny_model
from lowbit.quantize import GPTQArgs, WeightArgs, get_scheme, quantize_model
from lowbit.quantize.apply import _stages
from lowbit.quantize.calibrate import capture_layer_inputs, capture_linear_inputs, collect_stats
from lowbit.quantize.float_target import float_target_weight
from lowbit.quantize.overrides import apply_overrides
from lowbit.quantize.weights import gptq

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
TEST = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
QKV = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]


def _pair(n=48, t=3000, noise=0.2, seed=0):
    """Float inputs ``x`` and the same tokens' inputs after some upstream error, ``xq``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, n, generator=g) @ (torch.eye(n) + torch.randn(n, n, generator=g) / n**0.5)
    xq = x + noise * torch.randn(t, n, generator=g) @ torch.randn(n, n, generator=g) / n**0.5
    return x, xq, torch.randn(24, n, generator=g) * 0.05


def test_float_target_weight_is_the_least_squares_solution():
    x, xq, w = _pair()
    got = float_target_weight(w, xq.t() @ xq, xq.t() @ x, damp=0.0)
    want = torch.linalg.lstsq(xq.double(), (x @ w.t()).double()).solution.t().float()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-3 * w.abs().max().item())
    # without upstream error the target is the float weight itself, whatever the damping
    torch.testing.assert_close(float_target_weight(w, x.t() @ x, x.t() @ x, damp=0.1), w, rtol=1e-4, atol=1e-6)


def test_float_target_then_gptq_tracks_the_float_output_better():
    x, xq, w = _pair()
    h = xq.t() @ xq
    args, ga = WeightArgs(bits=4, group_size=16), GPTQArgs(enabled=True)
    plain = gptq(w, h, args, ga).dequantize()
    aimed = gptq(float_target_weight(w, h, xq.t() @ x, 0.01), h, args, ga).dequantize()
    err = lambda q: (x @ w.t() - xq @ q.t()).norm()  # noqa: E731
    assert err(aimed) < 0.97 * err(plain)


def test_float_target_rejects_bad_statistics():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match="match"):
        float_target_weight(w, torch.eye(7), torch.eye(7), 0.01)
    bad = torch.eye(8)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        float_target_weight(w, torch.eye(8), bad, 0.01)


def _layer0():
    model = tiny_model("llama")
    layers = model.model.layers
    inputs, kws = capture_layer_inputs(model, layers, IDS, "cpu")
    kw = kws[0]
    return layers[0], inputs, kw


def test_shared_and_early_stopping_statistics_equal_the_plain_pass():
    layer, inputs, kw = _layer0()
    names = QKV + ["self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    plain = collect_stats(layer, names, inputs, kw)
    shared = collect_stats(layer, names, inputs, kw, shared=[QKV, ["mlp.gate_proj", "mlp.up_proj"]])
    first = collect_stats(layer, QKV, inputs, kw, shared=[QKV], stop_early=True)
    for n in names:
        assert torch.equal(plain[n].xtx, shared[n].xtx) and plain[n].n == shared[n].n == IDS.numel()
    assert shared["self_attn.q_proj"] is shared["self_attn.v_proj"]  # one accumulator per input
    for n in QKV:
        assert torch.equal(first[n].xtx, plain[n].xtx) and torch.equal(first[n].amax, plain[n].amax)


def test_cross_term_against_own_inputs_is_xtx_and_mismatch_is_refused():
    layer, inputs, kw = _layer0()
    names = ["self_attn.q_proj", "mlp.down_proj"]
    targets = capture_linear_inputs(layer, names, inputs, kw)
    st = collect_stats(layer, names, inputs, kw, targets=targets)
    for n in names:
        torch.testing.assert_close(st[n].cross, st[n].xtx)
    targets["mlp.down_proj"] = [t[:-1] for t in targets["mlp.down_proj"]]
    with pytest.raises(ValueError, match="do not match"):
        collect_stats(layer, names, inputs, kw, targets=targets)


def test_stages_follow_the_data_dependencies():
    dense = get_adapter(tiny_model("llama")).groups(None)
    assert [[g.linears[0] for g in s] for s in _stages(dense)] == [
        ["self_attn.q_proj"], ["self_attn.o_proj"], ["mlp.gate_proj"], ["mlp.down_proj"]]
    moe = [InputGroup(QKV, "n1", stage=0), InputGroup(["o"], stage=1), InputGroup(["e0.up", "e1.up"], "n2", stage=2),
           InputGroup(["e0.down"], stage=3), InputGroup(["e1.down"], stage=3)]
    assert [len(s) for s in _stages(moe)] == [1, 1, 1, 2]
    olmo = tiny_model("olmo2")  # no norm feeds any group: the stages still cut at each block
    groups = get_adapter(olmo).groups(olmo.model.layers[0])
    assert all(g.norm is None for g in groups) and [len(s) for s in _stages(groups)] == [1, 1, 1, 1]


@pytest.mark.parametrize("overrides", [["gptq.true_sequential=true"], ["gptq.float_target=true"],
                                       ["gptq.true_sequential=true", "gptq.float_target=true"]])
def test_sequential_and_float_target_quantize_a_tiny_model(overrides):
    ref = tiny_model("llama")
    with torch.no_grad():
        want = ref(TEST).logits
    model = tiny_model("llama")
    quantize_model(model, apply_overrides(get_scheme("w4a4-kv4"), overrides), IDS, progress=False)
    with torch.no_grad():
        got = model(TEST).logits
    assert 0 < float((got - want).norm() / want.norm()) < 0.3


def test_float_target_refuses_mixture_of_experts():
    scheme = apply_overrides(get_scheme("w4a16"), ["gptq.float_target=true"])
    with pytest.raises(ValueError, match="mixture of experts"):
        quantize_model(tiny_model("mixtral"), scheme, IDS, progress=False)
