"""The architectures people run today (issue 19) on tiny random models built from transformers
configs: every preset quantizes and runs, saves and loads bit for bit, and the KV-cache presets
generate with the INT4 cache; ``--tp 2`` / ``--tp 3`` equal one process with ``plain`` all-reduce
where the heads allow, a clear error naming what is missing where not.

Every preset runs on the four new layouts (Gemma 3 text, Qwen3-MoE, Phi-3, OLMo 2). Gemma 2
has Gemma 3's layout (it differs inside attention: soft-capping, no q/k norms), Llama 3.x (rope
scaling) and Qwen3 have Llama's, on which every preset already runs
(``tests/quantize/test_apply.py``): those three run the path that touches most, w4a4-kv4 (outliers,
GPTQ stage by stage through the INT4 KV cache, generate), and TP. The presets differ in number
formats, not in how they walk a layout, so this keeps the matrix's cost where layouts differ.
"""

import pytest
import torch

from lowbit.checkpoint import load_quantized, save_quantized
from lowbit.models.shard_plan import TPSplitError, make_plan
from lowbit.nn import PermutedNorm, QuantLinear
from lowbit.nn.kv_cache import PackedKVCache
from lowbit.quantize import PRESETS, TPArgs, get_scheme, quantize_model
from tests.tiny_models import tiny_config, tiny_model

NEW_LAYOUTS = ("gemma3_text", "qwen3_moe", "phi3", "olmo2")
SAME_LAYOUT = ("gemma2", "llama3", "qwen3")
CASES = [(a, p) for a in NEW_LAYOUTS for p in sorted(PRESETS)] + [(a, "w4a4-kv4") for a in SAME_LAYOUT]
CALIB = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
TEST = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))  # > Gemma's window of 8
# Relative logit error per preset on these random 2-layer models (1 x 16 calibration tokens).
# Observed maxima over the seven families: kv4 0.18, w8a8 0.031, w4a16 0.46, w4a4(-kv4, -fp4)
# 0.45, w4a4-rtn 0.81, w3a3 and w3a3-rot 0.96 (OLMo 2, whose raw residual stream feeds its linears). A broken
# layout (a permutation applied twice, a norm folded into the wrong linear) gives about 1.4.
BOUND = {"kv4": 0.35, "w8a8": 0.1, "w4a4-rtn": 1.1, "w3a3": 1.2, "w3a3-rot": 1.2}


def _logits(model, ids=TEST):
    with torch.inference_mode():
        return model(ids).logits.float()


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("arch,preset", CASES)
def test_preset_quantizes_runs_and_reloads_bit_for_bit(tmp_path, arch, preset):
    model = tiny_model(arch)
    ref = _logits(model)
    scheme = get_scheme(preset)
    quantize_model(model, scheme, CALIB, progress=False)
    got = _logits(model)
    assert torch.isfinite(got).all()
    assert 0 < _rel(got, ref) < BOUND.get(preset, 0.6), _rel(got, ref)
    if scheme.weights.enabled:
        assert any(isinstance(m, QuantLinear) for m in model.modules())
    folder = save_quantized(model, tmp_path / "q")
    loaded, _ = load_quantized(folder)
    assert torch.equal(_logits(loaded), got)
    if scheme.kv_cache.enabled:
        _generate_with_int4_cache(loaded)
    if preset == "w4a4":  # the fast kernels (q/k/v or gate/up in one call, OLMo 2's shared input permutation)
        from lowbit.checkpoint import load_model

        fast, _ = load_model(str(folder), kernel="cpu")
        assert fast.lowbit_kernels and not fast.lowbit_kernels.get("kept_reference")
        # the bound of tests/accelerate/test_load_model_kernels.py: same codes, float sums reordered
        torch.testing.assert_close(_logits(fast), got, rtol=0, atol=1e-4 * float(got.abs().max()))


def _generate_with_int4_cache(model):
    """Greedy decoding through the packed INT4 cache past the sliding window attends to what a
    full forward over the same tokens attends to (per-token codes do not depend on chunking)."""
    prompt = TEST[:1, :10]
    out = model.generate(prompt, max_new_tokens=6, do_sample=False, return_dict_in_generate=True,
                         output_logits=True, pad_token_id=0)
    seq = out.sequences
    assert seq.shape == (1, 16)
    full = _logits(model, seq)
    steps = torch.stack([lg[0].float() for lg in out.logits])
    torch.testing.assert_close(steps, full[0, 9:15], rtol=1e-4, atol=1e-4)
    assert torch.equal(seq[0, 10:], full[0, 9:15].argmax(-1))


