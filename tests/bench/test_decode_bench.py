"""``lowbit bench decode``: byte accounting helpers, argument errors, and one small real run."""

import json

import pytest
import torch
from transformers import DynamicCache

from lowbit.bench.decode import PeakRSS, kv_bytes
from lowbit.cli import main
from lowbit.kernels import from_float
from lowbit.kernels.cpu import w4a16


def test_kv_bytes_of_dynamic_and_packed_caches():
    from lowbit.nn.kv_cache import PackedKVCache
    from tests.tiny_models import tiny_llama

    cfg = tiny_llama(vocab_size=64).config
    k = torch.randn(2, cfg.num_key_value_heads, 5, cfg.hidden_size // cfg.num_attention_heads)
    dyn, packed = DynamicCache(config=cfg), PackedKVCache(cfg, 4, False)
    for i in range(cfg.num_hidden_layers):
        dyn.update(k, k, i)
        packed.update(k, k, i)
    assert kv_bytes(dyn) == 2 * cfg.num_hidden_layers * k.numel() * 4
    assert kv_bytes(packed) == packed.nbytes() < kv_bytes(dyn) / 4


def test_peak_rss_sees_an_allocation():
    """The sampler records at least the RSS that the process had while a large tensor was alive
    (growth itself is not asserted: the allocator may reuse pages freed by earlier tests)."""
    import time

    import psutil

    with PeakRSS() as mem:
        x = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
        x.add_(1)
        during = psutil.Process().memory_info().rss
        time.sleep(4 * mem.interval)
        del x
    assert mem.peak >= during > 64 << 20


def test_bad_arguments(tmp_path):
    assert main(["bench", "decode", "--formats", "w2a2", "--out", str(tmp_path)]) == 2
    assert main(["bench", "decode", "--new", "1", "--out", str(tmp_path)]) == 2


@pytest.mark.model
def test_decode_small_real_run(tmp_path):
    # w4a16 with RTN quantizes in seconds (the W4A4 presets' clipping search takes minutes on 2 cores)
    rc = main(["bench", "decode", "--formats", "fp32,w4a16,w8a8", "--batches", "2", "--prompt", "8", "--new", "3",
               "--repeats", "1", "--calib", "1x32", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "decode.json").read_text())
    rows = data["rows"]
    assert [r["format"] for r in rows] == ["fp32", "bf16", "w4a16", "w8a8"]  # both float baselines always run
    fp, bf, q, a8 = rows
    best = max((fp, bf), key=lambda r: r["decode_tok_s"])
    assert q["best_float"] == best["format"]
    assert q["decode_vs_best_float"] == pytest.approx(q["decode_tok_s"] / best["decode_tok_s"])
    assert data["meta"]["machine"]["cpu"]["model"]  # every measurement names its CPU
    assert q["kernels"].get(f"w4a16:cpu:{w4a16.default_method(from_float(torch.zeros(16, 128), 'w4a16'))}", 0) > 0  # ran
    # every format, the float baseline too, gets the native norms, rotary and decode attention
    for r in rows:
        assert {k: r["kernels"][k] for k in ("norms", "rope", "attention")} == {"norms": 61, "rope": 30, "attention": 1}
    assert q["layer_weight_vs_fp16"] < 0.3 and fp["layer_weight_vs_fp16"] == pytest.approx(2.0, rel=0.01)
    # fp32 keeps an fp32 cache; the quantized formats, weight-only or not, run everything outside
    # their quantized linears in bf16, as the BF16 baseline does, so their cache is half the size
    assert fp["kv_vs_fp16"] == pytest.approx(2.0) and q["kv_vs_fp16"] == a8["kv_vs_fp16"] == pytest.approx(1.0)
    assert fp["kv_bytes"] == 2 * q["kv_bytes"] == 2 * a8["kv_bytes"]
    assert a8["kernels"].get("w8a8:cpu:gemm", 0) > 0, a8["kernels"]  # its kernels ran, on bf16 activations
    assert all(r["decode_tok_s"] > 0 and r["peak_mem_bytes"] > 0 for r in rows)
    assert (tmp_path / "decode.png").stat().st_size > 0


def test_decode_split_small_real_run(tmp_path):
    """The step split adds up and covers every linear (decoder linears and LM head both timed)."""
    rc = main(["bench", "decode-split", "--formats", "fp32,w4a16", "--prompt", "8", "--new", "3", "--repeats", "1",
               "--calib", "1x32", "--stock-ops", "--out", str(tmp_path)])
    assert rc == 0
    out = json.loads((tmp_path / "decode_split.json").read_text())
    rows = out["rows"]
    assert out["meta"]["stock_ops"] is True
    assert [r["format"] for r in rows] == ["fp32", "w4a16"]
    for r in rows:
        assert r["linears_ms"] > 0 and r["lm_head_ms"] > 0
        assert r["step_ms"] == pytest.approx(r["linears_ms"] + r["lm_head_ms"] + r["rest_ms"])
        assert r["bound_ms"] < r["step_ms"]
    assert main(["bench", "decode-split", "--formats", "w9a9", "--out", str(tmp_path)]) == 2


def test_each_format_decodes_with_its_presets_cache():
    """The -kv4 presets, rotated or not, decode with lowbit's INT4 cache; the others with transformers' own."""
    from transformers import DynamicCache

    from lowbit.bench.decode import FORMATS, _cache_for
    from lowbit.nn.kv_cache import PackedKVCache
    from tests.tiny_models import tiny_model

    model = tiny_model("llama")
    assert {"w4a4-rot", "w4a4-kv4-rot"} <= set(FORMATS)
    for fmt in FORMATS:
        want = PackedKVCache if "kv4" in fmt else DynamicCache
        assert isinstance(_cache_for(model, fmt), want), fmt
