"""Greedy decoding with the KV cache, timed: on one process (the reference) and on W
tensor-parallel ranks that sum their row-parallel outputs with plain or quantized all-reduce.

Every decode step feeds one token per sequence, so each all-reduce carries only
``batch x hidden`` values (2.3 KiB per sequence for SmolLM2's 576 fp32 channels) and a step makes
2 all-reduces per layer: decode under TP is bound by collective *latency*, not bandwidth.
``decode_rank`` therefore also times the reducer alone on a message of exactly that size and
counts the all-reduces of one step, so a table can say where a step's time goes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lowbit.parallel.layers import ALLREDUCE_CHOICES, make_reducer, parse_allreduce, set_reducer

# "none" skips communication entirely: wrong sums, but the step time is the TP compute floor.
# Every codec also takes +h / +oN (one outlier set for the model here: one reducer serves all layers).
DECODE_METHODS = ("none", *ALLREDUCE_CHOICES)


def parse_method(method: str) -> str:
    """"none", "plain" or a codec spec's canonical name; ValueError naming the choices."""
    return method if method == "none" else parse_allreduce(method)
POLICIES = ("auto", "quantize")


@dataclass
class GreedyRun:
    tokens: torch.Tensor  # [B, n_new] int64, the generated tokens
    prefill_s: float  # the prompt forward, which also yields the first new token
    decode_s: float  # the n_new - 1 one-token steps
    step_s: list[float]  # each one-token step's time (their sum is within timer overhead of decode_s)


def check_prompt(ids: torch.Tensor, n_new: int, min_new: int = 1) -> None:
    """Prompt ids must be a non-empty int64 [batch, tokens] tensor and ``n_new >= min_new``."""
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"prompt ids must be a non-empty [batch, tokens] tensor, got shape {tuple(ids.shape)}")
    if ids.dtype != torch.long:
        raise TypeError(f"prompt ids must be int64 token ids, got {ids.dtype}")
    if n_new < min_new:
        raise ValueError(f"n_new must be >= {min_new}, got {n_new}")


def greedy_decode(model, ids: torch.Tensor, n_new: int, after_prefill: Callable[[], None] | None = None) -> GreedyRun:
    """Greedy generation of ``n_new`` tokens after the prompt ``ids`` [B, T] (no padding), with
    the model's KV cache: one prompt forward, then ``n_new - 1`` forwards of one token each."""
    check_prompt(ids, n_new)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1)
        t1 = time.perf_counter()
        if after_prefill is not None:
            after_prefill()
        t1b = time.perf_counter()
        cache, toks, steps, last = out.cache, [nxt], [], t1b
        for _ in range(n_new - 1):
            out = model(input_ids=nxt[:, None], cache=cache, use_cache=True, logits_to_keep=1)
            cache, nxt = out.cache, out.logits[:, -1].argmax(-1)
            toks.append(nxt)
            now = time.perf_counter()
            steps.append(now - last)
            last = now
        t2 = time.perf_counter()
    return GreedyRun(torch.stack(toks, 1), t1 - t0, t2 - t1b, steps)


def lockstep_decode(model, ids: torch.Tensor, n_new: int, methods: list[str],
                    use: Callable[[str], None]) -> dict[str, GreedyRun]:
    """Greedy generation of ``n_new`` tokens with every method at once: each method's prompt
    forward, then step by step each method's one-token forward in turn, step k starting with
    method k mod M (no method always first; ``use(m)`` switches the model to method m).
    Consecutive steps of the methods run within milliseconds of each other, so slow phases of a
    shared machine hit all methods alike; each method keeps its own cache and tokens, computed
    exactly as ``greedy_decode`` computes them."""
    check_prompt(ids, n_new, min_new=2)  # a step to time
    state, pre, steps, toks = {}, {}, {m: [] for m in methods}, {}
    with torch.inference_mode():
        for m in methods:
            use(m)
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            state[m] = (out.cache, out.logits[:, -1].argmax(-1))
            pre[m] = time.perf_counter() - t0
            toks[m] = [state[m][1]]
        for k in range(n_new - 1):
            for m in methods[k % len(methods):] + methods[:k % len(methods)]:  # each method first in turn
                use(m)
                cache, nxt = state[m]
                t0 = time.perf_counter()
                out = model(input_ids=nxt[:, None], cache=cache, use_cache=True, logits_to_keep=1)
                state[m] = (out.cache, out.logits[:, -1].argmax(-1))
                steps[m].append(time.perf_counter() - t0)
                toks[m].append(state[m][1])
    return {m: GreedyRun(torch.stack(toks[m], 1), pre[m], sum(steps[m]), steps[m]) for m in methods}


