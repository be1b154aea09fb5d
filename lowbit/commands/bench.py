"""``lowbit bench KIND``: benchmarks that print tables and write plots.

The parsers live here; each benchmark is a module in ``lowbit/bench/`` whose ``run(args)`` does
the work.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lowbit.bench import allreduce, codecs, decode, decode_split, gemm, serve, tp_decode, tp_decode_worker

from .argtypes import codec_list, decode_method, int_list, nonneg_int, positive_float, positive_int, size_list


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks: codecs, all-reduce, GEMM kernels, decode throughput",
        description="Benchmarks. Each reports ratios measured side by side in one run (medians of repeats).",
    )
    kinds = p.add_subparsers(dest="bench", metavar="KIND")
    for add in (_allreduce, _codecs, _decode, _decode_split, _gemm, _serve, _tp_decode):
        add(kinds)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _allreduce(kinds) -> None:
    p = kinds.add_parser("allreduce", help="quantized vs plain all-reduce: latency, speedup, SQNR per size")
    p.add_argument("--world-size", type=positive_int, default=2)
    p.add_argument("--codecs", type=codec_list, default=allreduce.ALL_CODECS)
    p.add_argument("--sizes", type=size_list, default="4K..256M", help="bytes per rank: 'LO..HI' (x4 steps) or a comma list")
    p.add_argument("--size-factor", type=positive_int, default=4)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--repeats", type=positive_int, default=5, help="timed calls per point (median), at least 5 for reports")
    p.add_argument("--no-metadata-check", action="store_true", help="skip the cross-rank size/dtype check")
    p.add_argument("--serial", action="store_true",
                   help="also time each codec with its rounds one after another (no pipelining), side by side")
    p.add_argument("--link-gbit", type=positive_float, default=None, help="rate-limit the ranks' link to N Gbit/s (root)")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="process-group timeout, seconds")
    p.add_argument("--accuracy-elements", type=nonneg_int, default=1 << 20,
                   help="values per rank in the accuracy table (exact float64 sum, error bound); 0 skips it")
    p.add_argument("--out", type=Path, default=Path("bench_out/allreduce"))
    p.add_argument("--hidden", type=positive_int, default=576,
                   help="with codec options (+h, +oN): messages are [size / hidden, hidden] (default: %(default)s)")
    p.add_argument("--label", default="", help=argparse.SUPPRESS)
    p.set_defaults(func=allreduce.run)


def _codecs(kinds) -> None:
    p = kinds.add_parser("codecs", help="all-reduce codec throughput per core vs memory copy")
    p.add_argument("--elements", type=positive_int, default=16 << 20, help="values per call (default 16M)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--codecs", type=codec_list, default="fp,int8,int6,int4,int3,fp4")
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (1 = per core)")
    p.add_argument("--impl", default="auto", choices=["auto", "torch"],
                   help="auto: compiled C on CPU if it builds, the fused Triton kernels on CUDA (INT8, INT4); "
                        "torch: the vectorised torch codec")
    p.add_argument("--device", default="cpu")
    p.add_argument("--hidden", type=positive_int, default=576,
                   help="the messages' last dimension for codecs with +h / +oN options (default: %(default)s, SmolLM2)")
    p.add_argument("--out", type=Path, default=Path("bench_out/codecs"))
    p.set_defaults(func=codecs.run)


def _decode(kinds) -> None:
    p = kinds.add_parser("decode", help="generation tokens/s per format and batch, memory, weight and KV bytes")
    p.add_argument("--model", default="default", help="'default', a Hugging Face folder or a .gguf file (default: %(default)s)")
    p.add_argument("--formats", default=",".join(decode.DEFAULT_FORMATS),
                   help=f"comma list of {', '.join(decode.FORMATS)}; float formats run as they are, the others are "
                        "quantized first and run inside bf16 (their linears on lowbit's kernels) (default: %(default)s)")
    p.add_argument("--batches", type=int_list, default="1,8,32", help="sequences decoded together (default: %(default)s)")
    p.add_argument("--prompt", type=positive_int, default=128, help="prompt tokens (default: %(default)s)")
    p.add_argument("--new", type=positive_int, default=128, help="generated tokens (default: %(default)s)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed generations per point, formats interleaved in each; medians reported (default: %(default)s)")
    p.add_argument("--calib", default="4x128", help="calibration SAMPLESxSEQLEN (tiny: only speed is measured)")
    p.add_argument("--gptq", action="store_true", help="use the presets' GPTQ instead of RTN (slower to quantize)")
    p.add_argument("--kernel", default=None, choices=["auto", "reference", "cpu", "triton"],
                   help="linear kernels for the quantized formats (default: the best this device has)")
    p.add_argument("--threads", type=nonneg_int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--stock-ops", action="store_true",
                   help="keep PyTorch's norms, rotary embedding and attention instead of lowbit's native "
                        "decode ops (which every format, the float ones included, gets by default)")
    p.add_argument("--out", type=Path, default=Path("bench_out/decode"),
                   help="folder for decode.csv, decode.json and decode.png (default: %(default)s)")
    p.set_defaults(func=decode.run)


def _decode_split(kinds) -> None:
    p = kinds.add_parser("decode-split", help="decode step time split: decoder linears, LM head, the rest")
    p.add_argument("--model", default="default")
    p.add_argument("--formats", default="bf16,w4a16", help=f"comma list of {', '.join(decode.FORMATS)}")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--prompt", type=positive_int, default=128)
    p.add_argument("--new", type=positive_int, default=64)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--calib", default="4x128")
    p.add_argument("--threads", type=nonneg_int, default=0)
    p.add_argument("--stock-ops", action="store_true", help="PyTorch's norms, rotary and attention (as bench decode's)")
    p.add_argument("--out", type=Path, default=Path("bench_out/decode_split"))
    p.set_defaults(func=decode_split.run, gptq=False, kernel=None, device="cpu")


def _gemm(kinds) -> None:
    p = kinds.add_parser("gemm", help="quantized linear kernels vs fp32/bf16 F.linear (time, GB/s, TFLOP/s, roofline)")
    p.add_argument("--shapes", default="default,llama7b", help=f"comma list of {', '.join(gemm.SHAPE_SETS)} or INxOUT")
    p.add_argument("--batches", type=int_list, default="1,8,64,512")
    p.add_argument("--kernels", default=",".join(gemm.KERNELS),
                   help="fp32,bf16 and quantized kinds w4a16,w8a16,w8a8,w4a4; KIND@METHOD picks a CPU "
                        "method other than the default: w8a8/w4a4@gemm (lowbit's batched int8 kernel, "
                        "the default where it wins), w8a8/w4a4@native (lowbit's GEMV), w8a8/w4a4@float (exact products "
                        "through float32 SGEMM), w8a8/w4a4@int_mm (torch._int_mm, slow without "
                        "VNNI/AMX), w4a16@int4pack / w8a16@int8pack (torch's int4 / int8 matmul)")
    p.add_argument("--kernel", default=None, choices=["auto", "reference", "cpu", "triton"],
                   help="force the implementation of the quantized kinds (default: LOWBIT_KERNEL or auto)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=nonneg_int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-seconds", type=positive_float, default=20.0,
                   help="skip further repeats of a row whose single call takes longer than this")
    p.add_argument("--back-to-back", action="store_true",
                   help="time each kernel as a run of calls (about 5 ms, over its weight copies), as the linears of a "
                        "model run, instead of one call between the other kernels' (always so on GPUs); on a shared "
                        "VM one call after other work can find its threads at one core's speed (README)")
    p.add_argument("--out", type=Path, default=Path("bench_out/gemm"))
    p.set_defaults(func=gemm.run)


def _tp_decode(kinds) -> None:
    p = kinds.add_parser("tp-decode", help="TP decode tokens/s per all-reduce (plain, codecs), unshaped and shaped links")
    p.add_argument("--model", default="default")
    p.add_argument("--tp", type=positive_int, default=2,
                   help="ranks (local gloo processes, 1 torch thread each; under torchrun, its world size)")
    p.add_argument("--allreduce", nargs="+", default=list(tp_decode.DEFAULT_METHODS), type=decode_method,
                   help="none, plain or codecs with +h / +oN options (" + ", ".join(tp_decode_worker.DECODE_METHODS) +
                        "; +oN: one outlier set for the model, calibrated); 'none' = no communication (wrong sums; "
                        "the compute floor of a TP step)")
    p.add_argument("--batches", type=positive_int, nargs="+", default=[1, 8])
    p.add_argument("--prompt", type=positive_int, default=64, help="prompt tokens (WikiText-2 validation windows)")
    p.add_argument("--random-prompts", action="store_true",
                   help="uniformly random token ids instead of text (models without a tokenizer)")
    p.add_argument("--new", type=positive_int, default=32, help="generated tokens per sequence")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed runs per point after a warm-up, all methods decoding in lockstep (step by step in "
                        "turn); tok/s from the median one-token step of all runs (the median run's also reported), "
                        "'paired' from the median of plain's step time over the method's in the same round")
    p.add_argument("--link-gbit", type=positive_float, nargs="*", default=[], help="also measure on links shaped to N Gbit/s")
    p.add_argument("--skip-unshaped", action="store_true", help="measure only the shaped links")
    p.add_argument("--link-label", default=None,
                   help="the unshaped link's name in the tables (under torchrun: the launcher's network, e.g. "
                        "'two hosts, 2 Gbit/s'; default 'unshaped', or 'torchrun')")
    p.add_argument("--no-metadata-check", action="store_true", help="codecs skip the cross-rank size/dtype check")
    p.add_argument("--policy", default="auto", choices=tp_decode_worker.POLICIES,
                   help="auto: each codec's size policy (tuned table or defaults) picks plain, one-shot or two-shot "
                        "per message; quantize: every message through the codec (one-shot or two-shot by size)")
    p.add_argument("--ref-threads", type=positive_int, nargs="*", default=None,
                   help="torch threads of the single-process reference runs (default: 1 and --tp)")
    p.add_argument("--timeout", type=positive_float, default=300.0, help="process-group timeout, seconds")
    p.add_argument("--out", type=Path, default=Path("bench_out/tp_decode"))
    p.add_argument("--tp-worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    p.set_defaults(func=tp_decode.run)


def _serve(kinds) -> None:
    p = kinds.add_parser("serve", help="vLLM's server (bf16, lowbit's W8A8/W4A16 exports, lowbit's plugin) under a "
                                       "streaming client vs lowbit's loop",
                         description="Starts `vllm serve` per format on 127.0.0.1, sends real-text requests at each "
                                     "concurrency (streaming), and runs lowbit's generate loop on the same checkpoints and "
                                     "requests as static batches. Writes serve.json, serve.png and the servers' logs to --out.")
    p.add_argument("--model", default="default")
    p.add_argument("--formats", default=",".join(serve.FORMATS),
                   help="comma list of: " + "; ".join(f"{name} = {f.about}" for name, f in serve.FORMATS.items())
                        + " (default: all)")
    p.add_argument("--concurrency", type=int_list, default="1,4,16,64", help="concurrent requests per level (lowbit: batch)")
    p.add_argument("--requests", type=nonneg_int, default=0,
                   help="requests per level (0: twice the concurrency, at least 8); never fewer than the concurrency")
    p.add_argument("--prompt-max", type=positive_int, default=256, help="longest prompt, tokens (longer texts are cut)")
    p.add_argument("--new-min", type=positive_int, default=8, help="shortest output, tokens")
    p.add_argument("--new-max", type=positive_int, default=128, help="longest output, tokens (log-uniform in between)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="fixes the requests' texts and lengths")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="N > 1: every format's vLLM server up at once (memory: one server each) and each level "
                        "driven N times, the formats in turn in a rotating order, so that a drifting machine moves "
                        "them alike; each level reports its median round (default 1: one server after another)")
    p.add_argument("--budget", type=positive_float, default=300.0, help="seconds per level after which no request is sent")
    p.add_argument("--request-timeout", type=positive_float, default=900.0, help="seconds one request may take")
    p.add_argument("--start-timeout", type=positive_float, default=1200.0, help="seconds `vllm serve` may take to be healthy")
    p.add_argument("--timeout", type=positive_float, default=3600.0, help="seconds lowbit's loop may take per format")
    p.add_argument("--calib", default="4x128", help="calibration SAMPLESxSEQLEN (RTN: only speed is measured)")
    p.add_argument("--kernel", default=None, choices=["auto", "reference", "cpu", "triton"], help="lowbit's kernels")
    p.add_argument("--threads", type=nonneg_int, default=0, help="threads of both engines (0 = leave as is)")
    p.add_argument("--kv-cache-gib", type=positive_int, default=1, help="vLLM's CPU KV cache space, GiB")
    p.add_argument("--stock-ops", action="store_true", help="lowbit's side: PyTorch's norms, rotary and attention")
    p.add_argument("--vllm-only", action="store_true", help="skip lowbit's loop")
    p.add_argument("--prefix-caching", action="store_true",
                   help="keep vLLM's prefix cache on (off by default: every level and round resends the same "
                        "prompts, which a cache would serve from memory after the first)")
    p.add_argument("--eager", action="store_true",
                   help="vLLM without its torch.compile step (starts in seconds; not vLLM's default speed)")
    p.add_argument("--out", type=Path, default=Path("bench_out/serve"))
    p.set_defaults(func=serve.run)
