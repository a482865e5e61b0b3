"""The kernel compiler: aten graphs → loop IR → fused C++/OpenMP or Triton kernels.

``compile_aten_graph(aten_gm, example_inputs)`` is the entry point; the ``kiln``
backend (``kiln.kernels.backend.kiln_backend``) runs the autograd stage first.
"""
from .compile import compile_aten_graph  # noqa: F401
