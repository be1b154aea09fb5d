"""Capturing linear inputs: shared inputs form one site, statistics cover every token."""

import torch

from lowbit.models.capture import capture_inputs, decoder_linears
from tests.tiny_models import tiny_llama


def test_sites_group_shared_inputs_and_count_tokens():
    model = tiny_llama(vocab_size=128, layers=2)
    ids = torch.randint(0, 128, (3, 16))
    sites = capture_inputs(model, ids, keep_rows=12)
    assert len(decoder_linears(model)) == 14
    assert len(sites) == 8  # per layer: q/k/v, o, gate/up, down
    qkv = sites["model.layers.0.self_attn.q_proj"]
    assert qkv.consumers == [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert sites["model.layers.1.mlp.gate_proj"].consumers == ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]
    for s in sites.values():
        assert s.n_tokens == 48 and s.sample().shape[0] == 12


def test_square_sums_are_the_diagonal_of_xtx():
    model = tiny_llama(vocab_size=128, layers=1)
    ids = torch.randint(0, 128, (2, 10))
    seen = []
    h = model.model.layers[0].mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].reshape(-1, a[0].shape[-1])))
    sites = capture_inputs(model, ids)
    h.remove()
    x = torch.cat(seen)
    assert torch.allclose(sites["model.layers.0.mlp.down_proj"].sq_sum, torch.diag(x.T @ x), rtol=1e-5)
