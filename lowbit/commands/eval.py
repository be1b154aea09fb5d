"""``lowbit eval``: perplexity, zero-shot accuracy, KL divergence, and comparing result files."""

from __future__ import annotations

import argparse
import sys

from lowbit.errors import UsageError

from .argtypes import allreduce_name, positive_int

DEFAULT_SEQLEN = 2048
KERNELS = ("auto", "reference", "cpu", "triton")  # lowbit.kernels.dispatch.CHOICES (not imported: torch is slow to load)

PPL_HELP = """Perplexity by the standard protocol (GPTQ, Atom, llm-compressor): the evaluation text is
tokenized once, cut into non-overlapping windows of --seqlen tokens (the tail is dropped), and
ppl = exp(mean NLL over every predicted token). wikitext2 = WikiText-2 raw test; ptb = PTB test
(lines stripped, joined with blank lines); or a path to a text file."""

ZS_HELP = """Zero-shot accuracy by log-likelihood, formatted and scored as lm-evaluation-harness 0.4:
context "<query>\\nAnswer:", continuation " <choice>"; acc = argmax of the summed log-likelihood,
acc_norm = argmax of log-likelihood / character length of the choice. WinoGrande: partial scoring
(acc only). LAMBADA (OpenAI): acc = greedy decoding reproduces the last word; also its ppl."""

KL_HELP = """KL(reference || model) of the next-token distributions and top-1 agreement over the
perplexity windows, as llama.cpp's --kl-divergence reports them (mean, median, 99th percentile,
in nats). They show quantization damage long before perplexity does."""


def _common(p: argparse.ArgumentParser, model_default: str | None = "default") -> None:
    if model_default is not None:
        p.add_argument("--model", default=model_default, help="'default' (SmolLM2-135M-Instruct), a Hugging Face id or a directory (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights and activations dtype (default: %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="sequences per forward pass")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (for 'lowbit eval compare')")
    p.add_argument("--kernel", default=None, choices=KERNELS,
                   help="what runs a quantized checkpoint's packed linears: auto (the fast kernel for the device), "
                        "cpu, triton, or reference (the reference forward); with --tp the shards run the reference "
                        "(default: LOWBIT_KERNEL or auto)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", nargs="+", default=["wikitext2"], help="wikitext2, ptb, or text file paths (default: wikitext2)")
    p.add_argument("--seqlen", type=positive_int, nargs="+", default=None,
                   help=f"window length(s) in tokens (default: {DEFAULT_SEQLEN}, capped at the model's context; an explicit value longer than the context is an error)")
    p.add_argument("--max-windows", type=positive_int, default=None, help="evaluate only the first N windows")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks (launched here, or run under torchrun)")
    p.add_argument("--allreduce", default="plain", type=allreduce_name,
                   help="with --tp: sum o_proj/down_proj outputs with dist.all_reduce (plain) or QuickAllReduce(CODEC): "
                        "fp, int8, int6, int4, int3, fp4, each with optional +h (Hadamard in 64-value blocks; +h32) "
                        "and +oN (N outlier channels sent exactly), e.g. int4+h+o16 (default: %(default)s)")
    p.add_argument("--outlier-channels", default="model", choices=["layer", "model"],
                   help="with +oN: one set of N channels for the model, or each row-parallel layer its own; the largest "
                        "RMS of the summed outputs on 8 x 512 WikiText-2 validation tokens (default: %(default)s)")


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model: perplexity, zero-shot accuracy, KL divergence", description=__doc__)
    kinds = p.add_subparsers(dest="eval_kind", metavar="KIND")

    pp = kinds.add_parser("ppl", help="perplexity on WikiText-2 / PTB", description=PPL_HELP)
    _common(pp)
    _window_args(pp)
    pp.set_defaults(func=run_ppl)

    pz = kinds.add_parser("zeroshot", help="zero-shot accuracy (PIQA, ARC, BoolQ, WinoGrande, LAMBADA)", description=ZS_HELP)
    _common(pz)
    pz.add_argument("--tasks", nargs="+", default=["all"], help="task names or 'all': piqa arc_easy arc_challenge boolq winogrande lambada_openai; or "
                         "a path to your own .jsonl set of {\"query\", \"choices\", \"gold\"} lines (scored as PIQA/ARC)")
    pz.add_argument("--limit", type=positive_int, default=None, help="score only the first N items of each task")
    pz.set_defaults(func=run_zeroshot)

    pk = kinds.add_parser("kl", help="KL divergence from a reference model, top-1 agreement", description=KL_HELP)
    pk.add_argument("--ref", required=True, help="reference model (e.g. the float original), or a .safetensors file from --save-ref")
    _common(pk)
    _window_args(pk)
    pk.add_argument("--save-ref", metavar="PATH", help="instead of comparing, save the --ref model's top-k log-probs to PATH")
    pk.add_argument("--top-k", type=positive_int, default=32, help="k for --save-ref (default: %(default)s)")
    pk.set_defaults(func=run_kl)

    pc = kinds.add_parser("compare", help="print two result JSON files side by side with deltas", description="Compare two 'lowbit eval ... --json' files of the same kind.")
    pc.add_argument("a", help="baseline result JSON")
    pc.add_argument("b", help="result JSON to compare with the baseline")
    pc.set_defaults(func=run_compare)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _setup(args, datasets=(), outputs=("json",)):
    """Check what can be checked before loading a model; set the threads; the torch dtype."""
    import torch

    from lowbit.data.eval_text import eval_path
    from lowbit.io.outputs import check_output_file

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device} but torch sees no CUDA device")
    if getattr(args, "tp", 1) > 1 and args.dtype != "float32":
        raise UsageError(f"--tp {args.tp} runs in float32; --dtype {args.dtype} is not supported with it")
    for flag in outputs:
        check_output_file(getattr(args, flag.replace("-", "_")), f"--{flag}")
    for ds in datasets:
        eval_path(ds)
    if args.threads:
        torch.set_num_threads(args.threads)
    return getattr(torch, args.dtype)


