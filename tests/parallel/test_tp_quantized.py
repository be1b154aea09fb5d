"""W4A4 checkpoints quantized for W ranks (``lowbit quantize --tp W``) run sharded: with plain or
fp all-reduce they give the single-process logits of the same checkpoint; every codec runs; a
checkpoint made for another rank count, or a truncated one, fails clearly before any forward."""

import pytest
import torch
import tp_workers as wk

from lowbit.comm.codecs import CODECS
from lowbit.parallel.launch import check_results, run_ranks
from lowbit.models.shard_plan import TPSplitError
from lowbit.parallel.shard import load_tp_shard
from lowbit.eval.tp import run_tp_eval
from lowbit.errors import CheckpointError
from lowbit.checkpoint import load_quantized, save_quantized
from tests.tiny_models import tiny_model
from lowbit.quantize import TPArgs, get_scheme, quantize_model
from lowbit.formats.scheme import WeightArgs

CALIB = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
IDS = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
# (arch, world, head layout): W=2 splits whole KV groups 2+1 (attention slices 64+32), W=3
# replicates the 2 KV heads (slices 32+32+32); qwen2 adds q/k/v biases (sliced by rows).
CASES = {
    2: ("llama", dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=96)),
    3: ("qwen2", dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96)),
}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    out = {}
    for world, (arch, over) in CASES.items():
        model = tiny_model(arch, seed=1, **over)
        scheme = get_scheme("w4a4-kv4").with_(tensor_parallel=TPArgs(world=world))
        quantize_model(model, scheme, CALIB, progress=False)
        folder = tmp_path_factory.mktemp(f"{arch}-tp{world}") / "q"
        save_quantized(model, folder)
        with torch.inference_mode():
            ref = model(IDS).logits.float()
        out[world] = (folder, ref)
    return out


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_checkpoint_reloads_bit_for_bit(quantized):
    for folder, ref in quantized.values():
        model, _ = load_quantized(folder)
        with torch.inference_mode():
            assert torch.equal(model(IDS).logits, ref)


@pytest.mark.parametrize("world", sorted(CASES))
def test_sharded_quantized_matches_single_process(quantized, world):
    folder, ref = quantized[world]
    reducers = ["plain", *CODECS]
    res = check_results(run_ranks(wk.forward_cases, world, [(str(folder), IDS)], reducers, timeout_s=60, deadline_s=150))
    for other in res[1:]:
        assert all(torch.equal(a, b) for a, b in zip(res[0], other))
    got = dict(zip(reducers, res[0]))
    # the ranks' parts are exactly the single-process parts; only the order of the fp32 sum differs
    torch.testing.assert_close(got["plain"], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["fp"], ref, rtol=1e-5, atol=1e-5)
    for codec in ("int8", "int6", "int4", "int3", "fp4"):
        assert 0 < _rel(got[codec], ref) < 0.7, codec  # the codec bounds of test_tp_forward
    assert _rel(got["int8"], ref) < _rel(got["int4"], ref) < _rel(got["int3"], ref)


def test_rank_count_must_match_the_checkpoint(quantized, monkeypatch):
    import lowbit.eval.tp as tpe

    def no_launch(*a, **k):
        raise AssertionError("ranks were launched")

    monkeypatch.setattr(tpe, "run_here_or_spawn", no_launch)
    folder = str(quantized[2][0])
    with pytest.raises(TPSplitError, match="quantized for 2 tensor-parallel rank"):
        run_tp_eval("ppl", folder, 3, "plain")
    with pytest.raises(TPSplitError, match="--tp 2"):
        load_tp_shard(folder, 0, 3, lambda t: t)


def test_truncated_checkpoint_is_a_clear_error(quantized, tmp_path):
    folder = quantized[2][0]
    for p in folder.iterdir():
        data = p.read_bytes()
        (tmp_path / p.name).write_bytes(data[: len(data) // 2] if p.name == "model.safetensors" else data)
    with pytest.raises(CheckpointError, match="truncated"):
        load_tp_shard(tmp_path, 0, 2, lambda t: t)


def test_a_flipped_byte_in_a_scale_is_caught_on_every_rank(quantized, tmp_path):
    """Each rank reads only its slices, but checks the whole file's SHA-256 first."""
    import json
    import struct

    folder = quantized[2][0]
    for p in folder.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    f = tmp_path / "model.safetensors"
    b = bytearray(f.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    lo = json.loads(b[8:8 + n])["model.layers.0.self_attn.q_proj.wscale"]["data_offsets"][0]
    b[8 + n + lo + 1] ^= 0x7C
    f.write_bytes(bytes(b))
    for rank in (0, 1):
        with pytest.raises(CheckpointError, match="SHA-256 does not match"):
            load_tp_shard(tmp_path, rank, 2, lambda t: t)


# w4a4 and w4a16: a quantized (untied) LM head; w4a4 with lm_head.bits=16: the tied float head, re-tied
@pytest.mark.parametrize("scheme", ["w4a4", "w4a16", "w4a4+float-head"])
def test_float_model_checkpoint_for_one_rank_runs_at_tp1(tmp_path, scheme):
    """A checkpoint quantized without --tp loads as a TP=1 'shard' and equals load_quantized."""
    model = tiny_model("llama", seed=2, tie_word_embeddings=True)
    s = get_scheme(scheme.split("+")[0])
    quantize_model(model, s.with_(lm_head=WeightArgs()) if scheme.endswith("float-head") else s, CALIB, progress=False)
    assert (getattr(model.lm_head, "weight", None) is model.model.embed_tokens.weight) == scheme.endswith("float-head")
    save_quantized(model, tmp_path / "q")
    shard = load_tp_shard(tmp_path / "q", 0, 1, lambda t: t)
    with torch.inference_mode():
        torch.testing.assert_close(shard(input_ids=IDS, use_cache=False).logits, model(IDS).logits, rtol=1e-6, atol=1e-6)
