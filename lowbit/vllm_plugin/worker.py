"""One vLLM engine with the lowbit plugin, in its own process: ``python worker.py REQUEST RESULT``.

Runs in the vLLM environment, so it imports the standard library and vLLM only (vLLM loads the
plugin through its entry point). The request is ``{"engines": [...]}``, run one after the other in
this process (the engine core in-process too: one Python start instead of three per engine), each
``{"llm": {...}, "jobs": [...]}`` with ``llm`` the keyword arguments of ``vllm.LLM`` (e.g.
``{"model": DIR, "quantization": "lowbit", "dtype": "float32"}``) and ``jobs``:

- ``{"kind": "nll", "windows": [[ids]...]}``: per window, the summed negative log-likelihood of
  every token after the first (``prompt_logprobs``) and how many tokens that is;
- ``{"kind": "greedy", "prompts": [[ids]...], "max_tokens": N}``: greedy token ids;
- ``{"kind": "decode", "prompts": [[ids]...], "batches": [..], "new": N, "repeats": R}``: per batch,
  seconds of ``LLM.generate`` making 1 token (the prompt) and ``N`` tokens, R times each; the decode
  rate is ``b·(N-1)`` over their difference. With ``"split": true`` also the seconds spent inside
  vLLM's linear layers in each run (:mod:`.linear_timer`; eager engines only).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time


def _rows(rows):
    return [{"prompt_token_ids": [int(t) for t in r]} for r in rows]


def _nll(llm, sp, job):
    outs = llm.generate(_rows(job["windows"]), sp(max_tokens=1, prompt_logprobs=0, temperature=0.0), use_tqdm=False)
    res = {"nll_sum": [], "n_tokens": []}
    for o in outs:
        lps = [lp[t].logprob for t, lp in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:])]
        res["nll_sum"].append(-sum(lps))
        res["n_tokens"].append(len(lps))
    return res


def _greedy(llm, sp, job):
    outs = llm.generate(_rows(job["prompts"]), sp(max_tokens=job["max_tokens"], temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs]}


def _decode(llm, sp, job):
    if job.get("split"):  # lowbit's module, in vLLM's environment: it patches vLLM's linear methods
        from lowbit.vllm_plugin.linear_timer import LinearTimer
    rows = []
    for b in job["batches"]:
        if b > len(job["prompts"]):  # a batch of fewer prompts than it says would time another batch
            raise ValueError(f"decode batch {b} needs {b} prompts, the job gives {len(job['prompts'])}")
        prompts = _rows(job["prompts"][:b])
        llm.generate(prompts, sp(max_tokens=2, temperature=0.0, ignore_eos=True), use_tqdm=False)  # warm
        times, linear = {}, {}
        for n in (1, job["new"]):
            params = sp(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True)
            times[n], linear[n] = [], []
            for _ in range(job["repeats"]):
                timer = LinearTimer() if job.get("split") else None
                t0 = time.perf_counter()
                with timer or contextlib.nullcontext():
                    llm.generate(prompts, params, use_tqdm=False)
                times[n].append(time.perf_counter() - t0)
                linear[n].append(timer.seconds if timer else None)
        row = {"batch": b, "new": job["new"], "prefill_s": times[1], "total_s": times[job["new"]]}
        if job.get("split"):
            row.update(prefill_linear_s=linear[1], total_linear_s=linear[job["new"]])
        rows.append(row)
    return {"rows": rows}


JOBS = {"nll": _nll, "greedy": _greedy, "decode": _decode}


def main(argv: list[str]) -> int:
    req_path, res_path = argv
    with open(req_path) as f:
        req = json.load(f)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # binding fails or fights on a shared VM
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import gc

    import vllm

    result = {"vllm": vllm.__version__, "engines": []}
    for eng in req["engines"]:
        t0 = time.perf_counter()
        try:
            llm = vllm.LLM(seed=0, **{"distributed_executor_backend": "uni", **eng["llm"]})
        except Exception as e:  # a refused checkpoint: its message is the result (keep it last: vLLM may be left half set up)
            result["engines"].append({"error": f"{type(e).__name__}: {e}"})
            continue
        done = {"load_s": time.perf_counter() - t0, "jobs": []}
        for job in eng["jobs"]:
            done["jobs"].append(JOBS[job["kind"]](llm, vllm.SamplingParams, job))
        result["engines"].append(done)
        del llm
        gc.collect()
    with open(res_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(res_path + ".tmp", res_path)  # the caller reads a whole result or none
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