@pytest.mark.parametrize("arch", NEW_LAYOUTS + SAME_LAYOUT)
def test_the_reorder_alone_keeps_the_float_model(arch):
    """The outlier permutation alone (float weights) computes the same function: folded into the
    norm that feeds each group, or, where no norm does (OLMo 2), applied by each linear."""
    model = tiny_model(arch)
    ref = _logits(model)
    quantize_model(model, get_scheme("w4a4"), CALIB, progress=False, permute_only=True)
    norms = sum(isinstance(m, PermutedNorm) for m in model.modules())
    own = sum(isinstance(m, QuantLinear) and m.input_perm is not None for m in model.modules())
    layers = model.config.num_hidden_layers
    if arch == "olmo2":  # q/k/v and gate/up read the residual stream: no norm to carry the reorder
        assert norms == 0 and own == 7 * layers
    else:
        assert norms == 2 * layers and own >= 2 * layers
    torch.testing.assert_close(_logits(model), ref, rtol=0, atol=2e-5 * float(ref.abs().max()) + 1e-6)


# gemma3_text with 3 query heads on its one KV head: W=2 and W=3 both replicate the KV head;
# olmo2's 4 heads on 2 KV heads: W=3 holds KV head 1 on two ranks, which its k norm counts once;
# qwen3_moe: 4 experts of 64 rows (22 + 21 + 21 at W=3) and a dense layer of 128; mixtral: its
# checkpoint stores experts under other names (block_sparse_moe.experts.e.w1/w3/w2)
TP_ARCHS = {"gemma2": {}, "gemma3_text": dict(num_attention_heads=3, hidden_size=96), "phi3": {}, "llama3": {},
            "qwen3": {}, "olmo2": {}, "qwen3_moe": {}, "mixtral": {}}


def _tp_archs(world: int) -> list[str]:
    return [a for a, over in TP_ARCHS.items()
            if over.get("num_attention_heads", tiny_config(a).num_attention_heads) >= world]


@pytest.fixture(scope="module")
def float_checkpoints(tmp_path_factory):
    """{arch: (folder, reference logits)} of the float models, saved once for both worlds."""
    out = {}
    for arch, over in TP_ARCHS.items():
        model = tiny_model(arch, seed=1, **over)
        folder = tmp_path_factory.mktemp(f"{arch}-float")
        model.save_pretrained(folder)
        out[arch] = (folder, _logits(model))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_tp_equals_one_process_with_plain_all_reduce(float_checkpoints, tmp_path, world):
    """Every architecture's float model and its W4A4 checkpoint quantized for ``world`` ranks
    (``lowbit quantize --tp W``), sharded, give the single-process logits. One launch of the
    ranks per world runs every case: starting processes, not the tiny forwards, is the cost."""
    from lowbit.parallel.launch import check_results, run_ranks
    from tests.parallel.tp_workers import forward_cases

    cases = []
    for arch in _tp_archs(world):
        folder, ref = float_checkpoints[arch]
        q = tiny_model(arch, seed=1, **TP_ARCHS[arch])
        scheme = get_scheme("w4a4").with_(gptq=get_scheme("w4a4-rtn").gptq, tensor_parallel=TPArgs(world=world))
        quantize_model(q, scheme, CALIB, progress=False)
        cases += [(f"{arch} float", folder, ref),
                  (f"{arch} w4a4 tp{world}", save_quantized(q, tmp_path / arch), _logits(q))]
    assert len(cases) >= 14  # every architecture but gemma2 (2 heads) at W=3
    res = check_results(run_ranks(forward_cases, world, [(str(f), TEST) for _, f, _ in cases], ["plain"],
                                  timeout_s=120, deadline_s=280))
    for other in res[1:]:
        assert all(torch.equal(a, b) for a, b in zip(res[0], other))
    for (name, _, ref), got in zip(cases, res[0]):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} W={world}: {m}")


@pytest.mark.parametrize("arch,world,over,what", [
    ("gemma2", 3, {}, "cannot split 2 attention heads over 3 ranks"),
    ("qwen3_moe", 3, dict(moe_intermediate_size=2), "cannot split experts of 2 channels over 3 ranks"),
])
def test_what_tp_cannot_split_is_named_before_any_work(arch, world, over, what):
    with pytest.raises(TPSplitError, match=what):
        make_plan(tiny_config(arch, **over), world)
    with pytest.raises(TPSplitError, match=what):
        quantize_model(tiny_model(arch, **over), get_scheme("w4a4-rtn").with_(tensor_parallel=TPArgs(world=world)),
                       CALIB, progress=False)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text", "phi3", "olmo2"])
def test_rotation_refuses_what_it_cannot_rotate_by_name(arch):
    from lowbit.formats.scheme import RotationArgs
    from lowbit.quantize.rotation import RotationError, rotate_model

    model = tiny_model(arch)
    with pytest.raises(RotationError, match=f"rotation does not support model_type={arch!r}: it"):
        rotate_model(model, RotationArgs(kind="hadamard"))


