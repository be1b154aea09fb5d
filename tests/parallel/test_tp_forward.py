"""Sharded tiny models of each family on 2 and 3 gloo ranks: plain all-reduce reproduces the
single-process logits; every codec runs with a bounded error; bad splits fail before launching."""

from pathlib import Path

import pytest
import torch
import tp_workers as wk

from lowbit.comm.codecs import CODECS
from lowbit.parallel.launch import check_results, run_ranks
from lowbit.models.shard_plan import TPSplitError
from lowbit.parallel.shard import load_tp_shard
from lowbit.eval.tp import run_tp_eval
from tests.tiny_models import tiny_model

# head layouts chosen to hit every split path at W=2 and W=3 (see lowbit.models.shard_plan):
ARCHS = {
    "llama": dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=96),  # W=2: KV groups 2+1
    "qwen2": dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96),  # W=3: KV replicated
    "mistral": dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=64),  # W=3: KV expanded
    "gemma": dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=130),  # uneven MLP
}
# Relative RMS error of the logits a codec may cause on these tiny 2-layer models (4 all-reduces
# per forward; the outlier channels of tiny_model make them harsh). Measured maxima over the
# four families at W=2,3: fp 0.003 (fp32 travels as bf16), int8 0.010, int6 0.041, int4 0.18,
# int3 0.34, fp4 0.19; the bounds are about twice that. A broken shard gives errors near 1.4.
CODEC_BOUND = {"fp": 0.01, "int8": 0.03, "int6": 0.1, "int4": 0.4, "int3": 0.7, "fp4": 0.4}
ORDERED = ("fp", "int8", "int6", "int4", "int3")  # fewer bits, more error


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.Tensor, torch.Tensor]]:
    out = {}
    for arch, over in ARCHS.items():
        model = tiny_model(arch, seed=1, **over)
        folder = tmp_path_factory.mktemp(arch)
        model.save_pretrained(folder)
        ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            ref = model(input_ids=ids, use_cache=False).logits.float()
        out[arch] = (folder, ids, ref)
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_matches_single_process(checkpoints, world):
    reducers = ["plain", *CODECS]
    cases = [(str(f), ids) for f, ids, _ in checkpoints.values()]
    res = check_results(run_ranks(wk.forward_cases, world, cases, reducers, timeout_s=60, deadline_s=150))
    for other in res[1:]:  # replicated head + identical sums: every rank has the same logits
        assert all(torch.equal(a, b) for a, b in zip(res[0], other))
    logits = iter(res[0])
    for arch, (_, _, ref) in checkpoints.items():
        plain = next(logits)
        torch.testing.assert_close(plain, ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{arch} W={world}: {m}")
        errs = {codec: _rel(next(logits), ref) for codec in CODECS}
        for codec, err in errs.items():
            assert 0 < err < CODEC_BOUND[codec], (arch, world, codec, err)
        assert [errs[c] for c in ORDERED] == sorted(errs[c] for c in ORDERED), (arch, world, errs)


def test_world_one_is_the_model(checkpoints):
    f, ids, ref = checkpoints["gemma"]
    model = load_tp_shard(f, 0, 1, lambda t: t)
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids, use_cache=False).logits, ref)


def test_unsplittable_fails_before_launch(checkpoints, monkeypatch):
    import lowbit.eval.tp as tpe

    def no_launch(*a, **k):
        raise AssertionError("ranks were launched")

    monkeypatch.setattr(tpe, "run_here_or_spawn", no_launch)
    f = str(checkpoints["llama"][0])
    with pytest.raises(TPSplitError, match="no head"):
        run_tp_eval("ppl", f, 7, "plain")
    with pytest.raises(ValueError, match="unknown all-reduce"):
        run_tp_eval("ppl", f, 2, "int5")
    with pytest.raises(ValueError, match="kind"):
        run_tp_eval("bleu", f, 2, "plain")
    with pytest.raises(ValueError, match="reference model"):
        run_tp_eval("kl", f, 2, "plain", ref="ref.safetensors")
    with pytest.raises(FileNotFoundError):
        run_tp_eval("ppl", str(Path(f) / "missing"), 2, "plain")


def test_missing_tensor_is_a_clear_error(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    f = checkpoints["qwen2"][0]
    for p in f.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    sd = load_file(tmp_path / "model.safetensors")
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(KeyError, match="up_proj"):
        load_tp_shard(tmp_path, 0, 2, lambda t: t)
