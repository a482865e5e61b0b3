"""Toolchain: the compilers kiln drives (g++, Triton), their probes, workers and caches."""