def paired_ratio(base_steps: list[float], steps: list[float]) -> float:
    """Median over the steps of (base step time / this method's step time), the two methods'
    steps taken in lockstep: a speed ratio (> 1: faster than the base) from paired samples."""
    if len(base_steps) != len(steps) or not steps:
        raise ValueError(f"paired steps must match in number, got {len(base_steps)} and {len(steps)}")
    return statistics.median(b / t for b, t in zip(base_steps, steps))


def step_stats(b: int, n_new: int, decode_s: list[float], step_s: list[float]) -> dict:
    """Decode speed of repeated runs at batch ``b``: ``tok_s`` from the median one-token step of all
    runs (a step that another process interrupted lands in the tail, not in the middle: on a shared
    2-core machine this is far steadier than whole runs), ``tok_s_runs`` from the median run."""
    d, step = statistics.median(decode_s), statistics.median(step_s)
    return {"decode_s": d, "decode_s_all": decode_s, "step_s_all": step_s, "step_ms": 1e3 * step,
            "step_ms_mean": 1e3 * statistics.fmean(step_s), "tok_s": b / step, "tok_s_runs": b * (n_new - 1) / d}


class CountingReducer:
    """Wraps a reducer and counts its calls (how many all-reduces one decode step makes)."""

    def __init__(self, reduce: Callable[[torch.Tensor], torch.Tensor]):
        self.reduce, self.calls = reduce, 0

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.reduce(t)


def method_reducer(method: str, check_metadata: bool = True, policy: str = "auto", hidden: int | None = None,
                   outliers: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The reducer of a decode method: "none" (no communication), "plain" or a codec.
    ``policy`` "auto": the codec's QuickAllReduce with its size policy (the tuned table, else the
    defaults) choosing plain, one-shot or two-shot per message; "quantize": every message through
    the codec (one-shot or two-shot by size), as ``lowbit eval --tp`` does.
    ``check_metadata=False`` drops the cross-rank size/dtype check (done once per shape anyway).
    ``hidden`` / ``outliers``: for codecs with +h / +oN (the messages' last dimension; the channels)."""
    if method == "none":
        return lambda t: t
    method = parse_method(method)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if method == "plain":
        return make_reducer(method)
    import warnings

    from lowbit.comm.allreduce import QuickAllReduce
    from lowbit.comm.policy import NO_MAX

    forced = {"min_bytes": 0, "max_bytes": NO_MAX, "table": {}} if policy == "quantize" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qar = QuickAllReduce(codec=method, check_metadata=check_metadata, hidden=hidden, outliers=outliers, **forced)
    return qar.all_reduce


def model_channels(rank: int, path: str, model, method: str) -> torch.Tensor | None:
    """The outlier channels of a ``+oN`` method: one set for the model (rank 0 calibrates, all receive)."""
    from lowbit.comm.codecs import parse_spec

    if method in ("none", "plain") or not parse_spec(method).outliers:
        return None
    from lowbit.parallel.outlier_channels import row_parallel_names, shared_channels

    names = row_parallel_names(model)
    return shared_channels(rank, path, names, parse_spec(method).outliers, "model")[names[0]]


def reducer_path(reduce: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...]) -> str:
    """The path a reducer takes for an fp32 message of ``shape``: plain, oneshot or twoshot."""
    qar = getattr(reduce, "__self__", None)
    return qar.path(torch.empty(shape)) if hasattr(qar, "path") else "plain"


def time_greedy(model, ids: torch.Tensor, n_new: int, repeats: int, warmup_new: int = 4,
                sync: Callable[[], None] | None = None) -> dict:
    """Median prefill and decode time of ``repeats`` greedy runs after a short warm-up run;
    ``sync`` (a barrier) runs before each so that all ranks start a run together."""
    check_prompt(ids, n_new, min_new=2)  # a step to time
    sync = sync or (lambda: None)
    sync()
    greedy_decode(model, ids, min(warmup_new, n_new))
    pre, dec, steps, tokens = [], [], [], None
    for _ in range(repeats):
        sync()
        run = greedy_decode(model, ids, n_new)
        if tokens is not None and not torch.equal(tokens, run.tokens):
            raise RuntimeError("greedy decoding is not deterministic across repeats")
        tokens = run.tokens
        pre.append(run.prefill_s)
        dec.append(run.decode_s)
        steps += run.step_s
    return {"batch": ids.shape[0], "prefill_s": statistics.median(pre), **step_stats(ids.shape[0], n_new, dec, steps),
            "tokens": tokens.tolist()}


def time_reducer(reduce: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], calls: int, repeats: int,
                 sync: Callable[[], None]) -> float:
    """Median seconds per call of ``reduce`` on an fp32 message of ``shape`` (``calls`` back-to-back
    calls per repeat, like one decode step's all-reduces)."""
    src = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    per = []
    with torch.inference_mode():  # as inside the model's forward (reducers may keep inference-mode buffers)
        buf = src.clone()
        for _ in range(3):  # warm-up: workspace buffers, connections
            buf.copy_(src)
            reduce(buf)
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                buf.copy_(src)
                reduce(buf)
            per.append((time.perf_counter() - t0) / calls)
    return statistics.median(per)


