"""Runtime: running a compiled graph's steps (allocation, launch, CUDA-graph replay)."""
