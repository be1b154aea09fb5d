"""Log-likelihood of continuations given contexts, batched (the core of zero-shot scoring).

Tokenization follows lm-evaluation-harness's HFLM: trailing whitespace of the context moves to the
continuation, the pair is encoded as one string without special tokens, and the continuation's
tokens are the whole encoding minus the context's own encoding. An empty context is replaced by
the tokenizer's BOS (or EOS) token. Inputs longer than the model's context are truncated from
the left, as the harness does.

Batching: requests are sorted longest first, right-padded (causal attention makes the padding
invisible to the real tokens), requests with identical inputs share one forward pass, and only
the continuation positions go through the LM head.
:func:`score_reference` is the plain one-request-at-a-time version the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .forward import LogitSource, model_context, model_device, model_vocab


@dataclass(frozen=True)
class Request:
    context: list[int]
    continuation: list[int]


@dataclass(frozen=True)
class Score:
    logprob: float  # sum of log P(continuation token | everything before it)
    greedy: bool  # every continuation token is the argmax
    n_tokens: int


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def prefix_token(tokenizer) -> int:
    for name in ("bos_token_id", "eos_token_id"):
        tid = getattr(tokenizer, name, None)
        if tid is not None:
            return int(tid)
    raise ValueError("the tokenizer has neither a BOS nor an EOS token, which an empty context needs")


def encode_pair(tokenizer, context: str, continuation: str) -> Request:
    """Token ids of (context, continuation), the way lm-evaluation-harness splits them."""
    n_space = len(context) - len(context.rstrip())
    if n_space:
        continuation = context[-n_space:] + continuation
        context = context[:-n_space]
    if not continuation:
        raise ValueError(f"empty continuation for context {context[-60:]!r}")
    if not context:
        cont = _encode(tokenizer, continuation)
        ctx = [prefix_token(tokenizer)]
    else:
        whole = _encode(tokenizer, context + continuation)
        ctx = _encode(tokenizer, context)
        cont = whole[len(ctx) :]
    if not cont:
        raise ValueError(f"the tokenizer encodes continuation {continuation!r} to no tokens")
    return Request(ctx, cont)


def _inputs(req: Request, max_len: int | None) -> tuple[list[int], int]:
    """Model input ids (the last token is never fed) and how many of them belong to the continuation."""
    full = req.context + req.continuation
    if max_len is not None:
        full = full[-(max_len + 1) :]
    return full[:-1], len(req.continuation)


def score_requests(model, requests: list[Request], batch_size: int = 16, progress: bool = True, desc: str = "loglik") -> list[Score]:
    """Score every request; results are in input order and do not depend on ``batch_size``."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    max_len = model_context(model)
    vocab = model_vocab(model)
    for r in requests:
        if max(r.context + r.continuation) >= vocab:
            raise ValueError(f"token id {max(r.context + r.continuation)} is outside the model's vocabulary ({vocab})")
        if max_len is not None and len(r.continuation) > max_len:
            raise ValueError(f"a continuation of {len(r.continuation)} tokens does not fit the model's context ({max_len})")
    prepared = [_inputs(r, max_len) for r in requests]
    # Requests with identical model inputs (e.g. BoolQ's one-token " yes"/" no" after the same
    # passage) share one forward pass: group them by their input ids.
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (inp, _) in enumerate(prepared):
        groups.setdefault(tuple(inp), []).append(i)
    uniq = sorted(groups, key=lambda k: -len(k))
    out: list[Score | None] = [None] * len(requests)
    bar = tqdm(total=len(requests), desc=desc, unit="req", disable=not progress)
    with torch.inference_mode():
        for s in range(0, len(uniq), batch_size):
            keys = uniq[s : s + batch_size]
            ids = torch.zeros(len(keys), len(keys[0]), dtype=torch.int64)
            rows, cols, targets, owner = [], [], [], []
            for b, key in enumerate(keys):
                ids[b, : len(key)] = torch.tensor(key)
                for i in groups[key]:
                    n_cont = prepared[i][1]
                    rows += [b] * n_cont
                    cols += range(len(key) - n_cont, len(key))
                    targets += requests[i].continuation[-n_cont:]
                    owner += [i] * n_cont
            src = LogitSource(model, ids)
            logp = torch.log_softmax(src.logits(torch.tensor(rows), torch.tensor(cols)), dim=1)
            tgt = torch.tensor(targets, device=logp.device)
            tok_lp = logp.gather(1, tgt.unsqueeze(1)).squeeze(1).cpu()
            hit = (logp.argmax(dim=1) == tgt).cpu()
            owner_t = torch.tensor(owner)
            for key in keys:
                for i in groups[key]:
                    m = owner_t == i
                    out[i] = Score(float(tok_lp[m].double().sum()), bool(hit[m].all()), int(m.sum()))
                bar.update(len(groups[key]))
    bar.close()
    return out  # type: ignore[return-value]


def score_reference(model, request: Request) -> Score:
    """One request through the model's own full logits: the reference for :func:`score_requests`."""
    inp, n_cont = _inputs(request, model_context(model))
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([inp], device=model_device(model))).logits[0].float().cpu()
    logp = torch.log_softmax(logits[-n_cont:], dim=1)
    tgt = torch.tensor(request.continuation)
    lp = logp[torch.arange(n_cont), tgt]
    return Score(float(lp.double().sum()), bool((logp.argmax(dim=1) == tgt).all()), n_cont)
