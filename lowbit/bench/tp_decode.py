"""Decode tokens/s of a model split over W tensor-parallel ranks, per all-reduce (plain or a
quantized codec), unshaped and on rate-limited links, next to the single-process model in the
same run; checks that plain all-reduce generates exactly the single-process greedy tokens.

Run: ``lowbit bench tp-decode --tp 2 --batches 1 8 --link-gbit 2``.
A shaped link (``--link-gbit N``, root + iproute2) runs the
ranks in a private network namespace whose loopback is rate-limited (lowbit.bench.netns).
Under ``torchrun`` (one process per rank, on one host or several: ``scripts/two_hosts.sh``) each
process is one rank and the launcher's network is the link; rank 0 reports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lowbit.bench.report import args_meta
from lowbit.bench.tp_decode_worker import decode_rank, matching_prefix, single_process_rows

DEFAULT_METHODS = ("none", "plain", "fp", "int8", "int4")


def check_args(a) -> str:
    """Everything checkable before ranks start; the checkpoint folder."""
    from transformers import AutoConfig

    from lowbit.models.shard_plan import make_plan
    from lowbit.eval.tp_worker import checkpoint_folder

    if a.tp < 2:
        raise ValueError(f"--tp must be >= 2 for a tensor-parallel benchmark, got {a.tp}")
    if a.new < 2 or a.prompt < 1 or a.repeats < 1 or not a.batches or min(a.batches) < 1:
        raise ValueError("need --new >= 2, --prompt >= 1, --repeats >= 1 and batches >= 1")
    if any(not g > 0 for g in a.link_gbit):
        raise ValueError(f"--link-gbit rates must be > 0, got {a.link_gbit}")
    if a.skip_unshaped and not a.link_gbit:
        raise ValueError("--skip-unshaped needs at least one --link-gbit rate")
    path = checkpoint_folder(a.model)
    make_plan(AutoConfig.from_pretrained(path), a.tp)  # TPSplitError before any rank starts
    return path


def reference_model(path: str):
    """The unsplit float32 model from the same checkpoint folder the ranks read."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_prompts(path: str, n: int, length: int, random: bool, vocab: int) -> torch.Tensor:
    """``n`` prompts of ``length`` tokens: WikiText-2 validation windows (seed 1), or seeded
    uniformly random ids when ``random`` (no tokenizer or data needed)."""
    if random:
        return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1))
    from lowbit.data import calibration_ids
    from lowbit.models.loading import load_tokenizer

    return calibration_ids(load_tokenizer(path), n, length, seed=1)


def init_torchrun(a) -> int:
    """Join the process group torchrun describes (``join_torchrun``); this rank."""
    from lowbit.errors import UsageError
    from lowbit.parallel.launch import join_torchrun

    if a.link_gbit or a.skip_unshaped:
        raise UsageError("under torchrun the launcher's network is the link: drop --link-gbit / --skip-unshaped "
                         "(scripts/two_hosts.sh shapes its veth with GBIT=N)")
    rank = join_torchrun(a.tp, a.timeout)
    torch.set_num_threads(1)  # as the local ranks: one torch thread per rank
    return rank


def share_from_rank0(make):
    """``make()``'s value on rank 0, sent to every rank; an exception on rank 0 is raised on all of
    them (peers fail at once instead of waiting out the group's timeout)."""
    import torch.distributed as dist

    box = [None]
    if dist.get_rank() == 0:
        try:
            box = [("ok", make())]
        except Exception as e:
            box = [("error", e)]
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise value
    return value


def measure_tp(spec: dict) -> list[dict]:
    """Run the TP ranks on this host's current network (or, under torchrun, this process as one
    of them); rank 0's rows, with token checks."""
    from lowbit.parallel.launch import check_results, run_ranks, under_torchrun

    prompts = [torch.tensor(p, dtype=torch.long) for p in spec["prompts"]]
    args = (spec["path"], spec["methods"], prompts, spec["new"], spec["repeats"], spec["check_metadata"],
            spec.get("policy", "auto"))
    if under_torchrun():
        import torch.distributed as dist

        mine = decode_rank(dist.get_rank(), dist.get_world_size(), *args)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, mine)
    else:
        per_rank = check_results(run_ranks(decode_rank, spec["tp"], *args, timeout_s=spec["timeout"],
                                           deadline_s=spec["deadline"]))
    rows = per_rank[0]
    for i, row in enumerate(rows):  # both reducers leave every rank with the same sums -> same tokens
        same = all(other[i]["tokens"] == row["tokens"] for other in per_rank[1:])
        row["ranks_agree"] = same if row["method"] != "none" else None
        if row["method"] != "none" and not same:
            raise RuntimeError(f"ranks generated different tokens with {row['method']} at batch {row['batch']}")
    return rows


