"""The ``kiln`` backend: autograd stage first, then the kernel compiler on its graphs.

``kiln_backend(gm, example_inputs)`` follows PyTorch's backend contract. The
autograd stage (``kiln.autograd.aot_compile``) derives functional, core-aten forward
and backward graphs and hands each to ``compile_aten_graph``. With the perf fallback on
(``runtime/perf_fallback.py``), inference calls are timed against the torch-level
graph run eagerly (``InferenceChoice``), training graphs each against its aten graph.
"""
# Names torch.compile only as the reference for the contract and semantics kiln
# follows (DESIGN.md); nothing here imports or calls torch's compiler stack.
from __future__ import annotations

import functools

import torch

from .. import config
from ..capture.backend_call import PINNED_INPUTS
from .compile import compile_aten_graph
from .runtime import perf_fallback
from .runtime.replay_lru import Recordings


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
    # the forward, backward and inference graphs the autograd stage compiles for each
    # input size of this graph: each kind's CUDA-graph recordings bounded together
    # The forward and inference graphs take the captured graph's inputs as they are:
    # where capture's guards pin their signature, so do they (the backward's inputs are
    # the forward's results: never pinned)
    pinned = bool(gm.meta.get(PINNED_INPUTS))
    compiler = functools.partial(compile_aten_graph, recordings=Recordings(), pinned=pinned)
    bw = functools.partial(compile_aten_graph, recordings=Recordings())
    inference = functools.partial(compile_aten_graph, recordings=Recordings(), pinned=pinned)
    wrap = perf_fallback.times_inference(gm)
    if wrap:                              # the inference path is timed as a whole
        inference = functools.partial(_untimed, recordings=inference.keywords["recordings"],
                                      pinned=pinned)
    if config.repro_after:                # the minifier checks the aten graphs
        from kiln.debug.minifier import stage_compiler
        compiler = stage_compiler("autograd", compiler)
        bw = stage_compiler("autograd", bw)
        inference = stage_compiler("autograd", inference)
    aot = aot_compile(gm, example_inputs, fw_compiler=compiler,
                      bw_compiler=config.bound(bw), inference_compiler=inference)
    if not wrap:
        return aot
    from ..debug import trace_dir
    return perf_fallback.InferenceChoice(aot, gm, example_inputs, trace_dir.current())


def _untimed(gm, example_inputs, recordings=None, pinned=False):
    """The inference graph's compiler when ``perf_fallback.InferenceChoice`` times the
    inference path against the torch-level graph: no second trial inside it."""
    return compile_aten_graph(gm, example_inputs, perf_fallback=False, recordings=recordings,
                              pinned=pinned)


kiln_backend.prepare = prepare
