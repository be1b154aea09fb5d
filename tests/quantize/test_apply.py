import pytest
import torch

from lowbit.models.adapters import UnsupportedArchitectureError
from tests.tiny_models import TINY_ARCHS, tiny_model
from lowbit.nn import PermutedNorm, QuantLinear
from lowbit.quantize import PRESETS, get_scheme, quantize_model
from lowbit.quantize.weight_bytes import decoder_bytes
from lowbit.formats.scheme import WeightArgs

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
TEST = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))


def _rel_err(model, ref):
    with torch.no_grad():
        a, b = model(TEST).logits, ref
    return float((a - b).norm() / b.norm())


def _ref(arch):
    with torch.no_grad():
        return tiny_model(arch)(TEST).logits


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_permutation_alone_leaves_float_logits_unchanged(arch):
    model = tiny_model(arch)
    quantize_model(model, get_scheme("w4a4"), IDS, progress=False, permute_only=True)
    norms = [m for m in model.modules() if isinstance(m, PermutedNorm)]
    perms = [m.input_perm for m in model.modules() if isinstance(m, QuantLinear) and m.input_perm is not None]
    assert len(norms) == 2 * model.config.num_hidden_layers and perms
    assert all(not torch.equal(p, torch.arange(p.numel())) for p in perms)
    with torch.no_grad():
        got = model(TEST).logits
    torch.testing.assert_close(got, _ref(arch), rtol=0, atol=2e-5)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_atom_recipe_runs_and_beats_round_to_nearest(arch):
    ref = _ref(arch)
    errs = {}
    # the same LM head in both (float): the recipes differ in the decoder only
    float_head = WeightArgs()
    for scheme in (get_scheme("w4a4-rtn").with_(lm_head=float_head), get_scheme("w4a4-kv4").with_(lm_head=float_head)):
        model = tiny_model(arch)
        quantize_model(model, scheme, IDS, progress=False)
        errs[scheme.name] = _rel_err(model, ref)
    assert errs["w4a4-kv4"] < errs["w4a4-rtn"], errs


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_on_tiny_llama(name):
    model = tiny_model("llama")
    float_bytes = decoder_bytes(model)
    quantize_model(model, get_scheme(name), IDS, progress=False)
    err = _rel_err(model, _ref("llama"))
    bound = {"w8a8": 0.05, "w3a3": 0.6, "w4a4-rtn": 1.0}.get(name, 0.3)
    assert 0 < err < bound
    if get_scheme(name).weights.bits == 4:
        assert decoder_bytes(model) < 0.3 * float_bytes  # packed codes really shrink the layers


def test_unsupported_architecture_and_bad_calibration():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UnsupportedArchitectureError, match="model_type='gpt2'"):
        quantize_model(gpt2, get_scheme("w4a4"), IDS)
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="calibration ids"):
        quantize_model(model, get_scheme("w4a4"), torch.zeros(0, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        quantize_model(model, get_scheme("w4a4"), IDS.float())
