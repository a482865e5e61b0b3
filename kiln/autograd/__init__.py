"""Ahead-of-time autograd: torch-level graph -> functional aten forward/backward graphs.

Pipeline (one module each): ``trace`` (dispatch-level tracing on meta tensors through
PyTorch's autograd engine, functionalizing and decomposing as it records), ``partition``
(min-cut split of the joint graph), ``runtime`` (the ``torch.autograd.Function`` and
the mutation/aliasing epilogue), ``ops`` (the op set and per-op rules), ``verify`` (the
aten IR verifier), ``saved`` (bytes saved for backward, kiln vs eager).
"""
from kiln.autograd.ops import CORE_OPS, DECOMPOSITIONS, KEEP_WHOLE
from kiln.autograd.runtime import aot_compile
from kiln.autograd.verify import verify_aten_graph

__all__ = ["CORE_OPS", "DECOMPOSITIONS", "KEEP_WHOLE", "aot_compile", "verify_aten_graph"]
