"""The all-reduce codecs' C library (``lowbit/comm/codecs/csrc``) at a git revision against the working
tree's, in one process: the calls of both builds and a memory copy of the same input interleaved
in shuffled order every round, the same bytes asserted, medians. How a codec change is measured on
a machine whose memory bandwidth drifts by a third between runs (``lowbit bench codecs`` times the
copy beside each codec for the same reason).

    .venv/bin/python scripts/codecs_rev_ab.py --rev HEAD [--codecs int4,int4+h,...] [--wires 1,2]
        [--repeats 15] [--json OUT]

Per codec: encode (with a channel plan, ``ChannelPlan.encode``'s fused row: outliers out, block
Hadamard, codes) and decode (plain: into bf16; with a plan: ``decode_merge`` of ``--wires`` wires,
the one-shot all-reduce's local step at that many ranks), 16 M bf16 values, hidden 576, 1 thread.
Either build's AVX-512 integer codes follow ``LOWBIT_QR_DIVIDE`` / the CPU vendor where it has the
switch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from batched_gemm_ab import build_at  # noqa: E402


def _library_at(rev: str, work: Path) -> ctypes.CDLL:
    """The codec library built from ``rev``'s sources (its csrc and the shared headers it includes)."""
    from lowbit.comm.codecs import native

    lib = build_at(rev, work, "lowbit/comm/codecs/csrc", native._LIB)
    if hasattr(lib, "qr_set_divide_codes"):
        native._bind(lib)
    else:  # before the switch: today's signatures of the entry points called here
        for name in ("qr_encode", "qr_decode", "qr_encode_split", "qr_decode_merge"):
            fn, ref = getattr(lib, name), getattr(native._LIB.get(), name)
            fn.argtypes, fn.restype = ref.argtypes, ref.restype
    return lib


def _calls(spec, x: torch.Tensor, hidden: int, wires: int, lib):
    """(encode, decode) of one build for ``spec`` on x, each returning what it wrote."""
    from lowbit.comm.channels import ChannelPlan, spread_channels
    from lowbit.comm.codecs import native

    c = spec.codec
    kind = 0 if c.kind == "int" else 1
    rows = -(-x.numel() // 2048)
    wire = torch.empty(rows, c.row_bytes, dtype=torch.uint8)
    out = torch.empty_like(x)
    if spec.plain_codec:
        def enc():
            return native.encode_rows(x, kind, c.bits, rows, c.row_bytes, c.code_bytes, out=wire, lib=lib)

        def dec():
            return native.decode_rows(wire, kind, c.bits, c.row_bytes, c.code_bytes, x.numel(), x.dtype, out=out, lib=lib)
        return enc, dec
    plan = ChannelPlan.make(spec, hidden, spread_channels(spec.outliers, hidden) if spec.outliers else None)
    n = plan.channels.numel()
    outl = torch.empty(x.numel() // hidden, n, dtype=x.dtype)
    osum = torch.randn(x.numel() // hidden, n, generator=torch.Generator().manual_seed(1)) * 100

    def enc():
        native.encode_split(x, hidden, plan.channels, n, plan.block, plan.scale, kind, c.bits, c.row_bytes,
                            c.code_bytes, wire, outl, lib=lib)
        return wire

    def dec():
        return native.decode_merge_channels([wire] * wires, kind, c.bits, c.row_bytes, c.code_bytes, hidden,
                                            plan.channels, n, plan.block, plan.scale, osum if n else None, out, lib=lib)
    return enc, dec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="the revision to compare with")
    ap.add_argument("--codecs", default="int4,int8,int4+h,int4+o16,int4+h+o16")
    ap.add_argument("--wires", default="1,2", help="wires summed by the channel options' decode (ranks)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from lowbit.comm.codecs import native, parse_spec
    from lowbit.bench.machine import report

    torch.set_num_threads(1)
    hidden = 576
    x = (torch.randn((16 << 20) // hidden * hidden, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    nbytes = x.numel() * 2
    y = torch.empty_like(x)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old, new = _library_at(args.rev, Path(tmp)), native._LIB.get()
        for name in [s for s in args.codecs.split(",") if s]:
            spec = parse_spec(name)
            for wires in ([1] if spec.plain_codec else [int(w) for w in args.wires.split(",")]):
                calls = {"old": _calls(spec, x, hidden, wires, old), "new": _calls(spec, x, hidden, wires, new)}
                got = {b: [f().clone() for f in fs] for b, fs in calls.items()}
                assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got["old"], got["new"])), name
                jobs = [(b, k, f) for b, fs in calls.items() for k, f in zip(("enc", "dec"), fs)]
                jobs.append(("copy", "copy", lambda: y.copy_(x)))
                ts = {(b, k): [] for b, k, _ in jobs}
                for _ in range(args.repeats):
                    random.shuffle(jobs)
                    for b, k, f in jobs:
                        t0 = time.perf_counter()
                        f()
                        ts[(b, k)].append(time.perf_counter() - t0)
                med = {key: statistics.median(v) for key, v in ts.items()}
                row = {"codec": name, "wires": wires, "copy_GBps": nbytes / med[("copy", "copy")] / 1e9}
                for b in ("old", "new"):
                    row |= {f"{b}_encode_GBps": nbytes / med[(b, "enc")] / 1e9, f"{b}_decode_GBps": nbytes / med[(b, "dec")] / 1e9,
                            f"{b}_vs_copy": med[("copy", "copy")] / (med[(b, "enc")] + med[(b, "dec")])}
                rows.append(row)
                print(f"{name:12s} wires {wires}: encode {row['old_encode_GBps']:.2f} -> {row['new_encode_GBps']:.2f} GB/s, "
                      f"decode {row['old_decode_GBps']:.2f} -> {row['new_decode_GBps']:.2f} GB/s, enc+dec vs copy "
                      f"{100 * row['old_vs_copy']:.1f}% -> {100 * row['new_vs_copy']:.1f}% (copy {row['copy_GBps']:.2f} GB/s)",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps({"meta": {"rev": args.rev, "repeats": args.repeats, "machine": report(),
                                                  "divide_codes": native.divide_codes()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
