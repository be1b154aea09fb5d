"""Two plugin formats of one ``lowbit bench serve --rounds N`` run held against each other round by
round (the two formats of a round ran within a minute of each other; their median rounds may be
different rounds of a drifting machine): output tok/s, the linears' ms a step, and per token range
of the linear calls (``linear_by_tokens``) the second format's µs a token over the first's, with
each range's share of the linears' time.

    .venv/bin/python scripts/serve_pair_ranges.py DIR/serve.json plugin-w8a8 plugin-w4a4
"""

from __future__ import annotations

import json
import statistics
import sys

from lowbit.kernels.op_stats import RANGE_NAMES


def _ms(ranges: dict) -> float:
    return sum(v["us_per_call"] * v["calls"] for v in ranges.values())


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    path, first, second = sys.argv[1:]
    rows = {(r["format"], r["concurrency"]): r for r in json.load(open(path))["rows"] if isinstance(r, dict)}
    for c in sorted({c for f, c in rows if f == first}):
        a, b = rows.get((first, c)), rows.get((second, c))
        if a is None or b is None or "rounds_linear_by_tokens" not in a:
            print(f"concurrency {c}: no rounds of both formats with linears by token range")
            continue
        rate = [y / x for x, y in zip(a["rounds_output_tok_s"], b["rounds_output_tok_s"])]
        lin = [y / x for x, y in zip(a["rounds_linear_ms"], b["rounds_linear_ms"])]
        print(f"concurrency {c}: {second} / {first} output tok/s by round {[round(r, 2) for r in rate]} "
              f"(median {statistics.median(rate):.2f}x), linears' ms a step {[round(r, 2) for r in lin]} "
              f"(median {statistics.median(lin):.2f}x)")
        for k in RANGE_NAMES:
            pairs = [(ra[k], rb[k], ra, rb) for ra, rb in zip(a["rounds_linear_by_tokens"], b["rounds_linear_by_tokens"])
                     if ra and rb and k in ra and k in rb]
            if not pairs:
                continue
            per_token = [(pb["us_per_call"] * pb["calls"] / pb["tokens"]) / (pa["us_per_call"] * pa["calls"] / pa["tokens"])
                         for pa, pb, _, _ in pairs]
            share_a = statistics.median(pa["us_per_call"] * pa["calls"] / _ms(ra) for pa, _, ra, _ in pairs)
            share_b = statistics.median(pb["us_per_call"] * pb["calls"] / _ms(rb) for _, pb, _, rb in pairs)
            size = pairs[0][0]["tokens"] / pairs[0][0]["calls"]
            print(f"  {k:>8} tokens (about {size:6.1f} a call): µs a token {[round(r, 2) for r in per_token]} "
                  f"(median {statistics.median(per_token):.2f}x); share of the linears' time {share_a:.2f} / {share_b:.2f}")


if __name__ == "__main__":
    main()