@pytest.mark.parametrize("arch", ["qwen3_moe", "llama3"])
def test_rotation_keeps_the_function_where_it_applies(arch):
    from lowbit.formats.scheme import RotationArgs
    from lowbit.quantize.rotation import rotate_model

    model = tiny_model(arch)
    ref = _logits(model)
    rotate_model(model, RotationArgs(kind="hadamard"))
    torch.testing.assert_close(_logits(model), ref, rtol=0, atol=2e-5 * float(ref.abs().max()))


def test_sliding_window_layers_keep_their_window_in_the_packed_cache():
    """A cache over more tokens than Gemma 3's window gives the no-cache forward's logits (both
    through the packed KV), so the sliding layers' mask is applied over the stored codes."""
    model = tiny_model("gemma3_text")
    from lowbit.nn.kv_cache import install_kv_quantization

    install_kv_quantization(model, 4)
    ids = TEST[:1]
    full = _logits(model, ids)
    cache = PackedKVCache(model.config, 4)
    with torch.inference_mode():
        a = model(ids[:, :12], cache=cache, use_cache=True).logits
        b = model(ids[:, 12:], cache=cache, use_cache=True).logits
    torch.testing.assert_close(torch.cat([a, b], 1).float(), full, rtol=1e-4, atol=1e-4)


def _float_cache_logits(model, seq, prefill):
    """Logits of transformers' own float cache (a sliding layer keeps only its window) fed ``seq``
    as generate feeds it: the prompt, then one token per step."""
    from transformers import DynamicCache

    cache, out = DynamicCache(config=model.config), []
    with torch.inference_mode():
        out.append(model(seq[:, :prefill], past_key_values=cache, use_cache=True).logits[0, -1])
        for t in range(prefill, seq.shape[1] - 1):
            out.append(model(seq[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0, -1])
    return torch.stack(out).float()


@pytest.mark.parametrize("arch,over", [("gemma3_text", {}), ("gemma2", {}), ("mistral", dict(sliding_window=8))])
def test_generate_with_the_packed_cache_keeps_the_sliding_window(arch, over):
    """generate() through the packed cache over three windows of tokens is transformers' windowed
    float model up to the KV codes' error: close with INT8 codes, and with INT4 far closer to it
    than to the same weights without a window (a cache that let sliding layers see every stored
    token would be as far from it as that). Observed on these seeds: INT8 0.005-0.010, INT4
    0.08-0.17 from the windowed float logits; INT4 0.59-0.75 from the unwindowed ones."""
    model = tiny_model(arch, **over)
    unwindowed = tiny_model(arch, **{**over, "sliding_window": 4096})
    prompt = TEST[:1, :10]
    for bits, bound in ((8, 0.03), (4, 0.3)):
        out = model.generate(prompt, max_new_tokens=14, do_sample=False, return_dict_in_generate=True,
                             output_logits=True, pad_token_id=0, past_key_values=PackedKVCache(model.config, bits))
        seq = out.sequences
        assert seq.shape == (1, 24) and seq.shape[1] > 2 * model.config.sliding_window
        steps = torch.stack([lg[0].float() for lg in out.logits])
        windowed = _rel(steps, _float_cache_logits(model, seq, 10))
        assert windowed < bound, (bits, windowed)
        if bits == 4:
            assert _rel(steps, _float_cache_logits(unwindowed, seq, 10)) > 2 * windowed


def test_an_unknown_model_type_is_named_with_what_is_missing():
    from lowbit.models.adapters import UnsupportedArchitectureError

    model = tiny_model("llama")
    model.config.model_type = "olmoe"
    with pytest.raises(UnsupportedArchitectureError, match="model_type='olmoe': its layers, norms and linears are not described"):
        quantize_model(model, get_scheme("w4a4"), CALIB, progress=False)


def test_a_fused_projection_is_split_by_its_parts():
    """Phi-3's q|k|v rows: rank 1 of 3 keeps query head 2 and KV head 1 of each of k and v; its
    gate|up rows: the same MLP rows of both halves."""
    from lowbit.models.shard_plan import column_rows, row_columns

    plan = make_plan(tiny_config("phi3"), 3)  # 4 heads of 16 over 2 KV heads, MLP 128 = 43 + 43 + 42
    assert column_rows(plan, 1) == {"self_attn.qkv_proj": [(32, 48), (80, 96), (112, 128)],
                                    "mlp.gate_up_proj": [(43, 86), (171, 214)]}
    assert row_columns(plan, 1) == {"self_attn.o_proj": (32, 48), "mlp.down_proj": (43, 86)}
