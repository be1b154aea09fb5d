"""Run a causal LM as body + head so the vocabulary projection can be done in token chunks.

The full logits of one 2048-token window of a 49152-word vocabulary are 400 MB in fp32; the
evaluators only need a few numbers per token (an NLL, a KL, an argmax), so they run the decoder
body once and apply the head (lm_head) to chunks of hidden states, reducing each chunk at once.
Models without the usual ``base_model`` + output-embedding split fall back to full logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

DEFAULT_CHUNK = 512  # tokens per head chunk: 512 x 49152 x 4 B = 100 MB of fp32 logits


def model_context(model) -> int | None:
    """The longest sequence the model accepts (``max_position_embeddings``), or None if unknown."""
    cfg = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_vocab(model) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    if head is not None and isinstance(getattr(head, "out_features", None), int):
        return head.out_features  # a quantized head
    return int(model.config.vocab_size)


def _split(model) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]] | None:
    """(body, head) when the model is a plain ``base_model`` + ``lm_head`` LM, else None."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None  # the head does more than a linear map; use the model's own logits
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = getattr(model, "base_model", None)
    if head is None or body is None or body is model:
        return None

    def run_body(ids: torch.Tensor) -> torch.Tensor:
        return body(input_ids=ids, use_cache=False).last_hidden_state

    return run_body, head


def model_device(model) -> torch.device:
    """The device of the model's first parameter (where its inputs must go)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


class LogitSource:
    """Hidden states of a batch, and their logits (fp32) for any subset of positions, in chunks.

    ``ids`` may live anywhere: they are moved to the model's device. Positions (``rows``,
    ``cols``) are CPU index tensors; :meth:`logits` returns logits on the model's device, and
    consumers move their small per-token results back to the CPU.
    """

    def __init__(self, model, ids: torch.Tensor):
        self.model = model
        self.device = model_device(model)
        ids = ids.to(self.device)
        self.ids = ids
        split = _split(model)
        if split is None:
            self._hidden = None
            self._logits = model(input_ids=ids, use_cache=False).logits
            self._head = None
        else:
            body, head = split
            self._hidden = body(ids)
            self._head = head
            self._logits = None

    def logits(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[len(rows), vocab]`` at positions ``(rows[i], cols[i])``, on the model's device."""
        rows, cols = rows.to(self.device), cols.to(self.device)
        if self._logits is not None:
            return self._logits[rows, cols].float()
        return self._head(self._hidden[rows, cols]).float()

    def chunks(self, n_positions: int, chunk: int = DEFAULT_CHUNK) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(rows, cols, logits)`` over positions ``0..n_positions-1`` of every row, chunked."""
        b = self.ids.shape[0]
        rows = torch.arange(b).repeat_interleave(n_positions)
        cols = torch.arange(n_positions).repeat(b)
        for s in range(0, rows.numel(), chunk):
            r, c = rows[s : s + chunk], cols[s : s + chunk]
            yield r, c, self.logits(r, c)

    def tokens(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Input ids at positions ``(rows, cols)``, on the model's device (targets are ``cols + 1``)."""
        return self.ids[rows.to(self.device), cols.to(self.device)]


def check_ids(model, ids: torch.Tensor) -> None:
    """Clear errors for ids the model cannot take (too long, out of its vocabulary)."""
    ctx = model_context(model)
    if ctx is not None and ids.shape[-1] > ctx:
        raise ValueError(f"a window of {ids.shape[-1]} tokens is longer than the model's context ({ctx}); use a smaller --seqlen")
    vocab = model_vocab(model)
    if ids.numel() and int(ids.max()) >= vocab:
        raise ValueError(
            f"token id {int(ids.max())} is outside the model's vocabulary ({vocab}): the tokenizer does not match the model"
        )
