"""The ``aot_eager`` backend: kiln's ahead-of-time autograd, aten graphs run by PyTorch.

It tests capture + autograd without the kernel compiler: the forward and backward aten
graphs ``aot_compile`` derives are executed as they are (each a ``GraphModule``).
No kernel compiler fuses decomposed ops afterwards here, so the graphs use the "eager"
op set: functional, but batch norm, layer norm, softmax, GELU, convolution and
attention keep their efficient aten kernels (``ops.EAGER``), and each op is called
through eager's own binding where that reaches the same overload (``eager_calls``:
the ``OpOverload`` call path costs several times more CPU per op).
"""
from __future__ import annotations

from kiln.autograd.eager_calls import eager_calls
from kiln.autograd.symbolic import aot_compile_dynamic


# PyTorch's backend contract is followed by its signature only (DESIGN.md): nothing
# of torch's compiler stack is imported or called.
def aot_eager(gm, example_inputs):
    """``backend(gm, example_inputs) -> callable``, PyTorch's backend contract."""
    return aot_compile_dynamic(gm, example_inputs, fw_compiler=eager_calls,
                               bw_compiler=eager_calls, inference_compiler=eager_calls,
                               decompositions="eager")


#: takes graphs with symbolic sizes as they are (``backends_dynamic``): its autograd
#: trace serves every size (``symbolic.py``)
aot_eager.kiln_symbolic = True
