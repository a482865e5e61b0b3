"""Ahead-of-time autograd: torch-level graph -> functional aten forward/backward graphs.

Pipeline (one module each): ``trace`` (dispatch-level tracing on meta tensors through
PyTorch's autograd engine, functionalizing and decomposing as it records), ``partition``
(min-cut split of the joint graph), ``runtime`` (the ``torch.autograd.Function`` and
the mutation/aliasing epilogue), ``ops`` (the op sets and per-op rules), ``verify`` (the
aten IR verifier), ``saved`` / ``report`` (bytes saved for backward, kiln vs eager).

How far the tracer decomposes is the backend's choice (``aot_compile(...,
decompositions=)``): "core" (the default, what the kernel compiler lowers) or "eager"
(``aot_eager``: functional, but batch norm, layer norm, softmax, GELU, convolution
keep their aten kernels and attention is one ``kiln.sdpa`` op, ``sdpa.py``).
``eager_calls`` is aot_eager's graph compiler (ops called through eager's bindings).
"""
from kiln.autograd.ops import CORE, CORE_OPS, DECOMPOSITIONS, EAGER, KEEP_WHOLE, OpSet
from kiln.autograd.runtime import aot_compile
from kiln.autograd.verify import verify_aten_graph

__all__ = ["CORE", "CORE_OPS", "DECOMPOSITIONS", "EAGER", "KEEP_WHOLE", "OpSet",
           "aot_compile", "verify_aten_graph"]
