"""``lowbit bench codecs``: encode/decode throughput of every all-reduce codec on one core,
next to a plain memory copy of the same tensor measured in the same run."""

from __future__ import annotations

from pathlib import Path



def _median_times(fns, repeats: int, sync) -> list[float]:
    """Median seconds of each of ``fns``, timed in the same rounds (:func:`.gemm.interleaved_medians`):
    the machine's memory bandwidth drifts by a third between runs here, so a ratio to the copy is
    only meaningful when both are timed side by side."""
    from .gemm import interleaved_medians

    meds = interleaved_medians(dict(enumerate(fns)), repeats, sync)
    return [meds[i][0] for i in range(len(fns))]


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
    y, y2 = torch.empty_like(x), torch.empty_like(x)
    copy = lambda: y2.copy_(x)  # noqa: E731  (timed beside every codec: see _median_times)
    rows = []
    for name in [c.strip() for c in args.codecs.split(",") if c.strip()]:
        spec = parse_spec(name)
        c = spec.codec
        if not spec.plain_codec:
            rows.append(_channel_row(spec, x, y, copy, args.hidden, args.repeats, sync, impl))
            continue
        row_impl = "Triton (fused)" if args.impl == "auto" and uses_triton(x, c) else impl
        w = enc(x, c)
        if args.impl == "auto":  # into kept buffers, as QuickAllReduce does; decode into the input dtype
            wbuf = torch.empty_like(w)
            fns = (lambda: enc(x, c, out=wbuf), lambda: dec(w, c, x.numel(), dtype, out=y))
        else:
            fns = (lambda: enc(x, c), lambda: y.copy_(dec(w, c, x.numel(), dtype)))
        te, td, tc = _median_times([*fns, copy], args.repeats, sync)
        rows.append(_row(spec.name, row_impl, round(c.ratio(dtype), 3), nbytes, te, td, tc))
    if not rows:
        raise ValueError(f"--codecs {args.codecs!r} names no codec")
    lo, hi = min(r["copy_GBps"] for r in rows), max(r["copy_GBps"] for r in rows)
    table = Table(title=f"codec throughput, {args.elements} x {args.dtype}, {args.threads} thread(s), {dev}; "
                        f"copy {lo:.2f}-{hi:.2f} GB/s, timed beside each codec (input bytes per second)")
    for col in ("codec", "impl", "bytes ratio", "encode GB/s", "decode GB/s", "enc+dec GB/s", "vs copy"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["codec"], r["impl"], f"{r['wire_ratio']:.2f}x", f"{r['encode_GBps']:.3f}", f"{r['decode_GBps']:.3f}",
                      f"{r['enc_dec_GBps']:.3f}", f"{100 * r['enc_dec_vs_copy']:.1f}%")
    console = Console()
    console.print(table)
    write_csv(args.out / "codecs.csv", rows)
    write_json(args.out / "codecs.json", {"meta": vars(args) | {"out": str(args.out), "func": None}, "rows": rows})
    _plot(rows, args.out / "codecs.png")
    console.print(f"wrote {args.out}/codecs.csv, codecs.json, codecs.png")
    return 0


def _row(name: str, impl: str, wire_ratio: float, nbytes: int, te: float, td: float, tc: float) -> dict:
    both = nbytes / (te + td) / 1e9
    return {"codec": name, "impl": impl, "wire_ratio": wire_ratio, "encode_GBps": nbytes / te / 1e9,
            "decode_GBps": nbytes / td / 1e9, "enc_dec_GBps": both, "copy_GBps": nbytes / tc / 1e9,
            "enc_dec_vs_copy": both / (nbytes / tc / 1e9)}


def _channel_row(spec, x, y, copy, hidden: int, repeats: int, sync, impl: str) -> dict:
    """What the one-shot all-reduce does around the codec for ``int4+h+o16``-style specs, timed as
    one codec: encode = outliers out, zeroed, block Hadamard and the codec, fused per row
    (``ChannelPlan.encode``); decode = decode + merge (inverse Hadamard, outlier sums in, one cast),
    fused per row (``ChannelPlan.decode_merge``), into kept buffers. Channels spread evenly (random
    data has no special ones); whole tokens of ``hidden`` values; the copy of x timed beside them."""
    import torch

    from lowbit.comm.channels import ChannelPlan, spread_channels
    from lowbit.comm.codecs import encode

    tokens = x.numel() // hidden
    xs, ys = x[: tokens * hidden].view(tokens, hidden), y[: tokens * hidden].view(tokens, hidden)
    plan = ChannelPlan.make(spec, hidden, spread_channels(spec.outliers, hidden) if spec.outliers else None)
    wire = encode(xs.float(), spec.codec)
    outl = torch.empty(tokens, spec.outliers, dtype=x.dtype, device=x.device)
    plan.encode(xs, spec.codec, wire, outl)
    osum = outl.float()
    te, td, tc = _median_times([lambda: plan.encode(xs, spec.codec, wire, outl),
                                lambda: plan.decode_merge([wire], spec.codec, osum, ys), copy], repeats, sync)
    nbytes = xs.numel() * xs.element_size()
    return _row(spec.name, impl, round(8 * xs.element_size() / spec.bits_per_value(x.dtype, hidden), 3), nbytes, te, td,
                tc * xs.numel() / x.numel())  # the copy's time for these bytes


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = [r["codec"] for r in rows]
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [r["encode_GBps"] for r in rows], 0.4, label="encode")
    ax.bar([i + 0.2 for i in xs], [r["decode_GBps"] for r in rows], 0.4, label="decode")
    ax.scatter(list(xs), [r["copy_GBps"] for r in rows], color="gray", marker="_", s=400, zorder=3,
               label="memory copy (timed beside each)")
    ax.set_xticks(list(xs), names)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s of input, one core")
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)
