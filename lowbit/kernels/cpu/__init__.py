"""CPU backends: lowbit's C kernels (``../csrc``) and the torch int8 operators they are compared with."""


def kernel_threads() -> str | None:
    """Where lowbit's C kernels run their threads in this process: ``"auto"`` (the default: torch's
    OpenMP team while it answers, their own pool for a while after a call it came late to),
    ``"omp"`` (always the team, ``LOWBIT_THREADS=omp``), ``"pool"`` (always their own,
    ``LOWBIT_THREADS=pool``, a process without an OpenMP runtime, or a forked child), None where no
    kernel built. Every library reads the same setting at its first call (``csrc/work_pool.h``)."""
    from lowbit.kernels.cpu import i8_gemm

    lib = i8_gemm.library()
    return None if lib is None else {1: "pool", 2: "omp", 3: "auto"}[lib.pool_threads_mode()]
