"""Linears that read one input run as one kernel call, with the same bits as one call each."""

import copy

import pytest
import torch

from lowbit.accelerate import KernelLinear, accelerate
from lowbit.kernels import from_float
from lowbit.accelerate.fuse import FusedPart, concat_params, down_input_orders, fuse, shared_input_groups
from lowbit.nn.online_hadamard import BlockHadamard, InputHadamard
from lowbit.kernels.linear_params import KernelError
from tests.tiny_models import RECENT_ARCHS, TINY_ARCHS, tiny_model
from lowbit.quantize import get_scheme, quantize_model
from lowbit.formats.scheme import GPTQArgs

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def _quantized(name: str, arch: str = "llama"):
    model = tiny_model(arch, hidden_size=256, intermediate_size=512)
    quantize_model(model, get_scheme(name).with_(gptq=GPTQArgs(enabled=False)), IDS, progress=False)
    return model


@pytest.mark.parametrize("name", ["w4a16", "w8a8", "w4a4", "w4a4-rot"])
def test_fused_model_is_bit_identical_to_one_call_per_linear(name):
    model = _quantized(name)
    fused, single = copy.deepcopy(model), copy.deepcopy(model)
    counts = accelerate(fused)
    assert counts["fused_groups"] == 2 * model.config.num_hidden_layers  # q/k/v and gate/up per layer
    assert "fused_groups" not in accelerate(single, fuse=False)
    attn = fused.model.layers[0].self_attn
    assert isinstance(attn.q_proj, FusedPart) and attn.q_proj.shared is attn.v_proj.shared
    assert isinstance(fused.model.layers[0].self_attn.o_proj, KernelLinear)
    # W4A4's down_proj input order moves into gate/up's rows: down_proj gathers nothing
    w4a4 = name.startswith("w4a4")
    assert counts["folded_orders"] == (model.config.num_hidden_layers if w4a4 else 0)
    down, single_down = fused.model.layers[0].mlp.down_proj, single.model.layers[0].mlp.down_proj
    if w4a4:
        assert down.input_perm is None and down.prepared.input_perm is None
        assert (single_down.prepared.input_perm is not None) != (single_down.input_perm is not None)
    if name.endswith("-rot"):  # the block Hadamard (after the norm's reorder) runs once per fused group, and in down_proj
        assert attn.q_proj.shared.input_transform is not None and down.input_transform is not None
        with torch.no_grad():  # and both are lowbit's reference layers (QuantLinear) within the kernels' rounding
            want = model(IDS).logits
            torch.testing.assert_close(fused(IDS).logits, want, rtol=0, atol=1e-3 * float(want.abs().max()))
    for ctx in (torch.inference_mode, torch.no_grad):
        with ctx():
            assert torch.equal(fused(IDS).logits, single(IDS).logits)
    with torch.inference_mode():  # decode with a cache: one token at a time
        a = fused.generate(IDS[:1, :8], max_new_tokens=6, do_sample=False)
        b = single.generate(IDS[:1, :8], max_new_tokens=6, do_sample=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("arch", TINY_ARCHS + RECENT_ARCHS)
def test_down_proj_order_folded_upstream_keeps_the_bits(arch):
    model = tiny_model(arch)
    quantize_model(model, get_scheme("w4a4").with_(gptq=GPTQArgs(enabled=False)), IDS, progress=False)
    folded, single = copy.deepcopy(model), copy.deepcopy(model)
    counts = accelerate(folded)
    accelerate(single, fuse=False)
    # every dense two-linear MLP folds (Phi-3's gate|up is one linear, MoE experts are not fused;
    # the tiny Qwen3-MoE has a dense layer)
    dense = len(down_input_orders(model))
    assert counts["folded_orders"] == dense and (dense == 0) == (arch in ("phi3", "mixtral"))
    with torch.no_grad():
        assert torch.equal(folded(IDS).logits, single(IDS).logits)


def test_order_stays_with_down_proj_when_it_has_no_kernel(monkeypatch):
    """down_proj's order moves upstream only once down_proj runs on a kernel without it."""
    model = _quantized("w4a4")
    single = copy.deepcopy(model)
    accelerate(single, fuse=False)
    real = KernelLinear.from_quant_linear.__func__

    def refuse_folded(cls, ql, kernel=None, input_folded=False):
        if input_folded:
            raise KernelError("no kernel for this layer")
        return real(cls, ql, kernel)

    monkeypatch.setattr(KernelLinear, "from_quant_linear", classmethod(refuse_folded))
    counts = accelerate(model)
    assert "folded_orders" not in counts and counts["fused_groups"] == 2 * model.config.num_hidden_layers
    assert model.model.layers[0].mlp.down_proj.prepared.input_perm is not None
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, single(IDS).logits)


