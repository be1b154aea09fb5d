"""One native kernel library of ``kernels/csrc``: built on first use with the kernel flag sets
(:func:`lowbit.native.cbuild.kernel_flag_sets`), and the KernelError its callers get where no C
compiler could build it. Written once for the 4-bit, 8-bit and decode kernels."""

from __future__ import annotations

import ctypes
from pathlib import Path

from lowbit.kernels.linear_params import KernelError
from lowbit.native import cbuild

CSRC = Path(__file__).parents[1] / "csrc"


class KernelLibrary(cbuild.NativeLibrary):
    """``csrc/<source>`` with ``bind`` setting its ctypes signatures; ``name`` goes in errors."""

    def __init__(self, name: str, source: str, bind) -> None:
        super().__init__(CSRC / source, cbuild.kernel_flag_sets, bind)
        self.name = name

    def available(self) -> bool:
        return self.get() is not None

    def built(self, lib: ctypes.CDLL | None = None) -> ctypes.CDLL:
        """``lib``, else the best build; a KernelError where none could be built."""
        lib = lib or self.get()
        if lib is None:
            raise KernelError(f"{self.name} native kernel: no C compiler could build it")
        return lib
