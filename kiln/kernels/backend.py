"""The ``kiln`` backend: autograd stage first, then the kernel compiler on its graphs.

``kiln_backend(gm, example_inputs)`` follows PyTorch's backend contract. The
autograd stage (``kiln.autograd.aot_compile``) derives functional, core-aten forward
and backward graphs and hands each to ``compile_aten_graph``.
"""
# Names torch.compile only as the reference for the contract and semantics kiln
# follows (DESIGN.md); nothing here imports or calls torch's compiler stack.
from __future__ import annotations

import torch

from .. import config
from .compile import compile_aten_graph


def _on_cuda(values) -> bool:
    """Any CUDA tensor among ``values`` (arguments of any type: only tensors count)."""
    return any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in values)


def prepare(args) -> None:
    """Called by the capture before it traces a call: when the call has CUDA tensors,
    Triton's one-time set-up starts now, in the background (``triton_setup``), beside
    the capture and the autograd stage rather than after them."""
    if _on_cuda(args):
        from .toolchain import triton_setup
        triton_setup.start()


def kiln_backend(gm, example_inputs):
    try:
        from kiln.autograd import aot_compile
    except ImportError as e:
        raise ImportError(
            "the 'kiln' backend needs kiln.autograd.aot_compile (the autograd stage), "
            f"which could not be imported ({e}); use backend='eager', or call "
            "kiln.kernels.compile_aten_graph on an aten graph directly") from e
    if _on_cuda(example_inputs):
        from .toolchain import triton_setup
        triton_setup.start()              # overlaps the autograd stage and lowering
    compiler = compile_aten_graph
    if config.repro_after:                # the minifier checks the aten graphs
        from kiln.debug.minifier import stage_compiler
        compiler = stage_compiler("autograd", compile_aten_graph)
    return aot_compile(gm, example_inputs, fw_compiler=compiler,
                       bw_compiler=config.bound(compiler), inference_compiler=compiler)


kiln_backend.prepare = prepare
