import pytest
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


def test_hadamard_kv_is_the_quantizer_on_rotated_heads_rotated_back():
    from lowbit.formats import dequantize, quantize
    from lowbit.formats.hadamard import orthonormal

    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 24)  # head_dim 24 = 2 x 12: a Paley factor, not a power of two
    kv = PackedKV(4, symmetric=False, hadamard=True)
    kv.append(x[:, :, :4])
    kv.append(x[:, :, 4:])
    r = orthonormal(24, torch.float64)
    y = (x.double() @ r).float()
    qp = choose_qparams(y, 4, symmetric=False, granularity=PerToken(), scale_dtype=torch.float16)
    want = (dequantize(quantize(y, qp), qp, torch.float64) @ r.T).float()
    # the stored codes are the rotated tensor's: only the float32 rotations differ from float64
    torch.testing.assert_close(kv.dequantize(torch.float32), want, rtol=0, atol=1e-5 * float(x.abs().max()))


def test_hadamard_kv_spreads_a_large_channel():
    """RoPE leaves a few channels of each key head far larger than the rest; unrotated they set
    every token's scale and bury the others."""
    torch.manual_seed(1)
    x = torch.randn(1, 2, 64, 64)
    x[..., 3] *= 40
    errs = {}
    for h in (False, True):
        kv = PackedKV(4, symmetric=False, hadamard=h)
        kv.append(x)
        errs[h] = float((kv.dequantize(torch.float32) - x)[..., 4:].pow(2).mean().sqrt())
    assert errs[True] < 0.5 * errs[False], errs


def test_hadamard_kv_needs_a_known_order_and_a_quantized_cache():
    import pytest

    from lowbit.formats.hadamard import HadamardSizeError
    from lowbit.formats.scheme import KVArgs, SchemeError

    model = tiny_model("llama")
    model.config.head_dim = 22  # 2 x 11: no Hadamard matrix of order 11 is known
    PackedKVCache(model.config, bits=4)
    with pytest.raises(HadamardSizeError, match="22"):
        PackedKVCache(model.config, bits=4, hadamard=True)
    with pytest.raises(HadamardSizeError, match="22"):
        install_kv_quantization(model, bits=4, hadamard=True)
    with pytest.raises(SchemeError, match="kv_cache.bits < 16"):
        KVArgs(bits=16, hadamard=True)
    with pytest.raises(SchemeError, match="true or false"):
        KVArgs(bits=4, hadamard="yes")


