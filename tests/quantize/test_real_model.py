"""The default model (SmolLM2-135M) cut to its first 6 of 30 layers (to stay fast), with tiny
calibration: the reorder is exact in float, and packed W8A8 stays close while its layers shrink."""

import pytest
import torch

from lowbit.data import calibration_ids
from lowbit.checkpoint import load_model
from lowbit.quantize import get_scheme, quantize_model
from lowbit.quantize.weight_bytes import decoder_bytes

pytestmark = pytest.mark.model
LAYERS = 6


def _load():
    model, tok = load_model("default")
    model.model.layers = model.model.layers[:LAYERS]
    model.config.num_hidden_layers = LAYERS
    return model, tok


@pytest.fixture(scope="module")
def setup():
    ref, tok = _load()
    ids = calibration_ids(tok, 2, 64)
    test = calibration_ids(tok, 1, 64, seed=7)
    with torch.no_grad():
        logits = ref(test).logits
    return tok, ids, test, logits, decoder_bytes(ref)


def test_outlier_reorder_alone_keeps_the_real_models_logits(setup):
    tok, ids, test, logits, _ = setup
    model, _ = _load()
    quantize_model(model, get_scheme("w4a4-kv4"), ids, progress=False, permute_only=True)
    with torch.no_grad():
        got = model(test).logits
    torch.testing.assert_close(got, logits, rtol=0, atol=2e-4)


def test_w8a8_packed_is_close_and_small(setup):
    tok, ids, test, logits, float_bytes = setup
    model, _ = _load()
    quantize_model(model, get_scheme("w8a8"), ids, progress=False)
    with torch.no_grad():
        got = model(test).logits
    agree = (got.argmax(-1) == logits.argmax(-1)).float().mean()
    assert agree > 0.9
    assert decoder_bytes(model) < 0.3 * float_bytes
