"""W4A4 decode with and without down_proj's order folded into gate/up (``accelerate``, stop 46): the
same model built as ``lowbit bench decode`` builds it, accelerated both ways in one process, the
generated tokens checked equal, generation interleaved; tok/s of 32 decode steps (a 34-token
generation minus a 2-token one), medians of 5, at 1 / 8 / 32 sequences of a 64-token prompt.

    .venv/bin/python scripts/down_order_fold_ab.py [OUT.json]
"""
import statistics
import sys
import time
import types

import torch
from lowbit.checkpoint import load_model
from lowbit.bench.decode import _make_model, _cache_for
from lowbit.data import calibration_ids
import lowbit.accelerate.fuse as fusion


def main() -> None:
    torch.set_num_threads(2)
    base, tok = load_model("default", dtype=torch.float32, device="cpu")
    base.eval()
    args = types.SimpleNamespace(gptq=False, calib="4x128", kernel=None, stock_ops=False)
    folded, _, counts_f, _ = _make_model(base, "w4a4", tok, args, torch.device("cpu"))
    real = fusion.down_input_orders
    fusion.down_input_orders = lambda model: {}
    plain, _, counts_p, _ = _make_model(base, "w4a4", tok, args, torch.device("cpu"))
    fusion.down_input_orders = real
    assert counts_f.get("folded_orders") == 30 and "folded_orders" not in counts_p, (counts_f, counts_p)
    pad = tok.eos_token_id
    res = {}
    for B in (1, 8, 32):
        ids = calibration_ids(tok, B, 64, seed=1)
        def gen(m, n):
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, cache=_cache_for(m, "w4a4"), pad_token_id=pad)
            return time.perf_counter() - t0, out
        _, a = gen(folded, 8); _, b = gen(plain, 8)
        assert torch.equal(a, b)
        rates = {"folded": [], "plain": []}
        for r in range(5):
            for name, m in (("folded", folded), ("plain", plain)) if r % 2 == 0 else (("plain", plain), ("folded", folded)):
                t2, _ = gen(m, 2); tn, _ = gen(m, 34)
                rates[name].append(B * 32 / (tn - t2))
        med = {k: statistics.median(v) for k, v in rates.items()}
        res[B] = {"folded_tok_s": med["folded"], "plain_tok_s": med["plain"], "ratio": med["folded"] / med["plain"],
                  "paired": statistics.median(f / p for f, p in zip(rates["folded"], rates["plain"]))}
        print(B, res[B], flush=True)
    if len(sys.argv) > 1:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json
        write_json(sys.argv[1], {"machine": report(), "what": __doc__, "repeats": 5, "prompt": 64, "new": 32, "threads": 2, "rows": res})


if __name__ == "__main__":
    main()