def _measure_shaped(spec: dict, gbit: float) -> list[dict]:
    """``measure_tp`` in a fresh process inside a network namespace shaped to ``gbit``."""
    from lowbit.bench.netns import shaped_namespace
    from lowbit.io.atomic import write_json

    with tempfile.TemporaryDirectory(prefix="lowbit-tpdec-") as tmp:
        spec_path, res_path = Path(tmp) / "spec.json", Path(tmp) / "rows.json"
        write_json(spec_path, spec)
        with shaped_namespace(gbit) as prefix:
            cmd = [*prefix, sys.executable, "-m", "lowbit", "bench", "tp-decode", "--tp-worker", str(spec_path), str(res_path)]
            r = subprocess.run(cmd)
        if r.returncode != 0 or not res_path.is_file():
            raise RuntimeError(f"the shaped-link run ({gbit:g} Gbit/s) failed with exit code {r.returncode}")
        return json.loads(res_path.read_text())


def _worker(spec_path: str, res_path: str) -> int:
    from lowbit.io.atomic import write_json

    write_json(res_path, measure_tp(json.loads(Path(spec_path).read_text())))
    return 0


def summarize(tp_rows: list[dict], ref_rows: list[dict], tp: int) -> list[dict]:
    """Add speedups against plain (same link, batch) and the best single-process run, and token
    agreement with the single-process greedy output."""
    ref_tok = {r["batch"]: r["tokens"] for r in ref_rows}
    best_ref = {}
    for r in ref_rows:
        best_ref[r["batch"]] = max(best_ref.get(r["batch"], 0.0), r["tok_s"])
    plain = {(r["link"], r["batch"]): r["tok_s"] for r in tp_rows if r["method"] == "plain"}
    out = []
    for r in tp_rows:
        frac, prefix = matching_prefix(r["tokens"], ref_tok[r["batch"]])
        comm = r["allreduce_s"] * r["allreduces_per_step"]
        out.append(r | {
            "tp": tp, "vs_plain": r["tok_s"] / plain[(r["link"], r["batch"])] if (r["link"], r["batch"]) in plain else None,
            "vs_single": r["tok_s"] / best_ref[r["batch"]], "token_match": frac, "match_prefix": prefix,
            "comm_ms_per_step": 1e3 * comm,
        })
    return out


