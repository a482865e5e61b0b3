"""Triton source for CUDA graphs, and the launcher that runs its kernels."""
