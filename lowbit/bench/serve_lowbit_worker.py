"""lowbit's own ``generate`` loop under the serving benchmark's load, in its own process (so its
memory is measured as the server's is): ``python -m lowbit.bench.serve_lowbit_worker REQ RESULT``.

lowbit has no server and no continuous batching: at concurrency C it takes the requests C at a
time as one static batch (prompts left-padded to the longest, every sequence decoded to the
batch's longest output), the way ``lowbit bench decode`` runs a batch. Each request's tokens are
timed as the batch produces them, so its records match the streaming client's: TTFT from the
batch's start, then the gaps between its own tokens, up to its own length (tokens a sequence
makes beyond it are padding work, counted in the wall time, not in the output).
"""

from __future__ import annotations

import json
import sys
import time


class StepClock:
    """A ``generate`` streamer that only notes when each step's tokens are out (the first call is the prompt)."""

    def __init__(self):
        self.calls: list[float] = []

    def put(self, value):
        self.calls.append(time.perf_counter())

    def end(self):
        pass

    @property
    def steps(self) -> list[float]:
        return self.calls[1:]


def load(folder: str, kernel: str | None, native: bool):
    """lowbit's decode-ready model: fast kernels, native norms/rotary/attention, inside bf16
    (``bench decode``'s setup, :func:`lowbit.bench.decode.runs_in_bf16`)."""
    import torch

    from lowbit.accelerate.native_ops import use_native_ops
    from lowbit.checkpoint import load_model

    model, tok = load_model(folder, dtype=torch.float32, kernel=kernel)
    if native:
        dict(use_native_ops(model))
    from lowbit.bench.decode import runs_in_bf16

    if runs_in_bf16(getattr(model, "lowbit_kernels", {})):
        model.to(dtype=torch.bfloat16)
    return model.eval(), tok


def run_batch(model, pad: int, batch: list[dict]) -> tuple[list[dict], float]:
    """One static batch: per-request records and the batch's wall seconds."""
    import torch

    longest = max(len(r["prompt_ids"]) for r in batch)
    ids = torch.full((len(batch), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(batch):  # left padding: every sequence's next token is in the last column
        ids[i, longest - len(r["prompt_ids"]):] = torch.tensor(r["prompt_ids"])
        mask[i, longest - len(r["prompt_ids"]):] = 1
    new = max(r["max_tokens"] for r in batch)
    clock = StepClock()
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=pad, streamer=clock)
    wall = time.perf_counter() - t0
    steps = clock.steps
    if len(steps) != new:
        raise RuntimeError(f"generate made {len(steps)} steps, asked for {new}")
    records = []
    for r in batch:
        mine = steps[: r["max_tokens"]]
        records.append({"prompt_tokens": len(r["prompt_ids"]), "requested_tokens": r["max_tokens"],
                        "output_tokens": len(mine), "ttft": mine[0] - t0,
                        "itl": [b - a for a, b in zip(mine, mine[1:])], "latency": mine[-1] - t0, "error": None})
    return records, wall


def main(argv: list[str]) -> int:
    import torch

    from lowbit.io.atomic import write_json

    from .decode import PeakRSS

    request_path, result_path = argv
    with open(request_path) as f:
        req = json.load(f)
    if req.get("threads"):
        torch.set_num_threads(req["threads"])
    t0 = time.perf_counter()
    model, tok = load(req["model"], req.get("kernel"), req.get("native", True))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    result = {"load_s": time.perf_counter() - t0, "points": []}
    warm = req["requests"][0]
    run_batch(model, pad, [dict(warm, max_tokens=2)])
    for c in req["concurrency"]:
        todo = req["requests"][: req["counts"][str(c)]]
        records, wall, start = [], 0.0, time.perf_counter()
        with PeakRSS() as mem:
            for i in range(0, len(todo), c):
                if time.perf_counter() - start >= req["budget_s"]:
                    break
                recs, secs = run_batch(model, pad, todo[i: i + c])
                records += recs
                wall += secs
                print(f"concurrency {c}: {len(records)}/{len(todo)} requests, {wall:.1f} s", flush=True)
        result["points"].append({"concurrency": c, "records": records, "wall_s": wall,
                                 "unsent": len(todo) - len(records), "peak_rss_bytes": mem.peak})
    write_json(result_path, result)  # atomic: the caller reads a whole file or none
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