def print_tables(rows: list[dict], ref_rows: list[dict], a, console) -> None:
    from rich.table import Table

    t = Table(title=f"TP={a.tp} greedy decode, {a.model}, fp32, prompt {a.prompt} + {a.new} new tokens, "
                    f"{a.repeats} repeats, methods in lockstep, tokens/s on rank 0 (median step; runs: median run; "
                    f"paired: median of plain's step / this step), "
                    f"codec policy {getattr(a, 'policy', 'auto')}")
    for c in ("link", "batch", "all-reduce", "path", "tok/s", "runs", "vs plain", "paired", "vs single", "step ms",
              "AR/step",
              "msg", "AR us", "AR ms/step", "tokens = single"):
        t.add_column(c, justify="right")
    for r in rows:
        na = r["method"] == "none"
        t.add_row(r["link"], str(r["batch"]), r["method"] + (" (no comm)" if na else ""), r.get("path", "-"),
                  f"{r['tok_s']:.1f}", f"{r['tok_s_runs']:.1f}",
                  "-" if r["vs_plain"] is None else f"{r['vs_plain']:.2f}x",
                  "-" if r.get("vs_plain_paired") is None else f"{r['vs_plain_paired']:.3f}x", f"{r['vs_single']:.2f}x",
                  f"{r['step_ms']:.1f}", f"{r['allreduces_per_step']:g}", f"{r['message_bytes']} B",
                  "-" if na else f"{r['allreduce_s'] * 1e6:.0f}", "-" if na else f"{r['comm_ms_per_step']:.1f}",
                  "-" if na else f"{r['token_match']:.3f} (prefix {r['match_prefix']:.1f})")
    console.print(t)
    s = Table(title="single process (unsplit model), same run")
    for c in ("batch", "threads", "tok/s", "step ms", "prefill s"):
        s.add_column(c, justify="right")
    for r in ref_rows:
        s.add_row(str(r["batch"]), str(r["threads"]), f"{r['tok_s']:.1f}", f"{r['step_ms']:.1f}", f"{r['prefill_s']:.2f}")
    console.print(s)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lowbit.bench.report import save_figure

    groups = list(dict.fromkeys((r["link"], r["batch"]) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(groups), 4))
    w = 0.8 / len(methods)
    for j, m in enumerate(methods):
        vals = [next((r["tok_s"] for r in rows if (r["link"], r["batch"]) == g and r["method"] == m), 0.0) for g in groups]
        ax.bar([i + j * w for i in range(len(groups))], vals, w, label=m)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(groups))], [f"{lk}\nbatch {b}" for lk, b in groups], fontsize=8)
    ax.set_ylabel("decode tokens/s (rank 0)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)


def argv_meta(a) -> dict:
    """The arguments as JSON values (the CLI adds its dispatch function and command names)."""
    return args_meta(a, drop=("tp_worker",))


def source_digest() -> str:
    """SHA-1 of the all-reduce and codec sources: the all-reduce changes between versions, and
    the decode numbers depend on it."""
    import hashlib

    import lowbit.comm as comm

    root = Path(comm.__file__).parent
    h = hashlib.sha1()
    for f in sorted([root / "allreduce.py", *(root / "codecs").rglob("*.py"), *(root / "codecs").rglob("*.[ch]")]):
        h.update(f.read_bytes())
    return h.hexdigest()


def run(a: argparse.Namespace) -> int:
    """The benchmark for parsed arguments (also ``lowbit bench tp-decode``); 0 when plain
    all-reduce reproduced the single-process tokens, 1 when not; bad arguments raise."""
    if a.tp_worker:
        return _worker(*a.tp_worker)
    from rich.console import Console

    from lowbit.bench import machine
    from lowbit.errors import UsageError
    from lowbit.io.atomic import write_json
    from lowbit.io.outputs import check_output_dir
    from lowbit.parallel.launch import under_torchrun

    console = Console(width=max(150, Console().width))
    path = check_args(a)
    torchrun = under_torchrun()
    rank = init_torchrun(a) if torchrun else 0
    if rank == 0:
        check_output_dir(a.out, "--out")
    t_start = time.perf_counter()
    model = reference_model(path) if rank == 0 else None

    def prompts_for_all():
        try:
            return make_prompts(path, max(a.batches), a.prompt, a.random_prompts, model.config.vocab_size)
        except (OSError, ValueError) as e:
            raise UsageError(f"no tokenizer or text for the prompts ({e}); use --random-prompts") from e

    prompts_all = share_from_rank0(prompts_for_all) if torchrun else prompts_for_all()
    prompts = [prompts_all[:b] for b in a.batches]
    spec = {"path": path, "tp": a.tp, "methods": list(dict.fromkeys(a.allreduce)), "prompts": [p.tolist() for p in prompts],
            "new": a.new, "repeats": a.repeats, "check_metadata": not a.no_metadata_check,
            "policy": a.policy,
            "timeout": a.timeout, "deadline": 6 * 3600.0}
    links = ([] if a.skip_unshaped else [None]) + list(a.link_gbit)
    tp_rows = []
    for gbit in links:
        label = (a.link_label or ("torchrun" if torchrun else "unshaped")) if gbit is None else f"{gbit:g} Gbit/s"
        if rank == 0:
            console.print(f"TP={a.tp} decode, {label} ...")
        rows = measure_tp(spec) if gbit is None else _measure_shaped(spec, gbit)
        if torchrun:  # the one link torchrun allows is measured: leave the group; rank 0 reports
            import torch.distributed as dist

            dist.destroy_process_group()
            if rank != 0:
                return 0
        tp_rows += [r | {"link": label} for r in rows]
        write_json(a.out / "tp_decode.partial.json", {"meta": {"args": argv_meta(a)}, "tp_rows": tp_rows})
    ref_rows = []
    for th in a.ref_threads or sorted({1, a.tp}):
        ref_rows += single_process_rows(model, prompts, a.new, a.repeats, th)
    rows = summarize(tp_rows, ref_rows, a.tp)
    print_tables(rows, ref_rows, a, console)
    plain_ok = all(r["token_match"] == 1.0 for r in rows if r["method"] == "plain")
    console.print(f"plain all-reduce tokens {'equal' if plain_ok else 'DIFFER FROM'} the single-process greedy tokens")
    wall = time.perf_counter() - t_start
    meta = argv_meta(a) | {"allreduce_sources_sha1": source_digest(), "checkpoint": path, "torch": torch.__version__,
                           "wall_s": wall, "rank_threads": 1, "plain_tokens_equal_single": plain_ok,
                           "torchrun": torchrun, "machine": machine.report(),
                           "tok_s_is": "batch / median one-token step of all repeats (tok_s_runs: from the median run)"}
    write_json(a.out / "tp_decode.json", {"meta": meta, "rows": rows, "single_process": ref_rows})
    (a.out / "tp_decode.partial.json").unlink(missing_ok=True)
    plot(rows, a.out / "tp_decode.png", f"TP={a.tp} decode tokens/s, {a.model}")
    console.print(f"wrote {a.out}/tp_decode.json, tp_decode.png ({wall:.0f} s)")
    return 0 if plain_ok else 1

