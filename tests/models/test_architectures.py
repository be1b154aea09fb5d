"""One description per architecture: the quantizer's adapter and the shard plan read the same
entry; qwen3 (per-head q/k norms) splits over 2 ranks exactly; what is missing is named."""

import pytest
import torch
from torch import nn

from lowbit.models.adapters import get_adapter
from lowbit.models.module_paths import get_path
from lowbit.models.architectures import ARCHITECTURES, UnsupportedArchitectureError, architecture, tp_types
from lowbit.models.shard_plan import TPSplitError, make_plan, row_parallel_splits


def tiny_qwen3(seed: int = 1):
    """A random 2-layer Qwen3 (6 query heads over 2 KV heads, head_dim 16 != hidden/heads)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.normal_(1.0, 0.1)
    return model


def test_every_entry_names_real_modules_of_its_model():
    from tests.tiny_models import RECENT_ARCHS, TINY_ARCHS, tiny_model

    tested = set()
    for name in TINY_ARCHS + RECENT_ARCHS:
        model = tiny_model(name)
        mt = model.config.model_type
        tested.add(mt)
        ad = get_adapter(model)
        ad.prepare(model)
        arch = architecture(mt)
        for layer in ad.layers(model):
            dense = () if ad.has_experts(layer) else (*arch.mlp_in, arch.mlp_out)
            for p in (*arch.attention, arch.attention_out, *dense):
                assert isinstance(get_path(layer, p), nn.Linear), (mt, p)
            for p in (arch.input_norm, arch.mlp_norm):
                assert p is None or get_path(layer, p).weight.dim() == 1
            for g in ad.groups(layer):
                for p in g.linears:
                    assert isinstance(get_path(layer, p), nn.Linear), (mt, p)
    assert tested == set(ARCHITECTURES)  # every entry has a tiny model


def test_shard_plan_and_adapter_read_one_list():
    assert set(tp_types()) == set(ARCHITECTURES)
    assert "qwen3" in tp_types()
    model = tiny_qwen3()
    assert get_adapter(model).model_type == "qwen3"
    splits = row_parallel_splits(model.config, 2)
    assert splits == {"self_attn.o_proj": [48, 48], "mlp.down_proj": [48, 48]}  # 3 heads x 16 each


def test_unsupported_names_the_model_type_and_what_is_missing(monkeypatch):
    from dataclasses import replace

    from tests.tiny_models import tiny_config

    missing = "its attention keeps a state the shard plan does not split"  # an entry that says what TP lacks
    monkeypatch.setitem(ARCHITECTURES, "mixtral", replace(ARCHITECTURES["mixtral"], tp_missing=missing))
    with pytest.raises(TPSplitError, match=f"model_type='mixtral': {missing}"):
        make_plan(tiny_config("mixtral"), 2)

    class Cfg:
        model_type = "gpt2"

    with pytest.raises(UnsupportedArchitectureError, match="model_type='gpt2'"):
        make_plan(Cfg(), 2)


def test_qwen3_two_ranks_equal_single_process(tmp_path):
    from lowbit.parallel.launch import check_results, run_ranks
    from tests.parallel.tp_workers import forward_cases

    model = tiny_qwen3()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model(input_ids=ids, use_cache=False).logits.float()
    res = check_results(run_ranks(forward_cases, 2, [(str(tmp_path), ids)], ["plain"], timeout_s=60, deadline_s=150))
    assert torch.equal(res[0][0], res[1][0])
    torch.testing.assert_close(res[0][0], ref, rtol=1e-5, atol=1e-5)
