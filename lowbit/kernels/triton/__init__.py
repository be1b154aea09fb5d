"""Triton backends for CUDA: the W4A4 GEMM, the activation codes it reads, the online block Hadamard.

Triton is optional (only needed on a GPU, or for the interpreter tests): it is imported once here,
and the kernel modules take ``triton``, ``tl`` (None without it) and ``available`` from here."""

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = tl = None


def available() -> bool:
    return triton is not None
