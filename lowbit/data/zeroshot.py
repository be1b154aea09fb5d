"""Zero-shot task readers: turn the shared JSONL files into log-likelihood requests.

Every item becomes a list of ``(context, continuation)`` pairs, one per choice, formatted as
lm-evaluation-harness 0.4 formats the same tasks so that the numbers are comparable:

* PIQA, ARC-Easy, ARC-Challenge, BoolQ (``{"query","choices","gold"}`` from llm-foundry's
  local_data): context = ``query`` with trailing whitespace removed + ``"\\nAnswer:"``;
  continuation = ``" " + choice`` (the harness's target delimiter is one space). PIQA and ARC
  queries are ``"Question: ..."``, so the context equals the harness's ``"Question: {q}\\nAnswer:"``;
  BoolQ's query is ``"Passage: {p}\\nQuestion: {q}?"`` (the harness omits ``"Passage: "``).
* WinoGrande (``{"context_options","continuation","gold"}``): partial scoring. One pair per
  option, context = the sentence up to the blank with that option filled in; continuation =
  ``" " + continuation`` (the rest of the sentence), as in the harness's ``winogrande`` task.
* LAMBADA OpenAI (``{"context","continuation"}``): one pair, continuation = ``" " + last word``;
  the item is correct when greedy decoding reproduces every continuation token.
* A user's multiple-choice set: a task given as a path to a ``.jsonl`` file of
  ``{"query","choices","gold"}`` lines, formatted and scored as PIQA/ARC are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .paths import data_file

TASK_FILES = {
    "piqa": "zeroshot/piqa.jsonl",
    "arc_easy": "zeroshot/arc_easy.jsonl",
    "arc_challenge": "zeroshot/arc_challenge.jsonl",
    "boolq": "zeroshot/boolq.jsonl",
    "winogrande": "zeroshot/winogrande.jsonl",
    "lambada_openai": "zeroshot/lambada_openai.jsonl",
}
TASK_ALIASES = {"arc_e": "arc_easy", "arc-easy": "arc_easy", "arc_c": "arc_challenge", "arc-challenge": "arc_challenge", "lambada": "lambada_openai"}
TASKS = tuple(TASK_FILES)
TARGET_DELIMITER = " "


class UnknownTaskError(ValueError):
    """A task name lowbit does not know."""


@dataclass(frozen=True)
class ZeroShotItem:
    """One question: its log-likelihood requests and how to score them.

    ``kind`` is "choice" (argmax over the pairs; ``choice_texts`` are the bare choices whose
    character lengths normalise acc_norm), or "greedy" (one pair, correct if greedy decoding
    reproduces the continuation).
    """

    pairs: tuple[tuple[str, str], ...]
    gold: int
    kind: str
    choice_texts: tuple[str, ...]


def is_user_set(name: str) -> bool:
    """A task named by a file path (``*.jsonl`` or containing a path separator), not a shipped task."""
    return name.endswith(".jsonl") or os.sep in name


def canonical_task(name: str) -> str:
    """The shipped task's canonical name, or a user's set's path (which must exist)."""
    if is_user_set(name):
        if not Path(name).is_file():
            raise FileNotFoundError(f"zero-shot set not found: {name} (a user's set is a .jsonl file of "
                                    '{"query", "choices", "gold"} lines)')
        return name
    key = name.strip().lower()
    key = TASK_ALIASES.get(key, key)
    if key not in TASK_FILES:
        raise UnknownTaskError(f"unknown zero-shot task {name!r}; known tasks: {', '.join(TASKS)}")
    return key


def _check(obj: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")


def parse_item(task: str, obj: dict, where: str = "item") -> ZeroShotItem:
    """Turn one JSON object of ``task`` into a :class:`ZeroShotItem` (clear error if malformed)."""
    if not is_user_set(task):
        task = canonical_task(task)
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    d = TARGET_DELIMITER
    if task == "winogrande":
        _check(obj, ("context_options", "continuation", "gold"), where)
        opts = list(obj["context_options"])
        cont = obj["continuation"].strip()
        pairs = tuple((c, d + cont) for c in opts)
        texts = tuple(cont for _ in opts)
        gold = int(obj["gold"])
        kind = "choice"
    elif task == "lambada_openai":
        _check(obj, ("context", "continuation"), where)
        ctx, cont = obj["context"], obj["continuation"].strip()
        pairs, texts, gold, kind = ((ctx.rstrip(), d + cont),), (cont,), 0, "greedy"
    else:
        _check(obj, ("query", "choices", "gold"), where)
        if not isinstance(obj["query"], str) or not isinstance(obj["choices"], list):
            raise ValueError(f"{where}: 'query' must be a string and 'choices' a list")
        if not isinstance(obj["gold"], int) or isinstance(obj["gold"], bool):
            raise ValueError(f"{where}: 'gold' must be an integer index, got {obj['gold']!r}")
        ctx = obj["query"].rstrip() + "\nAnswer:"
        choices = [str(c) for c in obj["choices"]]
        pairs = tuple((ctx, d + c) for c in choices)
        texts, gold, kind = tuple(choices), int(obj["gold"]), "choice"
    if not pairs:
        raise ValueError(f"{where}: no choices")
    if not 0 <= gold < len(pairs):
        raise ValueError(f"{where}: gold index {gold} out of range for {len(pairs)} choices")
    return ZeroShotItem(pairs=pairs, gold=gold, kind=kind, choice_texts=texts)


def load_task(task: str, limit: int | None = None, path: str | Path | None = None) -> list[ZeroShotItem]:
    """The first ``limit`` items (all when None) of ``task``, read from the shared data or ``path``
    (a user's set is its own path)."""
    task = canonical_task(task)
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    file = Path(path) if path is not None else Path(task) if is_user_set(task) else data_file(TASK_FILES[task])
    if not file.is_file():
        raise FileNotFoundError(f"zero-shot data file not found: {file}")
    items: list[ZeroShotItem] = []
    with open(file, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}:{lineno}: not valid JSON ({e})") from e
            items.append(parse_item(task, obj, f"{file}:{lineno}"))
            if limit is not None and len(items) >= limit:
                break
    if not items:
        raise ValueError(f"{file} holds no items")
    return items
