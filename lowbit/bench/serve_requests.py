"""The requests ``lowbit bench serve`` sends: prompts of real text and a mix of lengths, seeded.

Half the prompts are WikiText-2 *test* paragraphs (documents to continue: tens to hundreds of
tokens), half are zero-shot questions as the evaluation formats them (ARC, PIQA, BoolQ passages,
LAMBADA stories: short questions and longer passages). Prompts longer than ``prompt_max`` tokens
keep their first ``prompt_max``. Output lengths are drawn log-uniformly from ``[new_min,
new_max]`` (many short answers, a tail of long ones) and are exact: the server is told to ignore
the end-of-sequence token, so every format does the same work. One seed fixes the whole list, and
each concurrency level sends a prefix of it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

ZEROSHOT_SOURCES = ("arc_easy", "arc_challenge", "piqa", "boolq", "lambada_openai")
MIN_PROMPT_TOKENS = 8  # shorter paragraphs (WikiText headings) are skipped


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    source: str

    def as_json(self) -> dict:
        return {"prompt_ids": list(self.prompt_ids), "max_tokens": self.max_tokens, "source": self.source}


def _wiki_paragraphs() -> list[str]:
    from lowbit.data.eval_text import eval_text

    paras = [p.strip() for p in eval_text("wikitext2").split("\n\n")]
    return [p for p in paras if p and not p.startswith("=")]  # " = Heading = " lines are titles


def _zeroshot_contexts(per_task: int) -> list[tuple[str, str]]:
    from lowbit.data.zeroshot import load_task

    out = []
    for task in ZEROSHOT_SOURCES:
        out += [(task, item.pairs[0][0]) for item in load_task(task, limit=per_task)]
    return out


def build_requests(tokenizer, n: int, prompt_max: int, new_min: int, new_max: int, seed: int = 0) -> list[Request]:
    """``n`` requests, alternating WikiText-2 paragraphs and zero-shot questions in a seeded order."""
    if n <= 0:
        raise ValueError(f"need at least one request, got {n}")
    if not 1 <= new_min <= new_max:
        raise ValueError(f"output lengths need 1 <= min <= max, got {new_min}..{new_max}")
    if prompt_max < MIN_PROMPT_TOKENS:
        raise ValueError(f"prompt_max must be at least {MIN_PROMPT_TOKENS} tokens, got {prompt_max}")
    rng = random.Random(seed)
    wiki = _wiki_paragraphs()
    rng.shuffle(wiki)
    shots = _zeroshot_contexts(per_task=max(n, 50))
    rng.shuffle(shots)
    texts = iter([("wikitext2", t) for t in wiki])
    questions = iter(shots)
    reqs: list[Request] = []
    while len(reqs) < n:
        source, text = next(texts) if len(reqs) % 2 == 0 else next(questions)
        ids = tokenizer(text).input_ids[:prompt_max]
        if len(ids) < MIN_PROMPT_TOKENS:
            continue
        new = round(math.exp(rng.uniform(math.log(new_min), math.log(new_max))))
        reqs.append(Request(tuple(int(i) for i in ids), max(new_min, min(new_max, new)), source))
    return reqs


def describe(reqs: list[Request]) -> dict:
    """Lengths of a request list, for the report: prompt and output tokens (min / median / max)."""
    import statistics

    def stats(xs):
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "total": sum(xs)}

    sources = {}
    for r in reqs:
        sources[r.source] = sources.get(r.source, 0) + 1
    return {"count": len(reqs), "prompt_tokens": stats([len(r.prompt_ids) for r in reqs]),
            "output_tokens": stats([r.max_tokens for r in reqs]), "sources": sources}
