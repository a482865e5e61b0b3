"""Code generation: a schedule of fused groups → kernel source (C++/OpenMP or Triton)."""
