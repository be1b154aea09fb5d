"""``run_tp_eval``: perplexity or KL of a model split across W tensor-parallel ranks, with plain or
quantized all-reduce (the library entry point behind ``lowbit eval ppl|kl --tp W --allreduce C``)."""

from __future__ import annotations

from lowbit.parallel.launch import check_results, join_torchrun, run_here_or_spawn, under_torchrun

from lowbit.parallel.layers import parse_allreduce
from lowbit.models.shard_plan import make_plan
from lowbit.eval.tp_worker import check_quantized_world, checkpoint_folder, eval_rank


def check_tp_args(kind: str, model: str, tp: int, allreduce: str, ref: str | None = None) -> str:
    """Validate everything that can be checked before ranks start; the checkpoint folder."""
    from transformers import AutoConfig

    if kind not in ("ppl", "kl"):
        raise ValueError(f"kind must be 'ppl' or 'kl', got {kind!r}")
    parse_allreduce(allreduce)
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"--tp must be a positive integer, got {tp!r}")
    if ref is not None and str(ref).endswith(".safetensors"):
        raise ValueError("tensor-parallel KL needs a reference model, not a saved top-k file (--save-ref output)")
    path = checkpoint_folder(model)
    make_plan(AutoConfig.from_pretrained(path), tp)  # TPSplitError before any rank starts
    check_quantized_world(path, tp)
    return path


def run_tp_eval(kind: str, model: str, tp: int, allreduce: str = "plain", dataset: str = "wikitext2",
                seqlen: int = 2048, max_windows: int | None = None, batch_size: int = 1,
                ref: str | None = None, timeout_s: float = 600.0, deadline_s: float = 6 * 3600.0,
                outlier_channels: str = "model") -> dict | None:
    """Evaluate ``model`` split over ``tp`` ranks; the result dict (PerplexityResult / KLResult
    fields plus kind, model, tp, allreduce, plan) on rank 0, None on other torchrun ranks.

    Launches ``tp`` local gloo ranks itself, or, under torchrun, runs as this process's rank
    (then the world size must equal ``tp``). ``ref``: the KL reference (default: ``model``
    itself, single-process, float). ``outlier_channels``: with ``+oN`` codecs, "model" (one set for
    every row-parallel linear) or "layer" (each its own), chosen on calibration text.
    """
    check_tp_args(kind, model, tp, allreduce, ref)
    if under_torchrun():
        join_torchrun(tp, timeout_s)
    values = check_results(run_here_or_spawn(
        eval_rank, tp, kind, model, allreduce, dataset, seqlen, max_windows, batch_size, ref, outlier_channels,
        timeout_s=timeout_s, deadline_s=deadline_s,
    ))
    return values[0]
