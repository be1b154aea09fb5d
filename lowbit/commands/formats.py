"""``lowbit formats``: every number format measured on a real model's weights and activations."""

from __future__ import annotations

import argparse

from lowbit.commands.argtypes import positive_int


def register(sub) -> None:
    p = sub.add_parser(
        "formats",
        help="measure SQNR and effective bits of every number format on a real model",
        description=(
            "Load a model, run a few calibration sequences through it, and print, for each format "
            "(INT8/6/4/3/2 per channel and in groups of 128 and 32, symmetric and asymmetric; FP4 "
            "E2M1 with FP16, E8M0 (MXFP4) and E4M3 (NVFP4) block scales; FP8 E4M3/E5M2), its "
            "effective bits per value and the SQNR on the model's weights and on the real inputs of "
            "its linear layers; then the input sites with the strongest outlier channels."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), a HF id or a directory")
    p.add_argument("--samples", type=positive_int, default=4, help="calibration sequences (WikiText-2 validation)")
    p.add_argument("--seqlen", type=positive_int, default=512, help="tokens per calibration sequence")
    p.add_argument("--rows", type=positive_int, default=256, help="activation rows kept per input site for SQNR")
    p.add_argument("--top", type=positive_int, default=10, help="outlier sites to list")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG: SQNR against effective bits")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from lowbit.eval.format_study import plot_study, run_study
    from lowbit.io.atomic import write_json
    from lowbit.io.outputs import check_output_file
    from lowbit.checkpoint import load_model

    check_output_file(args.json, "--json")
    check_output_file(args.plot, "--plot")
    console = Console()
    model, tok = load_model(args.model)
    result = run_study(model, tok, samples=args.samples, seqlen=args.seqlen, keep_rows=args.rows)
    result["model"] = args.model

    t = Table(title=f"Number formats on {args.model}: {result['n_weight_tensors']} weights, "
                    f"{result['n_input_sites']} input sites, {result['calibration']['tokens']} calibration tokens")
    for col in ("format", "W bits", "W SQNR dB", "A bits", "A SQNR dB"):
        t.add_column(col, justify="left" if col == "format" else "right")
    for r in result["formats"]:
        t.add_row(r["label"], f"{r['weight_bits']:.3f}", f"{r['weight_sqnr_db']:.2f}", f"{r['act_bits']:.3f}", f"{r['act_sqnr_db']:.2f}")
    console.print(t)

    o = Table(title="Strongest outlier channels (max / median channel square-sum of a linear input)")
    for col in ("input of", "max/median", "top channel"):
        o.add_column(col)
    for r in result["outliers"][: args.top]:
        o.add_row(", ".join(c.removeprefix("model.") for c in r["consumers"]), f"{r['ratio']:.3g}", str(r["top_channel"]))
    console.print(o)
    console.print(f"took {result['seconds']:.1f} s")
    if args.json:
        write_json(args.json, result)
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_study(result, args.plot)
        console.print(f"wrote {args.plot}")
    return 0
