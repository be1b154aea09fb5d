"""One native kernel library (``--library``: a module of ``lowbit/kernels/cpu`` with its C source in
``csrc``; default the packed KV cache's, ``kv_packed``) at a git revision against the working tree's,
inside a format decoding as ``lowbit bench decode`` builds it: both builds in one process, the same
tokens checked first (the two must give the same bits), generation interleaved; tok/s of 32 decode
steps, medians of ``--repeats``, at 1 / 8 / 32 sequences of a 64-token prompt.

    .venv/bin/python scripts/kernel_rev_decode_ab.py --rev REV [--library kv_packed] [--formats w4a4-kv4-rot]
        [--repeats 7] [OUT.json]
"""
import contextlib
import importlib
import sys
import tempfile
from pathlib import Path

from lowbit.bench.decode_ab import ab_setup, as_is_against, save_rows

sys.path.insert(0, str(Path(__file__).parent))
from batched_gemm_ab import _library_at  # noqa: E402


def _options(ap) -> None:
    ap.add_argument("--rev", required=True, help="the revision to compare with")
    ap.add_argument("--library", default="kv_packed", help="a module of lowbit.kernels.cpu (kv_packed, a16_gemm, ...)")


def main() -> None:
    cli, _, tok, build = ab_setup(__doc__, "w4a4-kv4-rot", 7, _options)
    module = importlib.import_module(f"lowbit.kernels.cpu.{cli.library}")
    with tempfile.TemporaryDirectory() as tmp:
        old = _library_at(cli.rev, Path(tmp), module)

        @contextlib.contextmanager
        def at_rev():
            real = module._LIB.get
            module._LIB.get = lambda flags=None: old
            try:
                yield
            finally:
                module._LIB.get = real

        rows = as_is_against(cli, tok, build, ("now", "rev"), at_rev)
    save_rows(cli, __doc__, {"rev": cli.rev, "library": cli.library, **rows})


if __name__ == "__main__":
    main()