def _load(name: str, dtype, device: str = "cpu", kernel: str | None = None):
    """``(model, tokenizer)``, a quantized one on ``kernel``; a model without a tokenizer cannot be
    evaluated on text."""
    from lowbit.checkpoint import load_model

    model, tok = load_model(name, dtype=dtype, device=device, kernel=kernel)
    if tok is None:
        raise UsageError(f"{name} has no tokenizer (quantized without one?); save one beside it or use "
                         "a checkpoint made by `lowbit quantize`, which keeps the tokenizer")
    return model, tok


def _seqlens(args, model) -> list[int]:
    from lowbit.eval.forward import model_context

    if args.seqlen:
        return args.seqlen
    ctx = model_context(model)
    return [min(DEFAULT_SEQLEN, ctx) if ctx else DEFAULT_SEQLEN]


def _finish(record: dict, args) -> int:
    from rich.console import Console

    from lowbit.eval.report import results_table, save_json

    Console().print(results_table(record))
    if args.json:
        save_json(record, args.json)
        print(f"wrote {args.json}")
    return 0


def _run_tp(kind: str, args) -> int:
    """``--tp W``: launch W ranks, each holding its shard; rank 0 reports."""
    from lowbit.eval.tp import run_tp_eval
    from lowbit.eval.report import make_record

    _setup(args, args.dataset)
    results = []
    for sl in args.seqlen or [DEFAULT_SEQLEN]:
        for ds in args.dataset:
            res = run_tp_eval(kind, args.model, args.tp, args.allreduce, dataset=ds, seqlen=sl,
                              max_windows=args.max_windows, batch_size=args.batch_size or 1,
                              ref=getattr(args, "ref", None), outlier_channels=args.outlier_channels)
            if res is None:  # a non-zero rank under torchrun: rank 0 reports
                return 0
            results.append(res)
    extra = {"ref": args.ref} if kind == "kl" else {}
    return _finish(make_record(kind, args.model, results, dtype=args.dtype, tp=args.tp, allreduce=args.allreduce,
                               argv=sys.argv[1:], **extra), args)


def run_ppl(args) -> int:
    from lowbit.eval.perplexity import perplexity
    from lowbit.eval.report import make_record

    if args.tp > 1:
        return _run_tp("ppl", args)
    dtype = _setup(args, args.dataset)
    model, tok = _load(args.model, dtype, args.device, args.kernel)
    results = [
        perplexity(model, tok, ds, sl, args.max_windows, args.batch_size or 1, not args.no_progress).to_dict()
        for sl in _seqlens(args, model) for ds in args.dataset
    ]
    return _finish(make_record("ppl", args.model, results, dtype=_ran_dtype(model), argv=sys.argv[1:]), args)


def _ran_dtype(model) -> str:
    """The dtype the model's float parameters really have (what the record states)."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def run_zeroshot(args) -> int:
    from lowbit.data.zeroshot import TASKS, canonical_task
    from lowbit.eval.report import make_record
    from lowbit.eval.zeroshot import evaluate_task

    tasks = list(TASKS) if args.tasks == ["all"] else [canonical_task(t) for t in args.tasks]
    dtype = _setup(args)
    model, tok = _load(args.model, dtype, args.device, args.kernel)
    results = [evaluate_task(model, tok, t, args.limit, args.batch_size or 16, not args.no_progress).to_dict() for t in tasks]
    return _finish(make_record("zeroshot", args.model, results, dtype=_ran_dtype(model), limit=args.limit,
                               argv=sys.argv[1:]), args)


def run_kl(args) -> int:
    from pathlib import Path

    from lowbit.eval.kl import ReferenceTopK, kl_divergence, reference_topk
    from lowbit.eval.report import make_record

    if args.tp > 1 and not args.save_ref:
        return _run_tp("kl", args)
    dtype = _setup(args, args.dataset, ("json", "save-ref"))
    bs, prog = args.batch_size or 1, not args.no_progress
    if args.save_ref:
        ref, tok = _load(args.ref, dtype, args.device, args.kernel)
        (sl,), (ds,) = _seqlens(args, ref)[:1], args.dataset[:1]
        r = reference_topk(ref, tok, ds, sl, args.max_windows, bs, args.top_k, prog)
        r.save(args.save_ref)
        print(f"wrote {args.save_ref}: top-{r.k} reference of {args.ref} on {ds}@{sl}, {r.windows.shape[0]} windows")
        return 0
    saved_ref = args.ref.endswith(".safetensors") and Path(args.ref).is_file()
    if not saved_ref:
        from lowbit.models.loading import resolve

        resolve(args.ref)  # a missing reference fails before the model loads
    model, tok = _load(args.model, dtype, args.device, args.kernel)
    ref = ReferenceTopK.load(args.ref) if saved_ref else _load(args.ref, dtype, args.device, args.kernel)[0]
    results = [
        kl_divergence(ref, model, tok, ds, sl, args.max_windows, bs, prog).to_dict()
        for sl in _seqlens(args, model) for ds in args.dataset
    ]
    return _finish(make_record("kl", args.model, results, ref=args.ref, dtype=_ran_dtype(model), argv=sys.argv[1:]), args)


def run_compare(args) -> int:
    from rich.console import Console

    from lowbit.eval.report import compare_table, load_json

    a, b = load_json(args.a), load_json(args.b)
    Console().print(compare_table(a, b, "A", "B"))
    return 0
