"""The packed KV cache's C (``csrc/kv_packed.c``) at a git revision against the working tree's,
inside the main job's preset decoding as ``lowbit bench decode`` builds it: both builds in one
process, the same tokens checked first (the two must give the same bits), generation interleaved;
tok/s of 32 decode steps, medians of ``--repeats``, at 1 / 8 / 32 sequences of a 64-token prompt.

    .venv/bin/python scripts/kv_packed_rev_ab.py --rev REV [--formats w4a4-kv4-rot] [--repeats 7] [OUT.json]
"""
import contextlib
import sys
import tempfile
from pathlib import Path

from lowbit.bench.decode_ab import ab_setup, as_is_against, save_rows
from lowbit.kernels.cpu import kv_packed

sys.path.insert(0, str(Path(__file__).parent))
from batched_gemm_ab import _library_at  # noqa: E402


def main() -> None:
    cli, _, tok, build = ab_setup(__doc__, "w4a4-kv4-rot", 7,
                                  lambda ap: ap.add_argument("--rev", required=True, help="the revision to compare with"))
    with tempfile.TemporaryDirectory() as tmp:
        old = _library_at(cli.rev, Path(tmp), kv_packed)

        @contextlib.contextmanager
        def at_rev():
            real = kv_packed._LIB.get
            kv_packed._LIB.get = lambda flags=None: old
            try:
                yield
            finally:
                kv_packed._LIB.get = real

        rows = as_is_against(cli, tok, build, ("now", "rev"), at_rev)
    save_rows(cli, __doc__, {"rev": cli.rev, **rows})


if __name__ == "__main__":
    main()
