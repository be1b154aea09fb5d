"""lowbit's batched kernels (W8A8 / W4A4: ``csrc/i8_gemm.c``; W4A16: ``csrc/a16_gemm.c``) at a git
revision against the working tree's, in one process, beside torch's bf16 ``F.linear``, the same bits
asserted: how a kernel change is measured without the machine's drift between runs. The calls are
interleaved, and each build's call follows a bf16 one, which evicts the weight from the caches as the
other layers of a model do: a build called right after the other would find the weight warm (at one
token on 576x3072, 0.044 against 0.084 ms on the AMX Xeon).

    .venv/bin/python scripts/batched_gemm_ab.py --rev c5b3603 [--repeats 11] [--threads 1] [--json OUT]

Default shapes: the default model's (576x960 qkv, 576x576 o, 576x3072 gate/up, 1536x576 down), 1 /
16 / 64 / 128 / 512 tokens, bf16 in and out; W4A4 with 64 INT8 outliers and groups of 128 (``w4a4+perm``:
with an input reorder as lowbit's quantizer makes one, the plugin's qkv / gate-up / o case), W4A16
with groups of 64 (bf16 calls from ``a16_gemm.BF16_MIN_TOKENS`` tokens run torch's matmul in both
builds).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from model_linears import SHAPES, outlier_order  # noqa: E402

TOKENS = [1, 16, 64, 128, 512]
KINDS = ("w8a8", "w4a4", "w4a4+perm", "w4a16")


def sources_at(rev: str, work: Path, folders: tuple[str, ...]) -> None:
    """Each of ``folders``' files as they are at ``rev``, under ``work`` at the same relative paths
    (so a source's includes of the shared headers, ``../../native/csrc/...``, find ``rev``'s)."""
    for folder in folders:
        (work / folder).mkdir(parents=True, exist_ok=True)
        names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{folder}"], capture_output=True, text=True,
                               check=True).stdout.split()
        for name in names:
            data = subprocess.run(["git", "show", f"{rev}:{folder}/{name}"], capture_output=True, check=True).stdout
            (work / folder / name).write_bytes(data)


def rev_flags(rev: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` and a define naming ``rev``'s commit: the build cache's key hashes the tree's shared
    headers, not ``rev``'s, so without it a revision differing only there would reuse the tree's build."""
    sha = subprocess.run(["git", "rev-parse", rev], capture_output=True, text=True, check=True).stdout.strip()
    return (*flags, f"-DLOWBIT_SOURCES_AT={sha}")


def build_at(rev: str, work: Path, folder: str, lib_spec):
    """The library ``lib_spec`` (a ``cbuild`` library: its source's name and flags) built from
    ``rev``'s sources of ``folder`` and the shared headers they include; exits if it does not build."""
    from lowbit.native import cbuild

    sources_at(rev, work, (folder, "lowbit/native/csrc"))
    src = lib_spec.src.name
    lib = cbuild.compile_library(work / folder / src, rev_flags(rev, lib_spec.flag_sets[0]))
    if lib is None:
        raise SystemExit(f"{src} of {rev} did not build")
    return lib


def _library_at(rev: str, work: Path, module):
    """``module``'s kernel library built from the sources of ``rev``, bound with today's signatures
    (the entry points called here have kept theirs)."""
    lib = build_at(rev, work, "lowbit/kernels/csrc", module._LIB)
    module._bind(lib)
    return lib


def _kernel(kind: str, w: torch.Tensor):
    """(the call of one build on x, the build's module) for ``kind``."""
    from lowbit.kernels.cpu import a16_gemm, i8_gemm, w4a4, w8a8
    from lowbit.kernels.linear_params import from_float

    o = w.shape[0]
    if kind == "w4a16":
        panels = a16_gemm.prepare_w4(from_float(w, "w4a16", group=64))
        return (lambda x, lib: a16_gemm.run(x, panels, lib=lib)), a16_gemm
    st = (w8a8.prepare(from_float(w, "w8a8"), "gemm") if kind == "w8a8"
          else w4a4.prepare(from_float(w, "w4a4", n_outliers=64, group=128), "gemm"))
    perm = outlier_order(w.shape[1]) if kind == "w4a4+perm" else None
    return (lambda x, lib: i8_gemm.linear(x, st.args, o, perm, keep_bf16=True, lib=lib)), i8_gemm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="the git revision to compare with the working tree")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma separated, of {', '.join(KINDS)}")
    ap.add_argument("--shapes", default=",".join(f"{k}x{o}" for k, o in SHAPES),
                    help="IN x OUT widths, comma separated (default: the default model's four)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    if set(kinds) - set(KINDS):
        ap.error(f"--kinds: unknown {sorted(set(kinds) - set(KINDS))}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    tokens = [int(v) for v in args.tokens.split(",")]

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows, libs = [], {}
    for kind in kinds:
        total = {"bf16": 0.0, "old": 0.0, "new": 0.0}
        for k, o in shapes:
            w = torch.randn(o, k)
            call, module = _kernel(kind, w)
            if module not in libs:
                with tempfile.TemporaryDirectory() as tmp:
                    libs[module] = {"old": _library_at(args.rev, Path(tmp), module), "new": module.library()}
            wb = w.bfloat16()
            for t in tokens:
                x = torch.randn(t, k).bfloat16()
                calls = {"bf16": lambda: F.linear(x, wb)}
                for name, lib in libs[module].items():
                    calls[name] = lambda lib=lib: call(x, lib)
                if not torch.equal(calls["old"](), calls["new"]()):
                    raise SystemExit(f"{kind} {k}x{o} at {t} tokens: the two builds disagree")
                times = {name: [] for name in calls}
                for r in range(args.repeats):
                    for name in ("bf16", "old", "bf16", "new") if r % 2 else ("bf16", "new", "bf16", "old"):
                        t0 = time.perf_counter()
                        calls[name]()
                        times[name].append(time.perf_counter() - t0)
                ms = {name: 1e3 * statistics.median(v) for name, v in times.items()}
                for name in total:
                    total[name] += ms[name]
                rows.append({"kind": kind, "shape": f"{k}x{o}", "tokens": t, **{f"{n}_ms": v for n, v in ms.items()}})
                print(f"{kind} {k}x{o} {t:4d} tokens: bf16 {ms['bf16']:.3f}  {args.rev} {ms['old']:.3f}  "
                      f"now {ms['new']:.3f} ms  (now {ms['old'] / ms['new']:.2f}x the old, {ms['bf16'] / ms['new']:.2f}x bf16)")
        print(f"{kind} summed: " + ", ".join(f"{n} {v:.2f} ms" for n, v in total.items()))
    if args.json:
        from lowbit.io.atomic import write_json

        write_json(args.json, {"rev": args.rev, "threads": args.threads, "rows": rows})


if __name__ == "__main__":
    main()
