"""Perplexity by the standard protocol (GPTQ / Atom / llm-compressor).

The evaluation text is tokenized once and cut into non-overlapping windows of ``seqlen`` tokens
(the short tail is dropped). Each window is scored on its own, starting from an empty cache, and
the perplexity is ``exp`` of the mean negative log-likelihood over every predicted token (the
``seqlen - 1`` next-token predictions of each window). This equals exp of the mean of
transformers' own per-window ``loss`` (checked in the tests to 1e-5 relative in fp32).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from .forward import LogitSource, check_ids
from .windows import eval_windows


@dataclass
class PerplexityResult:
    ppl: float
    nll: float  # mean negative log-likelihood per predicted token, in nats
    n_tokens: int  # predicted tokens
    n_windows: int
    seconds: float
    dataset: str
    seqlen: int

    def to_dict(self) -> dict:
        return asdict(self)


def window_nll(model, ids: torch.Tensor) -> torch.Tensor:
    """Per-token NLL ``[B, T-1]`` (fp32) of windows ``ids [B, T]``, the head applied in chunks."""
    b, t = ids.shape
    src = LogitSource(model, ids)
    out = torch.empty(b, t - 1, dtype=torch.float32)
    for rows, cols, logits in src.chunks(t - 1):
        picked = logits.gather(1, src.tokens(rows, cols + 1).unsqueeze(1)).squeeze(1)
        out[rows, cols] = (torch.logsumexp(logits, dim=1) - picked).cpu()
    return out


def window_perplexity(model, ids: torch.Tensor) -> float:
    """exp of the mean per-token NLL of windows ``ids [B, T]`` (:func:`window_nll`, no autograd):
    the number the readers of one checkpoint are compared on."""
    with torch.inference_mode():
        return math.exp(float(window_nll(model, ids).double().mean()))


def perplexity(
    model,
    tokenizer,
    dataset: str = "wikitext2",
    seqlen: int = 2048,
    max_windows: int | None = None,
    batch_size: int = 1,
    progress: bool = True,
) -> PerplexityResult:
    """Perplexity of ``model`` on ``dataset`` ("wikitext2", "ptb" or a text file path).

    ``seqlen`` may not exceed the model's context (a clear ValueError); ``batch_size`` windows
    run per forward pass (results do not depend on it beyond float rounding).
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    windows = eval_windows(tokenizer, dataset, seqlen, max_windows)
    check_ids(model, windows)
    start = time.perf_counter()
    total = 0.0
    count = 0
    bar = tqdm(total=windows.shape[0], desc=f"ppl {dataset}@{seqlen}", unit="win", disable=not progress)
    with torch.inference_mode():
        for s in range(0, windows.shape[0], batch_size):
            nll = window_nll(model, windows[s : s + batch_size])
            if not torch.isfinite(nll).all():
                raise FloatingPointError(f"non-finite log-likelihood in windows {s}..{s + nll.shape[0] - 1}: the model produced NaN/Inf")
            total += float(nll.double().sum())
            count += nll.numel()
            bar.update(nll.shape[0])
            bar.set_postfix(ppl=f"{math.exp(total / count):.3f}")
    bar.close()
    mean = total / count
    return PerplexityResult(
        ppl=math.exp(mean), nll=mean, n_tokens=count, n_windows=int(windows.shape[0]),
        seconds=time.perf_counter() - start, dataset=dataset, seqlen=seqlen,
    )
