"""``lowbit tune allreduce``: measure the link and the codecs, fit the cost model, write the size table.

For each world size it launches local ranks, times plain ``dist.all_reduce`` over a range of
message sizes (fit: latency a, bus bandwidth B) and each codec's encode/decode cost per element,
then solves the cost model (``lowbit.comm.costmodel``) for the crossover size of every
(codec, world size, dtype). QuickAllReduce loads the table from ~/.cache/lowbit/quickreduce.json
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
    a.add_argument("--sizes", type=size_list, default="64K..16M", help="message sizes timed for the link fit")
    a.add_argument("--codec-elements", type=positive_int, default=1 << 20)
    a.add_argument("--repeats", type=positive_int, default=5)
    a.add_argument("--max-bytes", default="inf", help="upper end of the quantize window written to the table")
    a.add_argument("--timeout", type=positive_float, default=300.0)
    a.add_argument("--out", type=Path, default=None, help="table path (default: ~/.cache/lowbit/quickreduce.json)")
    a.set_defaults(func=run)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run(args: argparse.Namespace) -> int:
    import math

    import torch
    from rich.console import Console
    from rich.table import Table

    from lowbit.bench.allreduce import parse_sizes
    from lowbit.bench.report import fmt_bytes
    from lowbit.comm.codecs import get_codec
    from lowbit.comm.costmodel import CodecCost, crossover_bytes, fit_link
    from lowbit.parallel.launch import check_results, run_ranks
    from lowbit.bench.allreduce_timing import DTYPES, tune_measure
    from lowbit.comm.policy import NO_MAX, parse_bytes, save_table, table_key
    from lowbit.errors import UsageError
    from lowbit.io.outputs import check_output_file

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
    max_bytes = parse_bytes(args.max_bytes)
    entries, links = {}, {}
    table = Table(title="quick all-reduce size policy (cost model fitted to this machine)")
    for col in ("world", "dtype", "codec", "latency us", "bus GB/s", "min bytes (crossover)"):
        table.add_column(col, justify="right")
    for w in worlds:
        m = check_results(run_ranks(tune_measure, w, sizes, codecs, dtypes, args.repeats, args.codec_elements,
                                    timeout_s=args.timeout, deadline_s=24 * 3600))[0]
        for d in dtypes:
            pts = m["plain"][d]
            link = fit_link([float(s) for s, _ in pts], [t for _, t in pts], w)
            links[f"w{w}/{d}"] = {"alpha_s": link.alpha_s, "bus_bytes_per_s": link.bus_bytes_per_s, "points": pts}
            es = torch.tensor([], dtype=DTYPES[d]).element_size()
            for c in codecs:
                enc, dec = m["codec"][f"{c}/{d}"]
                cost = CodecCost(enc, dec)
                cross = crossover_bytes(es, get_codec(c).ratio(DTYPES[d]), link, cost)
                lo = NO_MAX if math.isinf(cross) else int(math.ceil(cross))
                entries[table_key(c, w, DTYPES[d])] = {
                    "min_bytes": lo, "max_bytes": max_bytes, "encode_s_per_elem": enc, "decode_s_per_elem": dec,
                    "alpha_s": link.alpha_s, "bus_bytes_per_s": link.bus_bytes_per_s,
                }
                table.add_row(str(w), d, c, f"{link.alpha_s * 1e6:.1f}", f"{link.bus_bytes_per_s / 1e9:.3f}",
                              "never (codec slower than the link saving)" if lo >= NO_MAX else fmt_bytes(lo))
    meta = {"world_sizes": worlds, "sizes": sizes, "repeats": args.repeats, "links": links,
            "torch": torch.__version__, "note": "min_bytes = cost-model crossover; quick path iff min<=bytes<=max"}
    path = save_table(entries, meta, args.out)
    console = Console()
    console.print(table)
    console.print(f"wrote {path}")
    return 0