def test_a_part_called_with_another_or_changed_input_recomputes():
    model = _quantized("w4a16")
    single = copy.deepcopy(model)
    accelerate(model)
    accelerate(single, fuse=False)
    fa, sa = model.model.layers[0].self_attn, single.model.layers[0].self_attn
    x1, x2 = torch.randn(1, 3, 256), torch.randn(1, 3, 256)
    with torch.no_grad():
        assert torch.equal(fa.q_proj(x1), sa.q_proj(x1))
        assert torch.equal(fa.k_proj(x2), sa.k_proj(x2))  # another input: not q's cached sibling
        assert torch.equal(fa.q_proj(x1), sa.q_proj(x1))
        x1.mul_(2)  # changed in place after q: the version counter catches it
        assert torch.equal(fa.v_proj(x1), sa.v_proj(x1))
        assert torch.equal(fa.q_proj(x1), sa.q_proj(x1))
        assert torch.equal(fa.q_proj(x1), sa.q_proj(x1))  # the same part twice: recomputed
    shared = fa.q_proj.shared
    for p in (fa.k_proj, fa.v_proj):
        with torch.no_grad():
            p(x1)
    assert shared._x is None  # every part taken: no tensor held between calls


def test_moe_experts_are_not_fused_and_unknown_models_are_left_alone():
    model = _quantized("w4a16", "mixtral")
    groups = shared_input_groups(model)
    assert groups and all(".experts." not in p for g in groups for p in g)
    assert accelerate(model)["fused_groups"] == model.config.num_hidden_layers  # q/k/v only
    assert shared_input_groups(torch.nn.Sequential(torch.nn.Linear(4, 4))) == []


def test_siblings_with_different_transforms_are_not_fused():
    model = _quantized("w4a4-rot")
    attn = model.model.layers[0].self_attn
    t = attn.k_proj.input_transform
    attn.k_proj.input_transform = BlockHadamard(t.n, t.normal, t.block // 2)
    with pytest.raises(KernelError, match="different online input transforms"):
        fuse([attn.q_proj, attn.k_proj, attn.v_proj])
    single = copy.deepcopy(model)
    counts = accelerate(model)
    accelerate(single, fuse=False)
    assert counts["fused_groups"] == 2 * model.config.num_hidden_layers - 1  # all but that q/k/v
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, single(IDS).logits)


def test_no_fold_past_a_transform_that_runs_before_the_order():
    model = _quantized("w4a4")
    down = model.model.layers[0].mlp.down_proj
    down.input_transform = InputHadamard(down.in_features)  # R4's Hadamard: before the reorder
    assert "model.layers.0.mlp.down_proj" not in down_input_orders(model).values()
    with pytest.raises(KernelError, match="folded upstream"):
        KernelLinear.from_quant_linear(down, input_folded=True)


def test_incompatible_siblings_are_refused():
    a = from_float(torch.randn(8, 256), "w4a16", group=128)
    with pytest.raises(KernelError, match="cannot fuse"):
        concat_params([a, from_float(torch.randn(8, 256), "w4a16", group=64)])
    with pytest.raises(KernelError, match="cannot fuse"):
        concat_params([a, from_float(torch.randn(8, 256), "w8a8")])
    b = from_float(torch.randn(4, 256), "w4a16", group=128, bias=torch.randn(4))
    c = concat_params([a, b])
    assert c.out_features == 12 and torch.equal(c.bias[:8], torch.zeros(8)) and torch.equal(c.bias[8:], b.bias)
