"""W4A4 decode with and without down_proj's order folded into gate/up (``accelerate``, stop 46): the
same model built as ``lowbit bench decode`` builds it, accelerated both ways in one process, the
generated tokens checked equal, generation interleaved; tok/s of 32 decode steps (a 34-token
generation minus a 2-token one), medians of 5, at 1 / 8 / 32 sequences of a 64-token prompt.

    .venv/bin/python scripts/down_order_fold_ab.py [--repeats 5] [OUT.json]
"""
from lowbit.bench.decode import _cache_for
from lowbit.bench.decode_ab import ab_setup, decode_rates, greedy, save_rows
from lowbit.data import calibration_ids
import lowbit.accelerate.fuse as fusion


def main() -> None:
    cli, _, tok, build = ab_setup(__doc__, "w4a4", 5)
    folded, _, counts_f, _ = build("w4a4")
    real = fusion.down_input_orders
    fusion.down_input_orders = lambda model: {}
    try:
        plain, _, counts_p, _ = build("w4a4")
    finally:
        fusion.down_input_orders = real
    assert counts_f.get("folded_orders") == 30 and "folded_orders" not in counts_p, (counts_f, counts_p)
    res = {}
    for B in (1, 8, 32):
        ids = calibration_ids(tok, B, 64, seed=1)
        variants = {name: greedy(m, tok, lambda m=m: _cache_for(m, "w4a4")) for name, m in (("folded", folded), ("plain", plain))}
        res[B] = decode_rates(variants, ids, cli.repeats)
        print(B, res[B], flush=True)
    save_rows(cli, __doc__, res)


if __name__ == "__main__":
    main()
