"""Side-by-side benchmarks: eager PyTorch, torch.compile and kiln, in one process.

``python -m benchmarks --help`` for the command line; ``benchmarks/README.md`` for what
each figure means. The harness never lets one backend's failure stop the run: every
exception becomes that cell's recorded error.
"""
