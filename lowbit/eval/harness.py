"""lm-evaluation-harness adapter: evaluate any lowbit-loadable model through the harness's ``LM``.

Registered as ``lowbit``, so with lm-eval installed (``pip install lm-eval==0.4.13``)::

    lm_eval --model lowbit --model_args model=default,batch_size=16 --tasks TASKS

works wherever the tasks' data is reachable (the hub is not, here). In Python, wrap an
already-loaded (e.g. quantized) model with ``LowbitLM.from_model(model, tokenizer)``.
Scoring goes through :mod:`lowbit.eval.loglik`, the same code as ``lowbit eval zeroshot``.
Importing this module needs lm_eval; the rest of lowbit does not.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("lowbit.eval.harness needs lm-evaluation-harness: pip install lm-eval==0.4.13") from e

from .forward import model_context
from .loglik import Request, encode_pair, prefix_token, score_requests


@register_model("lowbit")
class LowbitLM(LM):
    """A lowbit model (default, HF id, directory, or lowbit checkpoint) behind the harness's LM API."""

    def __init__(self, model: str = "default", batch_size: int | str = 16, max_length: int | None = None,
                 dtype: str = "float32", max_gen_toks: int = 256, progress: bool = True, kernel: str | None = None,
                 **_ignored) -> None:
        super().__init__()
        from lowbit.checkpoint import load_model

        loaded, tok = load_model(model, dtype=getattr(torch, dtype), kernel=kernel)  # kernel=reference: reference forward
        self._setup(loaded, tok, batch_size, max_length, max_gen_toks, progress)

    @classmethod
    def from_model(cls, model, tokenizer, batch_size: int = 16, max_length: int | None = None,
                   max_gen_toks: int = 256, progress: bool = False) -> "LowbitLM":
        obj = cls.__new__(cls)
        LM.__init__(obj)
        obj._setup(model, tokenizer, batch_size, max_length, max_gen_toks, progress)
        return obj

    def _setup(self, model, tok, batch_size, max_length, max_gen_toks, progress) -> None:
        self.model, self.tokenizer = model.eval(), tok
        self.batch_size = 16 if str(batch_size).startswith("auto") else int(batch_size)
        ctx = model_context(model)
        self.max_length = int(max_length or ctx or 2048)
        if ctx is not None and self.max_length > ctx:
            raise ValueError(f"max_length {self.max_length} exceeds the model's context ({ctx})")
        self.max_gen_toks = int(max_gen_toks)
        self.progress = progress

    def _score(self, reqs: list[Request]) -> list:
        # score_requests truncates to the model's context; honour a smaller max_length too.
        clipped = []
        for r in reqs:
            full = r.context + r.continuation
            if len(full) > self.max_length + 1:
                full = full[-(self.max_length + 1) :]
            n = len(r.continuation)
            clipped.append(Request(full[:-n], full[-n:]))
        return score_requests(self.model, clipped, self.batch_size, self.progress, desc="lowbit loglik")

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        reqs = [encode_pair(self.tokenizer, ctx, cont) for ctx, cont in (r.args for r in requests)]
        return [(s.logprob, s.greedy) for s in self._score(reqs)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each string's total log-likelihood in disjoint windows of ``max_length`` (the harness's rule)."""
        out = []
        prefix = prefix_token(self.tokenizer)
        for r in requests:
            (text,) = r.args[:1]
            tokens = list(self.tokenizer(text, add_special_tokens=False).input_ids)
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, prefix, self.max_length, 1)]
            scores = self._score([Request(list(c), list(x)) for c, x in windows]) if windows else []
            out.append(sum(s.logprob for s in scores))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy generation, cut at the first of the request's ``until`` strings."""
        results = []
        eos = getattr(self.tokenizer, "eos_token_id", None)
        for r in tqdm(requests, desc="lowbit generate", disable=disable_tqdm or not self.progress):
            context, kwargs = r.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            ids = list(self.tokenizer(context, add_special_tokens=False).input_ids) or [prefix_token(self.tokenizer)]
            ids = ids[-max(1, self.max_length - max_new) :]
            gen: list[int] = []
            with torch.inference_mode():
                for _ in range(max_new):
                    logits = self.model(input_ids=torch.tensor([ids + gen]), use_cache=False).logits[0, -1]
                    nxt = int(logits.argmax())
                    if nxt == eos:
                        break
                    gen.append(nxt)
                    text = self.tokenizer.decode(gen, skip_special_tokens=True)
                    if any(u and u in text for u in until):
                        break
            text = self.tokenizer.decode(gen, skip_special_tokens=True)
            for u in until:
                if u:
                    text = text.split(u)[0]
            results.append(text)
        return results
