"""One benchmark point from per-request records (vLLM's server and lowbit's loop write the same
ones): output tokens/s over the point's wall time, TTFT and inter-token latency percentiles."""

from __future__ import annotations


def percentile(xs: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default); None if empty."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(records: list[dict], wall_s: float) -> dict:
    """Totals and percentiles of one point; latencies in milliseconds."""
    ok = [r for r in records if r["error"] is None]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    lat = [r["latency"] for r in ok]
    out_tokens = sum(r["output_tokens"] for r in ok)

    def ms(v):
        return None if v is None else v * 1000

    return {"requests": len(records), "failed": len(records) - len(ok), "output_tokens": out_tokens,
            "prompt_tokens": sum(r["prompt_tokens"] for r in ok), "wall_s": wall_s,
            "output_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
            "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
            "itl_p50_ms": ms(percentile(itl, 50)), "itl_p99_ms": ms(percentile(itl, 99)),
            "latency_p50_s": percentile(lat, 50)}
