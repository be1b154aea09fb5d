"""CPU backends: lowbit's C kernels (``../csrc``) and the torch int8 operators they are compared with."""


def kernel_threads() -> str | None:
    """Where lowbit's C kernels run their threads in this process: ``"omp"`` (torch's OpenMP team,
    ``LOWBIT_THREADS=omp``), ``"pool"`` (their own, the default), None where no kernel built. Every
    library reads the same setting at its first call (``csrc/work_pool.h``)."""
    from lowbit.kernels.cpu import i8_gemm

    lib = i8_gemm.library()
    return None if lib is None else "omp" if lib.pool_threads_mode() == 2 else "pool"
