"""Kernels: reference (PyTorch), CPU fast paths and Triton. Algorithms call these, never raw kernels."""