def decode_rank(rank: int, world: int, path: str, methods: list[str], prompts: list[torch.Tensor], n_new: int,
                repeats: int, check_metadata: bool = True, policy: str = "auto") -> list[dict]:
    """One rank of the TP decode benchmark: load the shard once; per prompt batch, warm every
    method up and count its all-reduces per step, then per repeat decode with all methods in
    lockstep (``lockstep_decode``: a shared, loaded machine drifts; interleaving the methods step
    by step gives every method the same share of it) and time the reducer alone. Every rank
    returns its rows (the parent checks that all ranks generated the same tokens and reports rank
    0's times)."""
    import torch.distributed as dist

    from lowbit.parallel.shard import load_tp_shard

    if n_new < 2 or repeats < 1:
        raise ValueError(f"need n_new >= 2 and repeats >= 1, got {n_new} and {repeats}")
    counter = CountingReducer(lambda t: t)
    model = load_tp_shard(path, rank, world, counter)
    hidden = model.config.hidden_size
    reducers = {m: method_reducer(m, check_metadata, policy, hidden, model_channels(rank, path, model, m))
                for m in dict.fromkeys(methods)}  # same order on every rank

    def use(method: str) -> None:
        counter.reduce = reducers[method]
        set_reducer(model, counter)

    rows = []
    for ids in prompts:
        b = ids.shape[0]
        per_step = {}
        for m in reducers:  # warm-up run that also counts the all-reduces of one step
            use(m)
            counter.calls, marks = 0, []
            dist.barrier()
            greedy_decode(model, ids, 3, after_prefill=lambda: marks.append(counter.calls))
            per_step[m] = (counter.calls - marks[0]) / 2
        pre = {m: [] for m in reducers}
        dec = {m: [] for m in reducers}
        steps = {m: [] for m in reducers}
        ar = {m: [] for m in reducers}
        toks: dict[str, torch.Tensor] = {}
        for _ in range(repeats):
            dist.barrier()
            runs = lockstep_decode(model, ids, n_new, list(reducers), use)
            for m, run in runs.items():
                if m in toks and not torch.equal(toks[m], run.tokens):
                    raise RuntimeError(f"greedy decoding with {m} is not deterministic across repeats")
                toks[m] = run.tokens
                pre[m].append(run.prefill_s)
                dec[m].append(run.decode_s)
                steps[m] += run.step_s
            for m in reducers:
                if m != "none":
                    ar[m].append(time_reducer(reducers[m], (b, hidden), max(int(per_step[m]), 1), 1, dist.barrier))
        for m in reducers:
            row = {"batch": b, "method": m, "prefill_s": statistics.median(pre[m]),
                   **step_stats(b, n_new, dec[m], steps[m]), "tokens": toks[m].tolist(),
                   "vs_plain_paired": paired_ratio(steps["plain"], steps[m]) if "plain" in steps else None,
                   "allreduces_per_step": per_step[m], "message_bytes": b * hidden * 4,
                   "allreduce_s": statistics.median(ar[m]) if ar[m] else 0.0,
                   "path": "none" if m == "none" else reducer_path(reducers[m], (b, hidden))}
            rows.append(row)
            if rank == 0:
                paired = "" if row["vs_plain_paired"] is None else f" ({row['vs_plain_paired']:.3f}x plain, paired)"
                print(f"  batch {b} {m:>5}: {row['tok_s']:.1f} tok/s{paired}, step {row['step_ms']:.1f} ms, "
                      f"all-reduce {row['allreduce_s'] * 1e6:.0f} us x {per_step[m]:g} ({row['path']})", flush=True)
    return rows


def single_process_rows(model, prompts: list[torch.Tensor], n_new: int, repeats: int, threads: int) -> list[dict]:
    """The unsplit model's greedy decode times and tokens with ``threads`` torch threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [time_greedy(model, ids, n_new, repeats) | {"method": f"single ({threads} thr)", "threads": threads}
                for ids in prompts]
    finally:
        torch.set_num_threads(old)


def matching_prefix(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """(fraction of equal tokens, mean length of the equal prefix per sequence) of two token lists;
    after the first difference greedy outputs follow different contexts, so the prefix is the fair
    measure of agreement."""
    ta, tb = torch.tensor(a), torch.tensor(b)
    if ta.shape != tb.shape:
        raise ValueError(f"token shapes differ: {tuple(ta.shape)} vs {tuple(tb.shape)}")
    eq = ta == tb
    prefix = eq.long().cumprod(1).sum(1).float()
    return float(eq.double().mean()), float(prefix.mean())