def test_hadamard_kv_keeps_generate_equal_to_a_full_forward():
    model = tiny_model("llama")
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(2))
    install_kv_quantization(model, bits=4, hadamard=True)
    out = model.generate(ids, max_new_tokens=5, do_sample=False, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        full = model(out.sequences).logits
    steps = torch.stack([lg[0] for lg in out.logits])
    torch.testing.assert_close(steps, full[0, 11:16], rtol=1e-4, atol=1e-4)


def test_kv_groups_are_the_quantizer_on_each_group_and_the_whole_head_by_default():
    """kv_cache.group_size: every g values of a head get their own scale and zero point; the
    stored codes are those of the per-row quantizer on [.., T·D/g, g]; g = D is today's cache, bit for bit."""
    from lowbit.formats import dequantize, quantize

    torch.manual_seed(1)
    x = torch.randn(2, 3, 7, 32) * torch.linspace(0.1, 8, 32)  # a wide channel range inside each head
    for sym in (False, True):
        kv = PackedKV(4, symmetric=sym, group=8)
        kv.append(x[:, :, :3])
        kv.append(x[:, :, 3:])
        xg = x.reshape(2, 3, 7 * 4, 8)
        qp = choose_qparams(xg, 4, symmetric=sym, granularity=PerToken(), scale_dtype=torch.float16)
        assert torch.equal(kv.dequantize(torch.float32), dequantize(quantize(xg, qp), qp, torch.float32).reshape(x.shape))
        assert kv.scale.shape == (2, 3, 28) and kv.codes.shape == (2, 3, 28, 4)
        whole, same = PackedKV(4, symmetric=sym), PackedKV(4, symmetric=sym, group=32)
        whole.append(x)
        same.append(x)
        assert torch.equal(whole.dequantize(torch.float32), same.dequantize(torch.float32))
        assert torch.equal(whole.codes, same.codes)
        # finer groups: no larger error (each group's range is inside its head's)
        assert (kv.dequantize(torch.float32) - x).abs().mean() < (whole.dequantize(torch.float32) - x).abs().mean()
    rot = PackedKV(4, symmetric=False, hadamard=True, group=8)  # Hadamard over the head, then groups
    rot.append(x)
    assert (rot.dequantize(torch.float32) - x).abs().max() < x.abs().max()


def test_kv_groups_run_in_generate_and_refuse_a_group_that_does_not_divide_head_dim():
    import pytest

    from lowbit.formats.scheme import KVArgs, SchemeError

    model = tiny_model("llama")
    hd = model.config.hidden_size // model.config.num_attention_heads
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        ref = model(ids).logits
        install_kv_quantization(model, bits=4, hadamard=False, group=hd // 2)
        q = model(ids).logits
    assert not torch.equal(ref, q) and (q - ref).abs().max() < ref.abs().max()
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape == (2, 12)
    with pytest.raises(ValueError, match=f"does not divide the model's head_dim {hd}"):
        PackedKVCache(model.config, bits=4, group=hd + 1)
    for bad in (1, -2, True, 2.5):
        with pytest.raises(SchemeError, match="group_size"):
            KVArgs(bits=4, group_size=bad)


_KV_IN_OTHER_ENV = """
import sys, torch
from transformers import AutoModelForCausalLM
from lowbit.nn import PackedKVCache
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
ids = torch.load(sys.argv[2])
with torch.no_grad():
    cache = PackedKVCache(model.config, bits=4)
    out = model(ids, past_key_values=cache).logits[:, -1:]
    step = model(out.argmax(-1), past_key_values=cache).logits
assert cache.get_seq_length() == ids.shape[1] + 1
torch.save(torch.cat([out, step], 1), sys.argv[3])
"""


def test_packed_cache_runs_under_vllms_older_transformers(tmp_path):
    """vLLM's CPU build pins transformers 5.19, which lacks the quantized-layer base class of 5.2x:
    the CLI starts there and the packed cache gives this environment's logits."""
    import subprocess

    import pytest

    from lowbit.bench.vllm_engine import VLLMUnavailable, find_python

    try:
        python = find_python()
    except VLLMUnavailable as e:
        pytest.skip(str(e))
    cli = subprocess.run([python, "-m", "lowbit", "--help"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(0, 128, (2, 9))
    torch.save(ids, tmp_path / "ids.pt")
    run = subprocess.run([python, "-c", _KV_IN_OTHER_ENV, str(tmp_path / "m"), str(tmp_path / "ids.pt"), str(tmp_path / "out.pt")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    with torch.no_grad():
        cache = PackedKVCache(model.config, bits=4)
        out = model(ids, cache=cache).logits[:, -1:]
        step = model(out.argmax(-1), cache=cache).logits
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), torch.cat([out, step], 1), rtol=1e-4, atol=1e-5)


def test_power_of_two_heads_rotate_by_the_butterfly_both_ways():
    """A head of 2^k values is rotated by ``fast_transform`` (C or torch: the same bits), and read
    back by the same butterfly (the Sylvester Hadamard is symmetric): what the one-call decode
    step repeats in C."""
    from lowbit.formats import dequantize, quantize
    from lowbit.formats.hadamard import fast_transform

    torch.manual_seed(4)
    x = torch.randn(2, 3, 10, 64).bfloat16()
    kv = PackedKV(4, symmetric=False, hadamard=True)
    kv.append(x)
    y = fast_transform(x.float())
    qp = choose_qparams(y, 4, symmetric=False, granularity=PerToken(), scale_dtype=torch.float16)
    assert torch.equal(kv.scale, qp.scale.reshape(2, 3, 10))
    want = fast_transform(dequantize(quantize(y, qp), qp, torch.float32)).bfloat16()
    assert torch.equal(kv.dequantize(torch.bfloat16), want)


@pytest.mark.parametrize("hadamard,group", [(True, 0), (False, 16)])
def test_decode_step_in_one_call_is_its_steps_as_the_cache_grows(hadamard, group, monkeypatch):
    """``attend_one`` by one native call (``kv_decode_step``) against the same layer taking its
    steps one by one: the same outputs, codes, scales and zero points, bit for bit, over 300 steps
    (the buffers grow at 261 positions), with the positions counted alike."""
    from lowbit.kernels.cpu import kv_packed
    from lowbit.nn.kv_cache import PackedKVLayer

    if kv_packed.library() is None:
        pytest.skip("no C compiler for the native ops")
    torch.manual_seed(5)
    one, steps = PackedKVLayer(4, False, hadamard, group), PackedKVLayer(4, False, hadamard, group)
    k, v = torch.randn(1, 2, 5, 64).bfloat16(), torch.randn(1, 2, 5, 64).bfloat16()
    one.update(k, v), steps.update(k, v)
    calls = []
    real = kv_packed.kv_decode_step
    for _ in range(300):
        q, kn, vn = torch.randn(1, 4, 1, 64).bfloat16(), torch.randn(1, 2, 1, 64).bfloat16(), torch.randn(1, 2, 1, 64).bfloat16()
        monkeypatch.setattr(kv_packed, "kv_decode_step", lambda *a, **kw: calls.append(real(*a, **kw)) or calls[-1])
        a = one.attend_one(q, kn, vn, 0.125)
        monkeypatch.setattr(kv_packed, "kv_decode_step", lambda *a, **kw: None)
        b = steps.attend_one(q, kn, vn, 0.125)
        assert torch.equal(a, b)
    assert all(c is not None for c in calls) and len(calls) == 300
    assert one.get_seq_length() == steps.get_seq_length() == 305
    for x, y in ((one._quantized_keys, steps._quantized_keys), (one._quantized_values, steps._quantized_values)):
        assert torch.equal(x.codes, y.codes) and torch.equal(x.scale, y.scale) and torch.equal(x.zero, y.zero)
    assert one.nbytes() == steps.nbytes()


def test_a_cache_refuses_states_of_another_batch():
    kv = PackedKV(4, symmetric=False)
    kv.append(torch.randn(1, 2, 3, 16))
    with pytest.raises(ValueError, match="batch x heads"):
        kv.append(torch.randn(4, 2, 1, 16))  # would have broadcast the stored rows into 4 sequences


def test_a_failed_first_append_leaves_no_layout_behind():
    """A prefill that raises before anything is stored (NaN) must not fix the buffers' batch: the
    next states, of another batch, are stored as they are, not broadcast into the failed one's."""
    kv = PackedKV(4, symmetric=False)
    bad = torch.randn(4, 2, 3, 16)
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        kv.append_read(bad, torch.float32)
    x = torch.randn(1, 2, 3, 16)
    kv.append(x)
    assert kv.rows == 3 and tuple(kv.codes.shape[:3]) == (1, 2, 3)
    assert kv.dequantize(torch.float32).shape == x.shape


@pytest.mark.parametrize("step", ["attend_one", "update"])
def test_values_that_raise_take_the_keys_new_rows_back(step, monkeypatch):
    """Keys and values are stored together or not at all: new values with a NaN raise after the
    keys went in; the keys' rows are dropped again and the positions are not counted, so the next
    step stores, attends and counts as if the failed one had never been called."""
    from lowbit.nn.kv_cache import PackedKVLayer

    torch.manual_seed(7)
    a, b = PackedKVLayer(4, False, True), PackedKVLayer(4, False, True)
    k, v = torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64)
    a.update(k, v), b.update(k, v)
    vbad = torch.randn(1, 2, 1, 64)
    vbad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        if step == "update":
            a.update(torch.randn(1, 2, 1, 64), vbad)
        else:
            a.attend_one(torch.randn(1, 4, 1, 64), torch.randn(1, 2, 1, 64), vbad, 0.125)
    assert a.get_seq_length() == 5 and a._quantized_keys.rows == a._quantized_values.rows == b._quantized_keys.rows
    q, kn, vn = torch.randn(1, 4, 1, 64), torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64)
    assert torch.equal(a.attend_one(q, kn, vn, 0.125), b.attend_one(q, kn, vn, 0.125))
    assert a.get_seq_length() == b.get_seq_length() == 6


def test_reorder_cache_selects_sequences_and_keeps_appending():
    """Beam search's reorder: the stored codes of the chosen sequences, in the new order; the
    buffers keep their room, so the next decode steps append (and attend) as before."""
    from lowbit.nn.kv_cache import PackedKVLayer

    torch.manual_seed(6)
    layer = PackedKVLayer(4, False, True)
    k, v = torch.randn(3, 2, 6, 64), torch.randn(3, 2, 6, 64)
    keys, values = layer.update(k, v)
    layer.reorder_cache(torch.tensor([2, 0, 0]))
    assert torch.equal(layer._quantized_keys.dequantize(torch.float32), keys[[2, 0, 0]])
    assert torch.equal(layer._quantized_values.dequantize(torch.float32), values[[2, 0, 0]])
    q, kn, vn = torch.randn(3, 4, 1, 64), torch.randn(3, 2, 1, 64), torch.randn(3, 2, 1, 64)
    out = layer.attend_one(q, kn, vn, 0.125)
    ref = PackedKVLayer(4, False, True)
    ref.update(k[[2, 0, 0]], v[[2, 0, 0]])
    assert torch.equal(out, ref.attend_one(q, kn, vn, 0.125)) and layer.get_seq_length() == 7


@pytest.mark.parametrize("bits,symmetric", [(2, False), (3, False), (3, True), (4, True)])
def test_caches_the_native_calls_do_not_take_still_work(bits, symmetric):
    """2- and 3-bit codes and symmetric caches take the torch steps for prefill and decode alike."""
    from lowbit.nn.kv_cache import PackedKVLayer

    torch.manual_seed(bits)
    layer = PackedKVLayer(bits, symmetric, True)
    k, v = torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64)
    keys, _ = layer.update(k, v)
    assert keys.shape == k.shape and (keys - k).abs().mean() < k.abs().mean()
    out = layer.attend_one(torch.randn(1, 4, 1, 64), torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64), 0.125)
    assert out is None or out.shape == (1, 1, 4, 64)
    keys, _ = layer.update(torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64))
    assert keys.shape == (1, 2, 6 + (out is not None), 64)
