"""The -rot presets' input steps before and after stop 47, per call, bf16 rows on 2 threads:
torch's gather of the outlier reorder then the C block Hadamard on one thread (the old path),
against the C call reading through the reorder itself, its rows on the work pool. Checks the
bits are equal; medians of 300 calls.

    .venv/bin/python scripts/hadamard_gather_ab.py [OUT.json]
"""
import statistics
import sys
import time

import torch

from lowbit.kernels.channel_order import permute_channels
from lowbit.kernels.cpu import hadamard as hk

SHAPES = [(1, 576, 512, 128), (16, 576, 512, 128), (118, 576, 512, 128),
          (1, 1536, 1472, 64), (16, 1536, 1472, 64), (118, 1536, 1472, 64)]


def _median_us(f, n=300):
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def _one_thread(lib, x, normal, block):
    """The C transform with threads=1, as it ran before the work pool."""
    y = torch.empty_like(x)
    lib.block_hadamard(x.data_ptr(), 1, x.shape[0], x.shape[1], x.stride(0), normal, block, hk.inverse_sqrt_f32(block),
                       y.data_ptr(), None, 1)
    return y


def main() -> None:
    torch.set_num_threads(2)
    lib = hk.library()
    rows = []
    for tokens, n, normal, block in SHAPES:
        x, perm = torch.randn(tokens, n).bfloat16(), torch.randperm(n)
        old = lambda: _one_thread(lib, permute_channels(x, perm), normal, block)  # noqa: E731
        new = lambda: hk.block_hadamard(x, normal, block, perm=perm)  # noqa: E731
        assert torch.equal(old().view(torch.int16), new().view(torch.int16))
        row = {"tokens": tokens, "n": n, "normal": normal, "block": block,
               "gather_then_one_thread_us": _median_us(old), "fused_pool_us": _median_us(new)}
        row["ratio"] = row["gather_then_one_thread_us"] / row["fused_pool_us"]
        rows.append(row)
        print(row, flush=True)
    if len(sys.argv) > 1:
        from lowbit.bench.machine import report
        from lowbit.io.atomic import write_json
        write_json(sys.argv[1], {"machine": report(), "what": __doc__, "threads": 2, "rows": rows})


if __name__ == "__main__":
    main()
