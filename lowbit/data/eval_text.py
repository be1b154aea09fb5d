"""Evaluation text for perplexity and KL: WikiText-2 raw test, PTB test, or a user's text file.

The protocol is the one GPTQ, Atom, llm-compressor and most quantization papers use: the split's
rows joined with ``"\\n\\n"`` and tokenized once as one long sequence.

* ``wikitext2``: ``wikitext2/wiki.test.raw``, which already *is* ``"\\n\\n".join(test["text"])``
  of the 4358-row raw test split; it is read unchanged.
* ``ptb``: ``ptb/ptb.test.txt`` (Mikolov's LM version), one sentence per line; each line is
  stripped (as the Hugging Face ``ptb_text_only`` loader does) and the lines are joined with
  ``"\\n\\n"`` (GPTQ's ``get_ptb``).
* anything else is a path to a UTF-8 text file, read unchanged.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .paths import data_file

EVAL_DATASETS = {"wikitext2": "wikitext2/wiki.test.raw", "ptb": "ptb/ptb.test.txt"}


def eval_path(dataset: str) -> Path:
    """The file of ``dataset``, or a clear error (commands call it before loading a model)."""
    if dataset in EVAL_DATASETS:
        return data_file(EVAL_DATASETS[dataset])
    path = Path(dataset)
    if not path.is_file():
        raise FileNotFoundError(
            f"unknown evaluation dataset {dataset!r}: use one of {sorted(EVAL_DATASETS)} or a path to a text file"
        )
    return path


def eval_text(dataset: str) -> str:
    """The evaluation text of ``dataset`` ("wikitext2", "ptb", or a path to a text file)."""
    path = eval_path(dataset)
    if dataset in EVAL_DATASETS:
        text = path.read_text(encoding="utf-8")
        if dataset == "ptb":
            text = "\n\n".join(line.strip() for line in text.splitlines())
        return text
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"evaluation text file {path} is empty")
    return text


_TOKEN_CACHE: dict[tuple, torch.Tensor] = {}


def eval_token_ids(tokenizer, dataset: str) -> torch.Tensor:
    """The whole evaluation text tokenized once, as a 1-D int64 tensor.

    Cached per (tokenizer, dataset, file mtime) in memory, because tokenizing WikiText-2 costs a
    few seconds and every model compared in one process uses the same ids.
    """
    path = data_file(EVAL_DATASETS[dataset]) if dataset in EVAL_DATASETS else Path(dataset)
    stamp = path.stat().st_mtime_ns if path.is_file() else None
    key = (getattr(tokenizer, "name_or_path", None), id(tokenizer), len(tokenizer), dataset, stamp)
    if key not in _TOKEN_CACHE:
        ids = tokenizer(eval_text(dataset), return_tensors="pt").input_ids[0].to(torch.int64)
        _TOKEN_CACHE.clear()  # keep at most one text's ids alive
        _TOKEN_CACHE[key] = ids
    return _TOKEN_CACHE[key]
