"""``lowbit tune allreduce``: time the three all-reduce paths, fit the cost model, write the size table.

For each world size it launches local ranks and times plain ``dist.all_reduce``, the one-shot
and the two-shot quantized paths over a range of message sizes, and each codec's encode/decode
cost; ``lowbit.comm.costmodel.table_entries`` fits a line per path and derives the window of
every (codec, world size, dtype). This module only parses and prints. QuickAllReduce loads the table from ~/.cache/lowbit/quickreduce.json
(or LOWBIT_QR_TABLE); constructor arguments and LOWBIT_QR_MIN_BYTES/MAX_BYTES override it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lowbit.commands.argtypes import codec_list, int_list, positive_float, positive_int, size_list


def register(sub) -> None:
    p = sub.add_parser("tune", help="measure and write tuned tables (all-reduce size policy)")
    kinds = p.add_subparsers(dest="tune", metavar="WHAT")
    a = kinds.add_parser("allreduce", help="fit the quick all-reduce cost model and write the size table")
    a.add_argument("--world-sizes", type=int_list, default="2", help="comma list, e.g. 2,4")
    a.add_argument("--codecs", type=codec_list, default="fp,int8,int6,int4,int3,fp4")
    a.add_argument("--dtypes", default="bfloat16,float16,float32")
    a.add_argument("--sizes", type=size_list, default="4K..16M", help="message sizes timed for the fits (small ones set the latencies)")
    a.add_argument("--codec-elements", type=positive_int, default=1 << 20)
    a.add_argument("--repeats", type=positive_int, default=5)
    a.add_argument("--max-bytes", default="inf", help="upper end of the quantize window written to the table")
    a.add_argument("--timeout", type=positive_float, default=300.0)
    a.add_argument("--out", type=Path, default=None, help="table path (default: ~/.cache/lowbit/quickreduce.json)")
    a.set_defaults(func=run)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from lowbit.bench.allreduce import parse_sizes
    from lowbit.bench.allreduce_timing import DTYPES, tune_measure
    from lowbit.bench.report import fmt_bytes
    from lowbit.comm.codecs import get_codec
    from lowbit.comm.costmodel import table_entries
    from lowbit.comm.policy import NO_MAX, parse_bytes, save_table
    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_file
    from lowbit.parallel.launch import check_results, run_ranks

    check_output_file(args.out, "--out")
    worlds = [int(w) for w in args.world_sizes.split(",") if w.strip()]
    if any(w < 2 for w in worlds):
        raise UsageError("--world-sizes: world sizes must be >= 2")
    codecs = [get_codec(c.strip()).name for c in args.codecs.split(",") if c.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"--dtypes: unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    sizes = parse_sizes(args.sizes)
    if len(set(sizes)) < 2:
        raise UsageError("--sizes: the fit needs at least two different message sizes")
    max_bytes = parse_bytes(args.max_bytes)
    entries, links = {}, {}
    for w in worlds:
        m = check_results(run_ranks(tune_measure, w, sizes, codecs, dtypes, args.repeats, args.codec_elements,
                                    timeout_s=args.timeout, deadline_s=24 * 3600))[0]
        e, lk = table_entries(m, w, codecs, {d: DTYPES[d] for d in dtypes}, max_bytes, NO_MAX)
        entries |= e
        links |= lk
    meta = {"world_sizes": worlds, "sizes": sizes, "repeats": args.repeats, "links": links,
            "torch": torch.__version__,
            "note": "per path t = alpha_s + s_per_byte*S fitted to timed calls; plain below min_bytes and above "
                    "max_bytes, one-shot in [min_bytes, twoshot_min_bytes), two-shot from twoshot_min_bytes"}
    path = save_table(entries, meta, args.out)
    table = Table(title="quick all-reduce size policy (three paths timed on this machine)")
    for col in ("key", "plain us", "one-shot us", "two-shot us", "quantize from", "two-shot from", "up to"):
        table.add_column(col, justify="right")

    def size(b: int) -> str:
        return "never" if b >= NO_MAX else fmt_bytes(b)

    for key, ent in entries.items():
        lat = [f"{ent['paths'][p]['alpha_s'] * 1e6:.1f}" for p in ("plain", "oneshot", "twoshot")]
        table.add_row(key, *lat, size(ent["min_bytes"]), size(ent["twoshot_min_bytes"]), size(ent["max_bytes"]))
    console = Console()
    console.print(table)
    console.print(f"wrote {path}")
    return 0
