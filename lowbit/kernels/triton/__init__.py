"""Triton backends for CUDA: the W4A4 GEMM and the activation codes it reads."""
