"""Two (or more) variants of one decode, timed side by side in one process: what the A/B scripts
under ``scripts/`` measure (a fusion on or off, a native call or its steps one by one). The
variants first generate the same tokens (else the comparison is refused), then alternate inside
every repeat (the order reversed every other one), so a drift of a shared machine hits both.
A rate is 32 decode steps: the time of a ``2 + new``-token generation minus a 2-token one."""

from __future__ import annotations

import argparse
import statistics
import time
import types
from typing import Callable

import torch

Generate = Callable[[torch.Tensor, int], torch.Tensor]


def greedy(model, tokenizer, cache_factory: Callable[[], object]) -> Generate:
    """``gen(ids, n)``: ``n`` greedy tokens after ``ids`` with a fresh cache from ``cache_factory``."""

    def gen(ids: torch.Tensor, n: int) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                  min_new_tokens=n, do_sample=False, cache=cache_factory(),
                                  pad_token_id=tokenizer.eos_token_id)

    return gen


def decode_rates(variants: dict[str, Generate], ids: torch.Tensor, repeats: int, new: int = 32) -> dict:
    """Decode tok/s of each variant on the prompts ``ids`` (one row a sequence): medians of
    ``repeats``, the raw rates, and for the first two variants the ratio of their medians and the
    median of their per-repeat ratios (``paired``)."""
    if len(variants) < 2 or repeats < 1:
        raise ValueError("decode_rates compares two or more variants over at least one repeat")
    names = list(variants)
    first = {name: variants[name](ids, 8) for name in names}
    for name in names[1:]:
        if not torch.equal(first[name], first[names[0]]):
            raise RuntimeError(f"{name!r} generates other tokens than {names[0]!r}: not the same decode, no A/B")
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            variants[name](ids, 2)
            t1 = time.perf_counter()
            variants[name](ids, 2 + new)
            t2 = time.perf_counter()
            rates[name].append(ids.shape[0] * new / ((t2 - t1) - (t1 - t0)))
    a, b = names[:2]
    row = {f"{name}_tok_s": statistics.median(v) for name, v in rates.items()}
    row["ratio"] = row[f"{a}_tok_s"] / row[f"{b}_tok_s"]
    row["paired"] = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
    row["raw_tok_s"] = rates
    return row


def ab_setup(doc: str, formats: str, repeats: int, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    """What every A/B script starts from: its command line (``--formats``, ``--repeats``, an
    optional ``OUT.json``, and what ``extra`` adds), 2 threads, the default model in float32, and the arguments with which
    ``build`` makes a format as ``lowbit bench decode`` does (RTN on 4 x 128 calibration tokens).
    Returns (cli, base model, tokenizer, build) with ``build(fmt)`` -> (model, bytes, counts, s)."""
    from lowbit.bench.decode import _make_model
    from lowbit.checkpoint import load_model

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default=formats)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("out", nargs="?")
    if extra is not None:
        extra(ap)
    cli = ap.parse_args()
    torch.set_num_threads(2)
    base, tok = load_model("default", dtype=torch.float32, device="cpu")
    base.eval()
    args = types.SimpleNamespace(gptq=False, calib="4x128", kernel=None, stock_ops=False)
    return cli, base, tok, lambda fmt: _make_model(base, fmt, tok, args, torch.device("cpu"))


def save_rows(cli, doc: str, rows: dict) -> None:
    """``rows`` with the machine and the protocol into ``cli.out`` (when given), atomically."""
    if cli.out:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json

        write_json(cli.out, {"machine": report(), "what": doc, "repeats": cli.repeats, "prompt": 64, "new": 32,
                             "threads": 2, "rows": rows})


def as_is_against(cli, tokenizer, build, names: tuple[str, str], context) -> dict:
    """For each of ``cli.formats``: the model as built, decoding as it is (``names[0]``) and inside
    ``context()`` (``names[1]``: a swapped kernel, a path turned off), at 1 / 8 / 32 sequences of a
    64-token prompt; the rows of :func:`decode_rates`, printed as they come."""
    from lowbit.bench.decode import _cache_for
    from lowbit.data import calibration_ids

    res = {}
    for fmt in cli.formats.split(","):
        model = build(fmt)[0]
        plain = greedy(model, tokenizer, lambda m=model, f=fmt: _cache_for(m, f))

        def inside(ids, n, plain=plain):
            with context():
                return plain(ids, n)

        res[fmt] = {}
        for B in (1, 8, 32):
            row = decode_rates({names[0]: plain, names[1]: inside}, calibration_ids(tokenizer, B, 64, seed=1), cli.repeats)
            res[fmt][B] = row
            print(fmt, B, {k: v for k, v in row.items() if k != "raw_tok_s"}, flush=True)
    return res
