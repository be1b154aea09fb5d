"""For kernels that promise the same bits for any thread count."""

import torch


def assert_same_for_thread_counts(fn, expect: torch.Tensor, counts=(1, 2, 3)) -> None:
    """``fn()`` gives ``expect`` bit for bit with torch set to each thread count (then restored)."""
    threads = torch.get_num_threads()
    try:
        for n in counts:
            torch.set_num_threads(n)
            assert torch.equal(fn(), expect), f"{n} threads"
    finally:
        torch.set_num_threads(threads)
