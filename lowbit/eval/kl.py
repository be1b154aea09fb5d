"""KL divergence of a model's next-token distribution from a reference model's, and top-1 agreement.

llama.cpp's ``perplexity --kl-divergence`` reports these because they move long before
perplexity does. Per predicted token t of each evaluation window (the same windows as
:mod:`lowbit.eval.perplexity`): ``KL_t = sum_v P_ref(v) (log P_ref(v) - log P(v))`` in nats, and
top-1 agreement is ``argmax P_ref == argmax P``. We report the mean, median and 99th percentile
of ``KL_t``, the agreement rate, and both perplexities.

Memory: logits are produced and reduced in chunks of tokens (see :mod:`lowbit.eval.forward`), so
two models' full fp32 logits never exist at once. The reference can be

* a model (exact KL, computed window by window beside the evaluated model), or
* a :class:`ReferenceTopK` computed beforehand by :func:`reference_topk` (and saved to disk), so a
  model can be quantized in place and compared with its float self without two copies. It keeps
  the reference's top-k log-probs per token (fp32); the KL is then the KL between the two
  distributions coarsened to k+1 bins (the k reference-top tokens and "all others"), which by the
  data-processing inequality is a lower bound of the exact KL and equals it when k = vocab.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .forward import LogitSource, check_ids, model_vocab
from .windows import eval_windows


@dataclass
class KLResult:
    mean_kl: float
    median_kl: float
    p99_kl: float
    top1_agreement: float
    n_tokens: int
    n_windows: int
    ref_ppl: float
    ppl: float
    seconds: float
    dataset: str
    seqlen: int
    method: str  # "exact" or "top{k}" (coarsened lower bound)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ReferenceTopK:
    """The reference model's top-k next-token log-probs for every predicted token of the windows."""

    windows: torch.Tensor  # [n, seqlen] int64
    logp: torch.Tensor  # [n, seqlen-1, k] float32, sorted descending
    idx: torch.Tensor  # [n, seqlen-1, k] int64 token ids
    nll: torch.Tensor  # [n, seqlen-1] float32, the reference's own NLL of the true next token
    dataset: str
    vocab: int

    @property
    def k(self) -> int:
        return int(self.logp.shape[-1])

    def save(self, path: str | os.PathLike) -> None:
        """Write as safetensors, atomically."""
        from safetensors.torch import save_file

        from lowbit.io.atomic import atomic_path

        tensors = {"windows": self.windows, "logp": self.logp, "idx": self.idx.to(torch.int32), "nll": self.nll}
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"dataset": self.dataset, "vocab": str(self.vocab)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ReferenceTopK":
        from safetensors import safe_open

        if not Path(path).is_file():
            raise FileNotFoundError(f"reference file not found: {path}")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in f.keys()}
        missing = {"windows", "logp", "idx", "nll"} - set(t)
        if missing or "vocab" not in meta:
            raise ValueError(f"{path} is not a lowbit reference file (missing {sorted(missing) or 'metadata'})")
        return cls(t["windows"], t["logp"], t["idx"].long(), t["nll"], meta.get("dataset", "?"), int(meta["vocab"]))


