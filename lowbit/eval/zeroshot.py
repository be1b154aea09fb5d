"""Zero-shot accuracy by log-likelihood, with lm-evaluation-harness's metric definitions.

For an item with choices c_1..c_n (requests formatted by :mod:`lowbit.data.zeroshot`) and
ll_i = log P(" " + c_i | context):

* ``acc``      = [argmax_i ll_i == gold]
* ``acc_norm`` = [argmax_i ll_i / len(c_i) == gold], len in characters of the bare choice text
  (without the delimiter), exactly the harness's ``lls / completion_len``. Ties go to the first.
* WinoGrande (partial scoring): the "choices" are the contexts; every continuation is the same
  text, so acc_norm == acc (reported as acc only, as the harness does).
* LAMBADA: ``acc`` = greedy decoding reproduces the whole last word; also its perplexity,
  ``exp(-mean ll)`` over items.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from lowbit.data.zeroshot import TASKS, ZeroShotItem, canonical_task, load_task

from .loglik import encode_pair, score_requests


@dataclass
class ZeroShotResult:
    task: str
    n_items: int
    acc: float
    acc_norm: float | None
    acc_stderr: float
    seconds: float
    ppl: float | None = None  # LAMBADA only
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def choice_metrics(lls: list[float], choice_texts: tuple[str, ...], gold: int) -> tuple[float, float]:
    """(acc, acc_norm) of one multiple-choice item, the harness's definitions."""
    ll = np.asarray(lls, dtype=np.float64)
    lengths = np.asarray([float(len(c)) for c in choice_texts])
    if np.any(lengths == 0):
        raise ValueError("acc_norm needs non-empty choice texts")
    return float(np.argmax(ll) == gold), float(np.argmax(ll / lengths) == gold)


def _stderr(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return float("nan")
    return float(np.std(values, ddof=1) / math.sqrt(n))


def evaluate_items(model, tokenizer, task: str, items: list[ZeroShotItem], batch_size: int = 16, progress: bool = True) -> ZeroShotResult:
    """Score already-loaded items of ``task``."""
    task = canonical_task(task)
    start = time.perf_counter()
    requests, spans = [], []
    for it in items:
        spans.append((len(requests), len(it.pairs)))
        requests += [encode_pair(tokenizer, c, x) for c, x in it.pairs]
    scores = score_requests(model, requests, batch_size=batch_size, progress=progress, desc=task)
    accs, norms, lls = [], [], []
    for it, (s, n) in zip(items, spans):
        sc = scores[s : s + n]
        if it.kind == "greedy":
            accs.append(float(sc[0].greedy))
            lls.append(sc[0].logprob)
        else:
            a, an = choice_metrics([x.logprob for x in sc], it.choice_texts, it.gold)
            accs.append(a)
            norms.append(an)
    has_norm = task not in ("winogrande", "lambada_openai")
    return ZeroShotResult(
        task=task, n_items=len(items), acc=float(np.mean(accs)),
        acc_norm=float(np.mean(norms)) if has_norm else None, acc_stderr=_stderr(accs),
        seconds=time.perf_counter() - start,
        ppl=math.exp(-float(np.mean(lls))) if lls else None,
        extra={"n_requests": len(requests), "n_tokens": sum(len(r.context) + len(r.continuation) for r in requests)},
    )


def evaluate_task(model, tokenizer, task: str, limit: int | None = None, batch_size: int = 16, progress: bool = True) -> ZeroShotResult:
    """Accuracy of ``model`` on the first ``limit`` items (all when None) of a shared-data task."""
    return evaluate_items(model, tokenizer, task, load_task(task, limit), batch_size, progress)


def evaluate_tasks(model, tokenizer, tasks: list[str] | None = None, limit: int | None = None, batch_size: int = 16, progress: bool = True) -> list[ZeroShotResult]:
    names = [canonical_task(t) for t in (tasks or TASKS)]  # validate every name before any work
    return [evaluate_task(model, tokenizer, t, limit, batch_size, progress) for t in names]
