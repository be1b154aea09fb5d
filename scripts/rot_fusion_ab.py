"""The ``-rot`` presets' decode with and without fusion (``accelerate``, stop 47): siblings that
share an input and its block Hadamard (q/k/v, gate/up) as one transform and one kernel call, and
down_proj's order folded into gate/up, against one transform and one call per linear (what
``accelerate`` did for these presets before). The same model built as ``lowbit bench decode``
builds it, accelerated both ways in one process, the generated tokens checked equal, generation
interleaved (the order alternating); tok/s of 32 decode steps (a 34-token generation minus a
2-token one), medians of 7, at 1 / 8 / 32 sequences of a 64-token prompt.

    .venv/bin/python scripts/rot_fusion_ab.py [--formats w4a4-rot,w4a4-kv4-rot] [--repeats 7] [OUT.json]
"""
import argparse
import statistics
import time
import types

import torch
from lowbit.checkpoint import load_model
from lowbit.bench.decode import _make_model, _cache_for
from lowbit.data import calibration_ids
import lowbit.accelerate.fuse as fusion


def _unfused(base, fmt, tok, args):
    real = fusion.shared_input_groups, fusion.down_input_orders
    fusion.shared_input_groups, fusion.down_input_orders = (lambda model: []), (lambda model: {})
    try:
        return _make_model(base, fmt, tok, args, torch.device("cpu"))
    finally:
        fusion.shared_input_groups, fusion.down_input_orders = real


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="w4a4-rot,w4a4-kv4-rot")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("out", nargs="?")
    cli = ap.parse_args()
    torch.set_num_threads(2)
    base, tok = load_model("default", dtype=torch.float32, device="cpu")
    base.eval()
    args = types.SimpleNamespace(gptq=False, calib="4x128", kernel=None, stock_ops=False)
    pad = tok.eos_token_id
    res = {}
    for fmt in cli.formats.split(","):
        fused, _, counts_f, _ = _make_model(base, fmt, tok, args, torch.device("cpu"))
        plain, _, counts_p, _ = _unfused(base, fmt, tok, args)
        assert counts_f.get("fused_groups") == 60 and counts_f.get("folded_orders") == 30, counts_f
        assert "fused_groups" not in counts_p, counts_p
        res[fmt] = {"counts_fused": counts_f, "counts_plain": counts_p}
        for B in (1, 8, 32):
            ids = calibration_ids(tok, B, 64, seed=1)

            def gen(m, n):
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                     min_new_tokens=n, do_sample=False, cache=_cache_for(m, fmt), pad_token_id=pad)
                return time.perf_counter() - t0, out

            _, a = gen(fused, 8)
            _, b = gen(plain, 8)
            assert torch.equal(a, b)
            rates = {"fused": [], "plain": []}
            for r in range(cli.repeats):
                order = (("fused", fused), ("plain", plain)) if r % 2 == 0 else (("plain", plain), ("fused", fused))
                for name, m in order:
                    t2, _ = gen(m, 2)
                    tn, _ = gen(m, 34)
                    rates[name].append(B * 32 / (tn - t2))
            med = {k: statistics.median(v) for k, v in rates.items()}
            res[fmt][B] = {"fused_tok_s": med["fused"], "plain_tok_s": med["plain"],
                           "ratio": med["fused"] / med["plain"],
                           "paired": statistics.median(f / p for f, p in zip(rates["fused"], rates["plain"])),
                           "raw_tok_s": rates}
            print(fmt, B, res[fmt][B], flush=True)
        del fused, plain
    if cli.out:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json
        write_json(cli.out, {"machine": report(), "what": __doc__, "repeats": cli.repeats, "prompt": 64, "new": 32,
                             "threads": 2, "rows": res})


if __name__ == "__main__":
    main()
