"""The INT4 KV cache's decode step as one native call (``kv_decode_step``: the new keys and values
rotated, quantized and written, the query rotated in, attended from the codes and rotated back)
against the same steps called one by one (a ``fast_transform``, ``kv_quant_rows`` and a buffer
copy per side, ``attention_decode_packed``, a ``fast_transform`` and a cast): the main job's preset
built as ``lowbit bench decode`` builds it, both ways in one process (the same bits, so the same
tokens), generation interleaved; tok/s of 32 decode steps, medians of ``--repeats``, at 1 / 8 / 32
sequences of a 64-token prompt.

    .venv/bin/python scripts/kv_decode_step_ab.py [--formats w4a4-kv4-rot] [--repeats 7] [OUT.json]
"""
import contextlib

from lowbit.bench.decode_ab import ab_setup, as_is_against, save_rows
from lowbit.kernels.cpu import kv_packed


@contextlib.contextmanager
def _steps_one_by_one():
    real = kv_packed.kv_decode_step
    kv_packed.kv_decode_step = lambda *a, **k: None  # attend_one then takes its step-by-step path
    try:
        yield
    finally:
        kv_packed.kv_decode_step = real


def main() -> None:
    cli, _, tok, build = ab_setup(__doc__, "w4a4-kv4-rot", 7)
    save_rows(cli, __doc__, as_is_against(cli, tok, build, ("one_call", "steps"), _steps_one_by_one))


if __name__ == "__main__":
    main()
