"""Quantizing from disk (decoder layers loaded one at a time) gives exactly the model that
quantizing the fully loaded model gives."""

import pytest
import torch

from lowbit.models.lazy import open_from_disk
from tests.tiny_models import tiny_model
from lowbit.quantize import get_scheme, quantize_model

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
TEST = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f = tmp_path_factory.mktemp("tiny-qwen2")
    tiny_model("qwen2", seed=3).save_pretrained(f)  # q/k/v biases and a tied head
    return f


@pytest.mark.parametrize("scheme", ["w4a4-kv4", "w8a8", "kv4"])
def test_from_disk_equals_in_memory(folder, scheme):
    from transformers import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    quantize_model(whole, get_scheme(scheme), IDS, progress=False)
    lazy, loader = open_from_disk(folder)
    assert all(p.is_meta for p in lazy.model.layers.parameters())  # nothing of the layers loaded yet
    quantize_model(lazy, get_scheme(scheme), IDS, progress=False, load_layer=loader)
    a, b = whole.state_dict(), lazy.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with torch.no_grad():
        assert torch.equal(whole(TEST).logits, lazy(TEST).logits)


def test_from_disk_refuses_what_it_cannot_do(tmp_path, folder):
    with pytest.raises(FileNotFoundError, match="checkpoint folder"):
        open_from_disk(tmp_path / "missing")
    moe = tmp_path / "moe"
    tiny_model("mixtral").save_pretrained(moe)
    model, loader = open_from_disk(moe)
    with pytest.raises(ValueError, match="dense models"):
        quantize_model(model, get_scheme("w4a4"), IDS, progress=False, load_layer=loader)


def test_decoder_bytes_of_a_model_still_on_disk(folder):
    from transformers import AutoModelForCausalLM

    from lowbit.quantize.weight_bytes import decoder_bytes

    lazy, _ = open_from_disk(folder)
    assert decoder_bytes(lazy) == decoder_bytes(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
