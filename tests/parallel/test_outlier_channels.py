"""Outlier channels for the TP all-reduce: chosen by RMS on calibration tokens (per layer or one set
for the model), installed per row-parallel layer; every rank gets the same logits, and on a model
with outlier channels int4+h32+o8 is closer to the single-process logits than int4."""

import pytest
import torch
import tp_workers as wk

from lowbit.parallel.launch import check_results, run_ranks
from lowbit.parallel.outlier_channels import channel_magnitudes, choose_channels
from tests.tiny_models import tiny_model

NAMES = [f"model.layers.{i}.{p}" for i in range(2) for p in ("self_attn.o_proj", "mlp.down_proj")]


def _model():
    model = tiny_model("llama", seed=1, num_attention_heads=6, num_key_value_heads=3, hidden_size=96)
    with torch.no_grad():  # a planted outlier channel: output 7 of layer 0's down_proj, 40x
        model.model.layers[0].mlp.down_proj.weight[7] *= 40
    return model


def test_channels_by_rms_per_layer_and_per_model():
    model = _model()
    ids = torch.randint(0, 128, (3, 16), generator=torch.Generator().manual_seed(2))
    mags = channel_magnitudes(model, NAMES, ids)
    outs = {}
    hooks = [dict(model.named_modules())[n].register_forward_hook(
        lambda m, i, o, n=n: outs.setdefault(n, []).append(o.reshape(-1, o.shape[-1]))) for n in NAMES]
    with torch.inference_mode():
        for row in ids:
            model(input_ids=row[None], use_cache=False)
    for h in hooks:
        h.remove()
    for k, n in enumerate(NAMES):
        y = torch.cat(outs[n]).double()
        torch.testing.assert_close(mags[k], (y * y).mean(0), rtol=1e-9, atol=0)
    per_layer = choose_channels(mags, 8, "layer")
    assert per_layer.shape == (4, 8) and 7 in per_layer[1].tolist()  # the planted channel, its layer
    assert all(torch.equal(r, torch.sort(r).values) for r in per_layer)
    assert torch.equal(per_layer[0], torch.sort(torch.topk(mags[0].double(), 8).indices).values)
    model_set = choose_channels(mags, 8, "model")
    assert all(torch.equal(r, model_set[0]) for r in model_set)
    with pytest.raises(ValueError, match="choose one of layer, model"):
        choose_channels(mags, 8, "token")
    with pytest.raises(ValueError, match="use 1 to 95"):
        choose_channels(mags, 96, "layer")
    with pytest.raises(ValueError, match="has no modules"):
        channel_magnitudes(model, ["model.layers.9.mlp.down_proj"], ids)


def test_installed_channels_on_two_ranks(tmp_path):
    model = _model()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model(input_ids=ids, use_cache=False).logits.float()
    calib = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(3))
    chans = dict(zip(NAMES, choose_channels(channel_magnitudes(model, NAMES, calib), 8, "layer")))
    runs = [("plain", None), ("int4", None), ("int4+h32+o8", chans), ("int4+h32", None)]
    res = check_results(run_ranks(wk.channel_forward, 2, str(tmp_path), ids, runs, timeout_s=60, deadline_s=150))
    for a, b in zip(*res):
        assert torch.equal(a, b)
    plain, int4, both, had = res[0]
    torch.testing.assert_close(plain, ref, rtol=1e-5, atol=1e-5)
    err = {k: float((v - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()) for k, v in
           [("int4", int4), ("int4+h32+o8", both), ("int4+h32", had)]}
    assert 0 < err["int4+h32+o8"] < err["int4"] and 0 < err["int4+h32"], err
