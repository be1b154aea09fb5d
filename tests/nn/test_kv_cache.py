import torch

from lowbit.formats import PerToken, choose_qparams
from lowbit.formats.affine import in_range
from tests.tiny_models import tiny_model
from lowbit.nn import PackedKVCache, install_kv_quantization
from lowbit.nn.kv_cache import PackedKV


def test_packed_kv_per_element_bound_any_head_dim():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 24) * 3 + 1  # head_dim 24: not a power of two
    kv = PackedKV(4, symmetric=False)
    kv.append(x[:, :, :6])
    kv.append(x[:, :, 6:])
    got = kv.dequantize(torch.float32)
    qp = choose_qparams(x, 4, symmetric=False, granularity=PerToken(), scale_dtype=torch.float16)
    step = qp.scale.float().reshape(2, 3, 10, 1)
    err = (got - x).abs()
    inside = in_range(x, qp)
    assert (err[inside] <= (step.expand_as(x)[inside] / 2) * (1 + 1e-3)).all()
    assert (err <= step * (1 + 1e-3)).all()
    assert kv.codes.shape == (2, 3, 10, 12) and kv.codes.dtype == torch.uint8
    assert kv.nbytes() < x.numel() * 2 / 3  # vs fp16: 4-bit codes + fp16 scale + u8 zero per token-head


def test_generate_with_packed_cache_and_close_logits():
    model = tiny_model("llama")
    ids = torch.randint(0, 128, (1, 12))
    with torch.no_grad():
        ref = model(ids).logits
        cache = PackedKVCache(model.config, bits=8)
        q8 = model(ids, cache=cache).logits
        assert cache.get_seq_length() == 12 and cache.nbytes() > 0
    assert (q8 - ref).abs().max() < 0.05 * ref.abs().max()
    out = model.generate(ids, max_new_tokens=5, do_sample=False, cache=PackedKVCache(model.config, bits=4))
    assert out.shape == (1, 17)


def test_installed_kv_quantization_changes_plain_forward_and_generate_runs():
    model = tiny_model("qwen2")
    ids = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        ref = model(ids).logits
        install_kv_quantization(model, bits=4)
        q = model(ids).logits
    assert not torch.equal(ref, q) and (q - ref).abs().max() < ref.abs().max()
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, 14)
