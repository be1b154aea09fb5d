"""``lowbit env``: the machine as lowbit sees it: CPU model and features, torch's build and the
native kernels that built here, and the method each quantized kind runs by default."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("env", help="this machine: CPU features, torch, which native kernels build and run",
                       description="Print the CPU (model, instruction-set features), torch's build and CPU "
                                   "capability, each native library lowbit builds (and whether it built), and the "
                                   "kernel each quantized kind uses by default here.")
    p.add_argument("--json", type=Path, default=None, help="also write the report as JSON (atomically)")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from lowbit.bench.machine import report
    from lowbit.io.atomic import write_json
    from lowbit.io.outputs import check_output_file

    check_output_file(args.json, "--json")  # before the report's work
    rep = report()
    console = Console()
    cpu = rep["cpu"]
    vendor = f"{cpu['vendor']}, " if cpu["vendor"] else ""
    console.print(f"CPU: {cpu['model']} ({vendor}{cpu['machine']}, {cpu['cores']} cores)", highlight=False)
    console.print(f"torch {rep['torch']['version']}, CPU capability {rep['torch']['cpu_capability']}, "
                  f"{rep['torch']['threads']} threads", highlight=False)
    if rep["kernel_threads"]:
        where = {"omp": "torch's OpenMP team", "pool": "lowbit's own pool",
                 "auto": "torch's OpenMP team, lowbit's pool while the team comes late"}[rep["kernel_threads"]]
        console.print(f"kernel threads: {where} (LOWBIT_THREADS=auto|omp|pool)", highlight=False)
    feats = Table(title="instruction-set features")
    feats.add_column("feature")
    feats.add_column("present", justify="center")
    for name, ok in cpu["features"].items():
        feats.add_row(name, "yes" if ok else "-")
    console.print(feats)
    libs = Table(title="native libraries (built on first use with this CPU's instructions)")
    for c in ("library", "built", "ISA variant", "source"):
        libs.add_column(c)
    for lib in rep["native"]:
        libs.add_row(lib["name"], "yes" if lib["built"] else "[red]no[/red]", lib["variant"] or "-", lib["source"])
    console.print(libs)
    isa = rep["isa"]
    console.print(f"ISA variant selected: {isa['selected']} (LOWBIT_ISA=NAME forces one); not runnable here: "
                  + (", ".join(f"{n} (lacks {', '.join(v['missing'])})" for n, v in isa["variants"].items()
                               if not v["runnable"]) or "none"), highlight=False)
    kinds = Table(title="default CPU kernel per quantized kind")
    kinds.add_column("kind")
    kinds.add_column("kernel")
    for kind, impl in rep["kernels"].items():
        kinds.add_row(kind, impl)
    console.print(kinds)
    for kind, path in rep["bf16_calls"].items():
        console.print(f"{kind}, bfloat16 calls of many tokens: {path}", highlight=False)
    console.print(f"all-reduce INT codes on AVX-512: by the {rep['allreduce_int_codes']} (CPU vendor "
                  f"{cpu['vendor'] or 'unknown'}; LOWBIT_QR_DIVIDE=0|1 overrides)", highlight=False)
    hp = rep["huge_pages"]
    console.print(f"prepared weights in 2 MiB pages: {'yes' if hp['weights'] else 'no'} (transparent huge pages: "
                  f"{hp['thp']}; LOWBIT_HUGE_PAGES=0 turns it off)", highlight=False)
    if args.json:
        write_json(args.json, rep)
        console.print(f"wrote {args.json}")
    return 0
