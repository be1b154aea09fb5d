"""Non-overlapping evaluation windows of the tokenized evaluation text (the standard protocol)."""

from __future__ import annotations

import torch

from lowbit.data.eval_text import eval_token_ids


def eval_windows(tokenizer, dataset: str = "wikitext2", seqlen: int = 2048, max_windows: int | None = None) -> torch.Tensor:
    """``[n_windows, seqlen]`` token ids: the text tokenized once, cut into consecutive windows.

    The tail shorter than ``seqlen`` is dropped (as GPTQ, Atom and llm-compressor do), so every
    window predicts ``seqlen - 1`` tokens. ``max_windows`` keeps the first windows only.
    """
    if seqlen < 2:
        raise ValueError(f"seqlen must be at least 2, got {seqlen}")
    if max_windows is not None and max_windows <= 0:
        raise ValueError(f"max_windows must be positive, got {max_windows}")
    ids = eval_token_ids(tokenizer, dataset)
    n = ids.numel() // seqlen
    if n == 0:
        raise ValueError(f"{dataset} has {ids.numel()} tokens, fewer than one window of {seqlen}")
    if max_windows is not None:
        n = min(n, max_windows)
    return ids[: n * seqlen].view(n, seqlen)
