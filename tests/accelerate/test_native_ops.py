"""``use_native_ops``: what it swaps, that the model's outputs stay Hugging Face's (the rotary
subclass bit for bit; norms and attention within their rounding), and that the native attention
really runs in decode steps while prefill and padded batches keep sdpa's masks."""

import copy
import pickle
from collections import Counter

import pytest
import torch

from lowbit.kernels.cpu import decode_ops
from lowbit.accelerate import native_ops
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.skipif(decode_ops.library() is None, reason="no C compiler for the native ops")


def _ids(batch=2, seq=12, vocab=512, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _generate(model, ids, mask=None, new=6):
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                             max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences, torch.stack(out.logits)


@pytest.fixture
def counted(monkeypatch):
    """Counts the native attention's calls (``fast``), sdpa's (``sdpa``) and native norms (``norm``)."""
    import transformers.integrations.sdpa_attention as sdpa

    calls = Counter()
    fast, slow, norm = native_ops.attention_decode, sdpa.sdpa_attention_forward, native_ops.rms_norm

    def count_norm(*a, **k):
        out = norm(*a, **k)
        calls["norm" if out is not None else "norm declined"] += 1
        return out

    def count_fast(*a, **k):
        out = fast(*a, **k)
        calls["fast" if out is not None else "declined"] += 1
        return out

    def count_sdpa(*a, **k):
        calls["sdpa"] += 1
        return slow(*a, **k)

    monkeypatch.setattr(native_ops, "attention_decode", count_fast)
    monkeypatch.setattr(native_ops, "rms_norm", count_norm)
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", count_sdpa)
    return calls


def test_swaps_and_keeps_the_state_dict():
    model = tiny_llama(vocab_size=512, layers=3)
    before = model.state_dict()
    counts = native_ops.use_native_ops(model)
    assert counts == {"rope": 3, "norms": 7, "attention": 1}
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert isinstance(model.model.layers[0].input_layernorm, native_ops.NativeRMSNorm)
    assert model.config._attn_implementation == native_ops.ATTENTION
    assert not native_ops.use_native_ops(model)  # a second call finds nothing left to swap
    again = pickle.loads(pickle.dumps(model))  # the swapped classes live at module level
    assert type(again.model.layers[0].self_attn) is native_ops.NativeLlamaAttention
    model.to(torch.bfloat16)  # the norm's weight is the model's own parameter: it follows
    assert model.model.layers[0].input_layernorm.weight.dtype == torch.bfloat16


def test_rotary_subclass_is_hugging_face_bit_for_bit():
    """Only the attention class swapped: prefill (padded) and cached decode give the same bits."""
    stock = tiny_llama(vocab_size=512, layers=2).to(torch.bfloat16)
    swapped = copy.deepcopy(stock)
    from transformers.models.llama.modeling_llama import LlamaAttention

    for mod in swapped.modules():
        if type(mod) is LlamaAttention:
            mod.__class__ = native_ops.NativeLlamaAttention
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    seq_a, scores_a = _generate(stock, ids, mask)
    seq_b, scores_b = _generate(swapped, ids, mask)
    assert torch.equal(seq_a, seq_b) and torch.equal(scores_a, scores_b)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
def test_native_model_generates_like_the_stock_one(dtype, atol, counted):
    stock = tiny_llama(vocab_size=512, layers=2).to(dtype)
    native = copy.deepcopy(stock)
    native_ops.use_native_ops(native)
    ids = _ids()
    seq_a, scores_a = _generate(stock, ids)
    counted.clear()
    seq_b, scores_b = _generate(native, ids)
    # prefill through sdpa (2 layers), then 5 decode steps through the native kernel; all
    # 6 forwards x 5 norms native (the weights are parameters, but generate runs without autograd)
    assert counted == {"sdpa": 2, "fast": 10, "norm": 30}
    assert torch.equal(seq_a, seq_b)
    assert (scores_a - scores_b).abs().max() <= atol * scores_a.abs().max()


def test_padded_batch_keeps_its_mask(counted):
    """A padded batch gets sdpa's masks in every step (the native kernel has no mask), and the
    padding really is masked: the padded row generates what it generates alone."""
    model = tiny_llama(vocab_size=512, layers=2)
    native_ops.use_native_ops(model)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    seq, _ = _generate(model, ids, mask)
    assert counted["sdpa"] == 12 and counted["fast"] == 0 and counted["norm"] == 30
    alone, _ = _generate(model, ids[:1, 4:])
    assert torch.equal(seq[0, 4:], alone[0])


def test_leaves_what_it_does_not_know():
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    gemma = GemmaForCausalLM(cfg).eval()
    counts = native_ops.use_native_ops(gemma)
    assert counts["norms"] == 0 and counts["rope"] == 0  # Gemma's norm is x·(1 + w), its attention its own
    eager = tiny_llama(vocab_size=512, layers=1)
    eager.set_attn_implementation("eager")
    assert native_ops.use_native_ops(eager)["attention"] == 0
    assert eager.config._attn_implementation == "eager"


def test_gemma_still_generates_the_same_with_native_attention():
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(0)
    cfg = GemmaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    stock = GemmaForCausalLM(cfg).eval()
    native = copy.deepcopy(stock)
    assert native_ops.use_native_ops(native)["attention"] == 1
    ids = _ids(vocab=256)
    seq_a, scores_a = _generate(stock, ids)
    seq_b, scores_b = _generate(native, ids)
    assert torch.equal(seq_a, seq_b) and torch.allclose(scores_a, scores_b, atol=1e-4)


def test_a_permuted_native_norm_writes_the_reorder_itself(counted):
    """PermutedNorm over a NativeRMSNorm: one native call, the same bits as the norm then a gather."""
    from lowbit.kernels.channel_order import permute_channels
    from lowbit.nn.permuted_norm import PermutedNorm

    model = tiny_llama(vocab_size=512, layers=1)
    native_ops.use_native_ops(model)
    norm = model.model.layers[0].input_layernorm
    perm = torch.randperm(norm.weight.shape[0], generator=torch.Generator().manual_seed(1))
    x = torch.randn(2, 5, norm.weight.shape[0]).bfloat16()
    with torch.inference_mode():
        norm.bfloat16()
        want = permute_channels(norm(x), perm)
        calls_before = counted["norm"]
        assert torch.equal(PermutedNorm(norm, perm)(x), want)
        assert counted["norm"] == calls_before + 1


@pytest.mark.parametrize("hadamard", [False, True])
def test_decode_over_a_packed_cache_reads_the_codes(hadamard, monkeypatch):
    """With lowbit's packed KV cache, every decode step attends straight from the codes (the
    cache's update, which dequantizes the whole cache, runs only for the prefill), and generate
    gives the stock model's logits over the same packed cache within float32 rounding."""
    from lowbit.nn.kv_cache import PackedKVCache, PackedKVLayer

    stock = tiny_llama(vocab_size=512, layers=2)
    native = copy.deepcopy(stock)
    native_ops.use_native_ops(native)
    ids = _ids()

    def run(model):
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                                 do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                                 cache=PackedKVCache(model.config, bits=4, hadamard=hadamard))
        return out.sequences, torch.stack(out.logits)

    seq_a, scores_a = run(stock)
    updates = Counter()
    update = PackedKVLayer.update
    monkeypatch.setattr(PackedKVLayer, "update", lambda self, *a, **k: (updates.update(["update"]), update(self, *a, **k))[1])
    seq_b, scores_b = run(native)
    assert updates["update"] == 2  # the prefill of each layer; the 5 decode steps of 2 layers read the codes
    assert torch.equal(seq_a, seq_b)
    assert (scores_a - scores_b).abs().max() <= 1e-4 * scores_a.abs().max()
