"""``lowbit bench codecs``: encode/decode throughput of every all-reduce codec on one core,
next to a plain memory copy of the same tensor measured in the same run."""

from __future__ import annotations

from pathlib import Path



def _median_time(fn, repeats: int, sync) -> float:
    import statistics
    import time

    fn()
    ts = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run(args) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from lowbit.comm.codecs import decode_torch, encode_torch, native, parse_spec
    from lowbit.comm.codecs.device import decode, encode, uses_triton
    from lowbit.bench.allreduce_timing import DTYPES
    from lowbit.io.outputs import check_output_dir

    from .report import write_csv, write_json

    check_output_dir(args.out, "--out")
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    dtype = DTYPES[args.dtype]
    x = torch.randn(args.elements, device=dev).to(dtype)
    nbytes = x.numel() * x.element_size()
    enc, dec = (encode, decode) if args.impl == "auto" else (encode_torch, decode_torch)
    impl = "torch (vectorised)"
    if args.impl == "auto" and dev.type == "cpu" and native.available():
        impl = {512: "C (AVX-512)", 256: "C (AVX2)"}.get(native.simd_width(), "C (fused)")
    y = torch.empty_like(x)
    copy_s = _median_time(lambda: y.copy_(x), args.repeats, sync)
    copy_gbs = nbytes / copy_s / 1e9
    rows = []
    for name in [c.strip() for c in args.codecs.split(",") if c.strip()]:
        spec = parse_spec(name)
        c = spec.codec
        if not spec.plain_codec:
            rows.append(_channel_row(spec, x, y, args.hidden, args.repeats, sync, impl, copy_gbs))
            continue
        row_impl = "Triton (fused)" if args.impl == "auto" and uses_triton(x, c) else impl
        w = enc(x, c)
        if args.impl == "auto":  # into a kept buffer, as QuickAllReduce does
            wbuf = torch.empty_like(w)
            te = _median_time(lambda: enc(x, c, out=wbuf), args.repeats, sync)
        else:
            te = _median_time(lambda: enc(x, c), args.repeats, sync)
        # decode into a preallocated tensor of the input dtype, as the all-reduce's last step does
        if args.impl == "auto":
            td = _median_time(lambda: dec(w, c, x.numel(), dtype, out=y), args.repeats, sync)
        else:
            td = _median_time(lambda: y.copy_(dec(w, c, x.numel(), dtype)), args.repeats, sync)
        both = nbytes / (te + td) / 1e9
        rows.append({
            "codec": spec.name, "impl": row_impl, "wire_ratio": round(c.ratio(dtype), 3),
            "encode_GBps": nbytes / te / 1e9, "decode_GBps": nbytes / td / 1e9, "enc_dec_GBps": both,
            "copy_GBps": copy_gbs, "enc_dec_vs_copy": both / copy_gbs,
        })
    table = Table(title=f"codec throughput, {args.elements} x {args.dtype}, {args.threads} thread(s), {dev}; "
                        f"copy {copy_gbs:.2f} GB/s (input bytes per second)")
    for col in ("codec", "impl", "bytes ratio", "encode GB/s", "decode GB/s", "enc+dec GB/s", "vs copy"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["codec"], r["impl"], f"{r['wire_ratio']:.2f}x", f"{r['encode_GBps']:.3f}", f"{r['decode_GBps']:.3f}",
                      f"{r['enc_dec_GBps']:.3f}", f"{100 * r['enc_dec_vs_copy']:.1f}%")
    console = Console()
    console.print(table)
    write_csv(args.out / "codecs.csv", rows)
    write_json(args.out / "codecs.json", {"meta": vars(args) | {"out": str(args.out), "func": None}, "rows": rows})
    _plot(rows, args.out / "codecs.png", copy_gbs)
    console.print(f"wrote {args.out}/codecs.csv, codecs.json, codecs.png")
    return 0


def _channel_row(spec, x, y, hidden: int, repeats: int, sync, impl: str, copy_gbs: float) -> dict:
    """What the one-shot all-reduce does around the codec for ``int4+h+o16``-style specs, timed as
    one codec: encode = outliers out, zeroed, block Hadamard and the codec, fused per row
    (``ChannelPlan.encode``); decode = decode + merge (inverse Hadamard, outlier sums in, one cast),
    fused per row (``ChannelPlan.decode_merge``), into kept buffers. Channels spread evenly (random data has no special ones); whole
    tokens of ``hidden`` values."""
    import torch

    from lowbit.comm.channels import ChannelPlan, spread_channels
    from lowbit.comm.codecs import encode

    tokens = x.numel() // hidden
    xs, ys = x[: tokens * hidden].view(tokens, hidden), y[: tokens * hidden].view(tokens, hidden)
    plan = ChannelPlan.make(spec, hidden, spread_channels(spec.outliers, hidden) if spec.outliers else None)
    wire = encode(xs.float(), spec.codec)
    outl = torch.empty(tokens, spec.outliers, dtype=x.dtype, device=x.device)
    te = _median_time(lambda: plan.encode(xs, spec.codec, wire, outl), repeats, sync)
    osum = outl.float()
    td = _median_time(lambda: plan.decode_merge([wire], spec.codec, osum, ys), repeats, sync)
    nbytes = xs.numel() * xs.element_size()
    both = nbytes / (te + td) / 1e9
    return {"codec": spec.name, "impl": impl,
            "wire_ratio": round(8 * xs.element_size() / spec.bits_per_value(x.dtype, hidden), 3),
            "encode_GBps": nbytes / te / 1e9, "decode_GBps": nbytes / td / 1e9, "enc_dec_GBps": both,
            "copy_GBps": copy_gbs, "enc_dec_vs_copy": both / copy_gbs}


def _plot(rows: list[dict], path: Path, copy_gbs: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = [r["codec"] for r in rows]
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [r["encode_GBps"] for r in rows], 0.4, label="encode")
    ax.bar([i + 0.2 for i in xs], [r["decode_GBps"] for r in rows], 0.4, label="decode")
    ax.axhline(copy_gbs, color="gray", ls="--", label="memory copy")
    ax.set_xticks(list(xs), names)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s of input, one core")
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)
