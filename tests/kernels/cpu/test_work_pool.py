"""The native kernels' work pool (csrc/work_pool.h): the same bits from concurrent callers (ctypes
releases the GIL, so two Python threads can be inside one kernel library at once), from a forked
child (which has none of the parent's worker threads), and for every thread count."""

import os
import threading

import pytest
import torch

from lowbit.kernels.cpu import w4_gemv, w8_gemv
from lowbit.kernels import from_float
from tests.threads import assert_same_for_thread_counts

pytestmark = pytest.mark.skipif(not (w4_gemv.available() and w8_gemv.available()),
                                reason="no C compiler for the native kernels")


def _w4():
    torch.manual_seed(3)
    p = from_float(torch.randn(1024, 512), "w4a16", group=128)
    return w4_gemv.prepare(p), torch.randn(3, 512)


def test_many_thread_counts_same_bits():
    w, x = _w4()
    expect = w4_gemv.run(x, w)
    assert_same_for_thread_counts(lambda: w4_gemv.run(x, w), expect, counts=(1, 2, 3, 4, 7, 16))


def test_concurrent_callers_get_their_own_results():
    w, _ = _w4()
    xs = [torch.randn(2, 512) * (i + 1) for i in range(4)]
    expect = [w4_gemv.run(x, w) for x in xs]
    got, errors = {}, []

    def call(i):
        try:
            for _ in range(50):
                y = w4_gemv.run(xs[i], w)
                if not torch.equal(y, expect[i]):
                    errors.append(i)
            got[i] = True
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(got) == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_without_the_parents_workers():
    w, x = _w4()
    torch.set_num_threads(2)
    expect = w4_gemv.run(x, w)  # the parent's pool now has a worker thread
    pid = os.fork()
    if pid == 0:  # the child: no worker threads were copied; a 2-thread call must still finish right
        ok = torch.equal(w4_gemv.run(x, w), expect)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
