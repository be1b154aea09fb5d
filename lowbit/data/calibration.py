"""Calibration text: WikiText-2 *validation* by default, a user's file, or a `datasets` dataset.

Calibration never reads evaluation text (the test splits): :func:`calibration_ids` refuses a
path that is one of the evaluation files.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .paths import data_file

DEFAULT_CALIBRATION = "wikitext2/wiki.valid.tokens"
EVALUATION_FILES = ("wiki.test.raw", "ptb.test.txt")


def calibration_text(source: str | None = None) -> str:
    """Text for calibration.

    ``source`` is None (WikiText-2 validation from the shared data), a file path, or
    ``hf:NAME[:CONFIG[:SPLIT]]`` to read the ``text`` column through the `datasets` library.
    """
    if source is None:
        return data_file(DEFAULT_CALIBRATION).read_text(encoding="utf-8")
    if source.startswith("hf:"):
        parts = source[3:].split(":")
        name, config, split = (parts + [None, None])[:3]
        try:
            import datasets
        except ImportError as e:
            raise RuntimeError("hf: calibration sources need the 'datasets' package (pip install datasets)") from e
        ds = datasets.load_dataset(name, config, split=split or "train")
        return "\n\n".join(ds["text"])
    path = Path(source)
    if path.name in EVALUATION_FILES:
        raise ValueError(f"{path} is evaluation text; calibrating on it would leak the test set")
    if not path.is_file():
        raise FileNotFoundError(f"calibration file not found: {path}")
    return path.read_text(encoding="utf-8")


def calibration_ids(tokenizer, n_samples: int, seqlen: int, source: str | None = None, seed: int = 0) -> torch.Tensor:
    """``[n_samples, seqlen]`` token ids: random windows of the calibration text (seeded).

    Windows are drawn from a prefix of the text long enough for the request, so tokenizing
    stays fast no matter how long the source is.
    """
    if n_samples <= 0 or seqlen <= 0:
        raise ValueError(f"n_samples and seqlen must be positive, got {n_samples}, {seqlen}")
    text = calibration_text(source)
    need_chars = max(8 * n_samples * seqlen * 6, 200_000)
    ids = tokenizer(text[:need_chars], return_tensors="pt").input_ids[0]
    if ids.numel() < seqlen + 1:
        raise ValueError(f"calibration text has {ids.numel()} tokens, fewer than one window of {seqlen}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seqlen, (n_samples,), generator=g)
    return torch.stack([ids[s : s + seqlen] for s in starts.tolist()])
