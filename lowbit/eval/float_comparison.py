"""A quantized model against its float original: the float reference (a model, or a cached top-k
reference file made on first use) and the comparison fields ``lowbit quantize`` records.

A model quantized in place has no float self left to compare with, so the float model is loaded
again (``load_float``) only when no saved reference exists; with ``reference_path`` its top-k
log-probs are saved there, and later runs skip the float forward (KL is then the top-k bound,
see :mod:`lowbit.eval.kl`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from .kl import ReferenceTopK, kl_divergence, reference_topk

REFERENCE_TOP_K = 128  # reference log-probs kept per token in a saved reference


def float_reference(reference_path: str | Path | None, load_float: Callable[[], nn.Module], tokenizer, *,
                    dataset: str = "wikitext2", seqlen: int, max_windows: int, progress: bool = True,
                    ) -> nn.Module | ReferenceTopK:
    """The saved reference at ``reference_path`` if it exists; else the float model from
    ``load_float()``, turned into a top-k reference saved at ``reference_path`` when one is given."""
    if reference_path and Path(reference_path).is_file():
        return ReferenceTopK.load(reference_path)
    ref_model = load_float()
    if not reference_path:
        return ref_model
    ref = reference_topk(ref_model, tokenizer, dataset, seqlen=seqlen, max_windows=max_windows, k=REFERENCE_TOP_K,
                         progress=progress)
    ref.save(reference_path)
    return ref


def compare_to_float(reference: nn.Module | ReferenceTopK, model: nn.Module, tokenizer, *, dataset: str = "wikitext2",
                     seqlen: int, max_windows: int, progress: bool = True) -> dict:
    """Perplexities, their ratio, mean KL and top-1 agreement of ``model`` against ``reference``."""
    r = kl_divergence(reference, model, tokenizer, dataset, seqlen=seqlen, max_windows=max_windows, progress=progress)
    return {"ref_ppl": r.ref_ppl, "ppl": r.ppl, "ratio": r.ppl / r.ref_ppl, "mean_kl": r.mean_kl,
            "top1_agreement": r.top1_agreement, "kl_method": r.method, "eval_windows": r.n_windows,
            "eval_seqlen": seqlen, "eval_tokens": r.n_tokens}
