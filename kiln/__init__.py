"""kiln: a just-in-time compiler for PyTorch programs.

The public API, nothing else: ``kiln.compile`` and friends mirror the semantics of
PyTorch's own compile function; the machinery lives in ``kiln.capture``, ``kiln.autograd`` and
``kiln.kernels``.
"""
# Names torch.compile only as the reference for the contract and semantics kiln
# follows (DESIGN.md); nothing here imports or calls torch's compiler stack.
from __future__ import annotations

from kiln import config
from kiln.backends import list_backends, lookup_backend, register_backend
from kiln.capture.errors import BackendCompilerFailed
from kiln.capture.api import (
    Unsupported,
    allow_in_graph,
    compile,
    disable,
    disallow_in_graph,
    explain,
    export,
    graph_break,
    is_compiling,
    optimize,
    reset,
    run,
)
from kiln.capture.wrap_numpy import wrap_numpy
from kiln.shapes.marks import mark_dynamic, mark_static, maybe_mark_dynamic  # noqa: F401
from kiln.debug.logs import set_logs as _set_logs
from kiln.debug.profiler import CompileProfiler

_set_logs(config.logs)


def compile_times() -> str:
    """Time spent in each stage of compilation so far, as a readable table."""
    from kiln.debug.timing import report

    return report()


def list_options() -> list[str]:
    """The names ``kiln.compile(options=...)`` accepts (each a kiln.config setting)."""
    from kiln.capture.compile_options import list_options as names

    return names()


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait for the kernels kiln is compiling in the background (a new size class of a
    stream of sizes: until they are ready, that size runs its graph op by op; a large
    matmul fused with its epilogue: until it is ready, calls run the library product
    and a separate kernel; never a different result). Returns True if any were under
    way and all are done; benchmarks call it before timing the steady state."""
    from kiln.kernels import size_prebuild
    from kiln.kernels.codegen.triton import matmul_epilogue

    sizes = size_prebuild.wait(timeout)
    return matmul_epilogue.wait(timeout) or sizes


__all__ = [
    "BackendCompilerFailed",
    "CompileProfiler",
    "Unsupported",
    "allow_in_graph",
    "compile",
    "compile_times",
    "config",
    "disable",
    "disallow_in_graph",
    "explain",
    "export",
    "graph_break",
    "is_compiling",
    "list_backends",
    "list_options",
    "lookup_backend",
    "optimize",
    "register_backend",
    "reset",
    "run",
    "wait_for_compiles",
    "wrap_numpy",
]
