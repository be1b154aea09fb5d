"""TP-aware quantization (scheme.tensor_parallel.world = W): o_proj and down_proj become one
independent quantized part per rank's input slice, with a permutation inside the slice."""

import pytest
import torch

from lowbit.models.shard_plan import TPSplitError
from tests.tiny_models import tiny_model
from lowbit.nn import QuantLinear, RowShardedLinear
from lowbit.quantize import Scheme, SchemeError, TPArgs, get_scheme, quantize_model
from lowbit.quantize.row_shards import shard_outliers

IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
TEST = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
HEADS = dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=96)  # TP 2: attention 64 + 32


def _tp(name: str, world: int) -> Scheme:
    return get_scheme(name).with_(tensor_parallel=TPArgs(world=world))


def test_permutation_alone_leaves_float_logits_unchanged():
    model = tiny_model("llama", **HEADS)
    with torch.no_grad():
        ref = model(TEST).logits
    quantize_model(model, _tp("w4a4", 2), IDS, progress=False, permute_only=True)
    o = model.model.layers[0].self_attn.o_proj
    assert isinstance(o, RowShardedLinear) and o.splits == [64, 32]
    for mod in (m for m in model.modules() if isinstance(m, RowShardedLinear)):
        for part, width in zip(mod.parts, mod.splits):  # each permutation stays inside its slice
            assert sorted(part.input_perm.tolist()) == list(range(width))
    with torch.no_grad():
        torch.testing.assert_close(model(TEST).logits, ref, rtol=0, atol=2e-5)


def test_outliers_shared_out_by_slice_width():
    model = tiny_model("llama", **HEADS)
    scheme = _tp("w4a4", 2)
    quantize_model(model, scheme, IDS, progress=False)
    layer = model.model.layers[0]
    k = scheme.outliers.k_for(96)
    assert [p.layout.n_outliers for p in layer.self_attn.o_proj.parts] == [shard_outliers(k, 96, 64), shard_outliers(k, 96, 32)]
    down = layer.mlp.down_proj
    assert isinstance(down, RowShardedLinear) and all(isinstance(p, QuantLinear) for p in down.parts)
    assert len(down.splits) == 2 and sum(down.splits) == model.config.intermediate_size
    assert shard_outliers(64, 576, 384) == 43 and shard_outliers(64, 576, 192) == 21  # SmolLM2 at TP 2


def test_tp_aware_w4a4_stays_close_to_plain_w4a4():
    ref_model = tiny_model("llama", **HEADS)
    with torch.no_grad():
        ref = ref_model(TEST).logits
    errs = {}
    for world in (1, 2):
        model = tiny_model("llama", **HEADS)
        quantize_model(model, _tp("w4a4", world), IDS, progress=False)
        with torch.no_grad():
            errs[world] = float((model(TEST).logits - ref).norm() / ref.norm())
    # local groups and outliers cost a little accuracy, not a broken model (errors near 1 would be)
    assert 0 < errs[2] < 2 * errs[1] + 0.02, errs


def test_unsplittable_models_fail_before_quantizing():
    with pytest.raises(TPSplitError, match="no head"):
        quantize_model(tiny_model("llama", **HEADS), _tp("w4a4", 7), IDS, progress=False)
    with pytest.raises(TPSplitError, match="experts of 2 channels"):
        quantize_model(tiny_model("qwen3_moe", moe_intermediate_size=2), _tp("w4a4", 3), IDS, progress=False)


def test_scheme_field_round_trips_and_validates():
    s = _tp("w4a4", 4)
    assert Scheme.from_dict(s.to_dict()) == s
    old = get_scheme("w4a4").to_dict()
    del old["tensor_parallel"]  # checkpoints written before the field existed
    assert Scheme.from_dict(old).tensor_parallel.world == 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(SchemeError, match="tensor_parallel.world"):
            TPArgs(world=bad)
