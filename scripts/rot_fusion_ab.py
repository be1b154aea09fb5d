"""The ``-rot`` presets' decode with and without fusion (``accelerate``, stop 47): siblings that
share an input and its block Hadamard (q/k/v, gate/up) as one transform and one kernel call, and
down_proj's order folded into gate/up, against one transform and one call per linear (what
``accelerate`` did for these presets before). The same model built as ``lowbit bench decode``
builds it, accelerated both ways in one process, the generated tokens checked equal, generation
interleaved (the order alternating); tok/s of 32 decode steps (a 34-token generation minus a
2-token one), medians of 7, at 1 / 8 / 32 sequences of a 64-token prompt.

    .venv/bin/python scripts/rot_fusion_ab.py [--formats w4a4-rot,w4a4-kv4-rot] [--repeats 7] [OUT.json]
"""
from lowbit.bench.decode import _cache_for
from lowbit.bench.decode_ab import ab_setup, decode_rates, greedy, save_rows
from lowbit.data import calibration_ids
import lowbit.accelerate.fuse as fusion


def _unfused(build, fmt):
    real = fusion.shared_input_groups, fusion.down_input_orders
    fusion.shared_input_groups, fusion.down_input_orders = (lambda model: []), (lambda model: {})
    try:
        return build(fmt)
    finally:
        fusion.shared_input_groups, fusion.down_input_orders = real


def main() -> None:
    cli, _, tok, build = ab_setup(__doc__, "w4a4-rot,w4a4-kv4-rot", 7)
    res = {}
    for fmt in cli.formats.split(","):
        fused, _, counts_f, _ = build(fmt)
        plain, _, counts_p, _ = _unfused(build, fmt)
        assert counts_f.get("fused_groups") == 60 and counts_f.get("folded_orders") == 30, counts_f
        assert "fused_groups" not in counts_p, counts_p
        res[fmt] = {"counts_fused": counts_f, "counts_plain": counts_p}
        for B in (1, 8, 32):
            ids = calibration_ids(tok, B, 64, seed=1)
            variants = {name: greedy(m, tok, lambda m=m: _cache_for(m, fmt)) for name, m in (("fused", fused), ("plain", plain))}
            res[fmt][B] = decode_rates(variants, ids, cli.repeats)
            print(fmt, B, res[fmt][B], flush=True)
        del fused, plain
    save_rows(cli, __doc__, res)


if __name__ == "__main__":
    main()