def _targets_nll(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -logp.gather(1, targets.unsqueeze(1)).squeeze(1)


def reference_topk(
    ref_model, tokenizer, dataset: str = "wikitext2", seqlen: int = 2048, max_windows: int | None = None,
    batch_size: int = 1, k: int = 32, progress: bool = True,
) -> ReferenceTopK:
    """Run the reference once and keep its top-``k`` log-probs per predicted token."""
    windows = eval_windows(tokenizer, dataset, seqlen, max_windows)
    check_ids(ref_model, windows)
    vocab = model_vocab(ref_model)
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in 1..{vocab}, got {k}")
    n, t = windows.shape
    logp_out = torch.empty(n, t - 1, k)
    idx_out = torch.empty(n, t - 1, k, dtype=torch.int64)
    nll_out = torch.empty(n, t - 1)
    with torch.inference_mode():
        for s in tqdm(range(0, n, batch_size), desc=f"reference top{k}", disable=not progress):
            ids = windows[s : s + batch_size]
            src = LogitSource(ref_model, ids)
            for rows, cols, logits in src.chunks(t - 1):
                lp = torch.log_softmax(logits, dim=1)
                vals, inds = lp.topk(k, dim=1)
                logp_out[rows + s, cols] = vals.cpu()
                idx_out[rows + s, cols] = inds.cpu()
                nll_out[rows + s, cols] = _targets_nll(lp, src.tokens(rows, cols + 1)).cpu()
    return ReferenceTopK(windows, logp_out, idx_out, nll_out, dataset, vocab)


def kl_exact(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-row KL(P_ref || P) from full log-probs ``[N, V]``."""
    return (ref_logp.exp() * (ref_logp - logp)).sum(dim=1).clamp_min(0.0)


def kl_coarsened(ref_top_logp: torch.Tensor, ref_top_idx: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-row KL between P_ref and P coarsened to the k reference-top tokens plus one "rest" bin."""
    p = ref_top_logp.exp()
    q_top = logp.gather(1, ref_top_idx)
    head = (p * (ref_top_logp - q_top)).sum(dim=1)
    p_rest = (1.0 - p.sum(dim=1)).clamp_min(0.0)
    q_rest = (1.0 - q_top.exp().sum(dim=1)).clamp_min(1e-30)
    tail = torch.where(p_rest > 0, p_rest * (torch.log(p_rest.clamp_min(1e-30)) - torch.log(q_rest)), torch.zeros_like(p_rest))
    return (head + tail).clamp_min(0.0)


def kl_divergence(
    ref_model, model, tokenizer, dataset: str = "wikitext2", seqlen: int = 2048, max_windows: int | None = None,
    batch_size: int = 1, progress: bool = True,
) -> KLResult:
    """KL(ref || model) and top-1 agreement over the evaluation windows.

    ``ref_model`` is a model (exact) or a :class:`ReferenceTopK` (its own windows are used;
    ``dataset``/``seqlen`` must match it; ``max_windows`` keeps its first windows).
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    topk = isinstance(ref_model, ReferenceTopK)
    if topk:
        windows = ref_model.windows[: max_windows or None]
        if windows.shape[1] != seqlen or ref_model.dataset != dataset:
            raise ValueError(
                f"reference was computed on {ref_model.dataset}@{ref_model.windows.shape[1]}, not {dataset}@{seqlen}"
            )
        if model_vocab(model) != ref_model.vocab:
            raise ValueError(f"vocabulary sizes differ: reference {ref_model.vocab}, model {model_vocab(model)}")
    else:
        windows = eval_windows(tokenizer, dataset, seqlen, max_windows)
        check_ids(ref_model, windows)
        if model_vocab(ref_model) != model_vocab(model):
            raise ValueError(f"vocabulary sizes differ: reference {model_vocab(ref_model)}, model {model_vocab(model)}")
    check_ids(model, windows)
    n, t = windows.shape
    kls, agree, ref_nll, nll = [], 0, 0.0, 0.0
    start = time.perf_counter()
    with torch.inference_mode():
        for s in tqdm(range(0, n, batch_size), desc=f"kl {dataset}@{seqlen}", unit="batch", disable=not progress):
            ids = windows[s : s + batch_size]
            src = LogitSource(model, ids)
            ref_src = None if topk else LogitSource(ref_model, ids)
            for rows, cols, logits in src.chunks(t - 1):
                lp = torch.log_softmax(logits, dim=1)
                targets = src.tokens(rows, cols + 1)
                if topk:
                    r_lp, r_idx = ref_model.logp[rows + s, cols].to(lp.device), ref_model.idx[rows + s, cols].to(lp.device)
                    kl = kl_coarsened(r_lp, r_idx, lp)
                    ref_top1 = r_idx[:, 0]
                    ref_nll += float(ref_model.nll[rows + s, cols].double().sum())
                else:
                    r_full = torch.log_softmax(ref_src.logits(rows, cols).to(lp.device), dim=1)
                    kl = kl_exact(r_full, lp)
                    ref_top1 = r_full.argmax(dim=1)
                    ref_nll += float(_targets_nll(r_full, targets).double().sum())
                    del r_full
                if not torch.isfinite(kl).all():
                    raise FloatingPointError("non-finite KL: a model produced NaN/Inf logits")
                kls.append(kl.cpu())
                agree += int((lp.argmax(dim=1) == ref_top1).sum())
                nll += float(_targets_nll(lp, targets).double().sum())
    allkl = torch.cat(kls).double()
    count = allkl.numel()
    return KLResult(
        mean_kl=float(allkl.mean()), median_kl=float(allkl.median()), p99_kl=float(torch.quantile(allkl, 0.99)) if count <= 16_000_000 else float("nan"),
        top1_agreement=agree / count, n_tokens=count, n_windows=n, ref_ppl=math.exp(ref_nll / count),
        ppl=math.exp(nll / count), seconds=time.perf_counter() - start, dataset=dataset, seqlen=seqlen,
        method=f"top{ref_model.k}" if topk else "exact",
    )
