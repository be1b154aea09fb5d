"""The LM head quantized by a scheme's ``lm_head`` part (the w4a16, W4A4 and W3A3 presets: INT8 per row)."""

import pytest
import torch

from lowbit.eval.forward import model_vocab
from lowbit.checkpoint import load_quantized, save_quantized
from lowbit.accelerate import KernelLinear, accelerate
from lowbit.kernels.cpu import w8a16
from tests.tiny_models import tiny_model
from lowbit.nn import QuantLinear
from lowbit.quantize import PRESETS, get_scheme, quantize_model
from lowbit.quantize.head import quantize_head
from lowbit.formats.scheme import GPTQArgs, RotationArgs, Scheme, WeightArgs

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def test_which_presets_quantize_the_head():
    int8 = WeightArgs(bits=8, group_size=0, symmetric=True)
    assert {n for n, s in PRESETS.items() if s.lm_head.enabled} == {
        "w4a16", "w4a16-rot", "w4a4", "w4a4-rot", "w4a4-kv4", "w4a4-kv4-rot", "w3a3", "w3a3-rot", "w4a4-fp4"}
    assert all(s.lm_head == int8 for s in PRESETS.values() if s.lm_head.enabled)


@pytest.mark.parametrize("name", ["w4a16", "w4a4", "w3a3"])
def test_presets_keep_the_head_in_int8_and_untie_it(tmp_path, name):
    scheme = get_scheme(name)
    model = tiny_model("llama", tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    emb = model.model.embed_tokens.weight.detach().clone()
    quantize_model(model, scheme.with_(gptq=GPTQArgs(enabled=False)), IDS, progress=False)
    head = model.lm_head
    assert isinstance(head, QuantLinear) and head.layout.w_bits == 8 and head.layout.w_group == 0
    assert torch.equal(model.model.embed_tokens.weight, emb)  # the lookup stays float
    assert model.config.tie_word_embeddings is False and model_vocab(model) == 128
    # INT8 per row: each weight within half a step of its row's scale
    err = (head.dequantized_weight() - emb).abs()
    step = emb.abs().amax(1, keepdim=True) / 127
    assert torch.all(err <= step / 2 * (1 + 2 ** -10) + 1e-7)
    save_quantized(model, tmp_path / "q")
    again, _ = load_quantized(tmp_path / "q")
    assert isinstance(again.lm_head, QuantLinear)
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, model(IDS).logits)
    counts = accelerate(again)
    assert isinstance(again.lm_head, KernelLinear) and counts[f"w8a16:cpu:{w8a16.default_method()}"] == 1


def test_head_left_float_by_default_and_old_schemes_load():
    assert not Scheme().lm_head.enabled
    d = get_scheme("w4a4").to_dict()
    d.pop("lm_head")  # a checkpoint written before the part existed
    assert Scheme.from_dict(d).lm_head == WeightArgs()
    model = tiny_model("llama")
    quantize_model(model, get_scheme("w8a8"), IDS, progress=False)
    assert isinstance(model.lm_head, torch.nn.Linear)


def test_quantize_head_refuses_what_it_cannot_quantize():
    model = tiny_model("llama")
    quantize_head(model, WeightArgs(bits=8, group_size=0))
    with pytest.raises(ValueError, match="already quantized"):
        quantize_head(model, WeightArgs(bits=8, group_size=0))
    other = tiny_model("llama")
    other.lm_head = torch.nn.Identity()
    with pytest.raises(ValueError, match="nn.Linear"):
        quantize_head(other, WeightArgs(bits=8, group_size=0))


def _proxy_loss(w: torch.Tensor, q: torch.Tensor, xtx: torch.Tensor) -> float:
    """GPTQ's objective, ``tr((W - Q) XᵀX (W - Q)ᵀ)``: the squared error of the head's outputs."""
    d = (w - q).double()
    return float(torch.einsum("oi,ij,oj->", d, xtx.double(), d))


def test_gptq_head_lowers_the_output_error_of_rtn():
    model = tiny_model("llama")
    w = model.lm_head.weight.detach().float().clone()
    x = torch.randn(64, w.shape[1], generator=torch.Generator().manual_seed(1))
    x[:, 3] *= 20  # one large channel, as a residual stream has
    xtx = x.T @ x
    args = WeightArgs(bits=8, group_size=0)
    rtn_head = quantize_head(tiny_model("llama"), args)
    gptq_head = quantize_head(model, args, xtx, GPTQArgs(enabled=True))
    assert not torch.equal(gptq_head.dequantized_weight(), rtn_head.dequantized_weight())
    assert _proxy_loss(w, gptq_head.dequantized_weight(), xtx) < 0.8 * _proxy_loss(w, rtn_head.dequantized_weight(), xtx)
    with pytest.raises(ValueError, match="both"):
        quantize_head(tiny_model("llama"), args, xtx)


LONG = torch.randint(0, 128, (4, 24), generator=torch.Generator().manual_seed(3))  # 96 tokens for the head's 64 inputs


@pytest.mark.parametrize("rotation", ["none", "block", "r1"])
def test_quantize_model_gives_the_head_gptq_on_what_it_reads(monkeypatch, rotation):
    """The Hessian GPTQ gets is XᵀX of the head's real inputs in the quantized model (R1 folds
    the final norm into the head and rotates what it reads)."""
    import lowbit.quantize.apply as apply

    seen = {}
    real = apply.quantize_head

    def spy(model, args, xtx=None, gargs=None):
        seen["xtx"], seen["gargs"] = xtx, gargs
        captured = []
        h = model.lm_head.register_forward_pre_hook(lambda m, a: captured.append(a[0].reshape(-1, a[0].shape[-1])))
        with torch.no_grad():
            for row in LONG:
                model(row[None])
        h.remove()
        x = torch.cat(captured).float()
        seen["want"] = x.T @ x
        return real(model, args, xtx, gargs)

    monkeypatch.setattr(apply, "quantize_head", spy)
    scheme = get_scheme("w4a4-rot" if rotation == "block" else "w4a4")
    if rotation == "r1":
        scheme = scheme.with_(rotation=RotationArgs(kind="hadamard"))
    assert scheme.gptq.enabled
    quantize_model(tiny_model("llama"), scheme, LONG, progress=False)
    assert seen["gargs"] == scheme.gptq
    torch.testing.assert_close(seen["xtx"], seen["want"], rtol=1e-4, atol=1e-4 * float(seen["want"].abs().max()))
    quantize_model(tiny_model("llama"), scheme.with_(gptq=GPTQArgs(enabled=False)), LONG, progress=False)
    assert seen["xtx"] is None and seen["gargs"] is None  # RTN without GPTQ
