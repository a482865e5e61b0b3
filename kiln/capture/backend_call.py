"""Handing a captured graph to the backend, and its first run.

A backend is any callable ``backend(gm, example_inputs)``: kiln's own or the user's.
What it raises while compiling is its failure, not the program's: it becomes a
``BackendCompilerFailed`` naming the backend and the user's code, with the backend's
exception as ``__cause__`` (``suppress_errors`` then decides between eager and raising,
in ``eval_frame``). The compiled graph's first run is checked the same way: an
exception there is the program's own only if the captured graph raises it eagerly too.
"""
from __future__ import annotations

import logging

import torch

from kiln import config
from kiln.capture.errors import BackendCompilerFailed
from kiln.debug.breaks import tag
from kiln.shapes.variants import stream_size


#: ``gm.meta`` key: True when the entry's guards pin the dtype, device, sizes and
#: strides of every input of the graph to its example's (no symbolic size; every input
#: a tensor). Every call then has the first call's signature, and a backend may skip
#: checking it per call (the kernel compiler does: ``CompiledGraph(pinned=True)``).
PINNED_INPUTS = "kiln_pinned_inputs"


def backend_name(backend) -> str:
    return getattr(backend, "__qualname__", None) or getattr(backend, "__name__", None) \
        or type(backend).__qualname__


def compile_graph(backend, gm, example_inputs, where: list):
    """``backend(gm, example_inputs)``; its exception as a BackendCompilerFailed.
    ``where``: the user's lines the graph was captured from (file:line in fn: text)."""
    from kiln.capture.errors import InternalError, SkipFrame, Unsupported

    from kiln.debug import progress

    progress.graph()
    try:
        if config.repro_after:  # the minifier checks this stage (kiln/debug/minifier.py)
            from kiln.debug import minifier
            if minifier.active("capture"):
                return minifier.Checked("capture", gm, lambda: backend(gm, example_inputs),
                                        example_inputs, backend=backend)
        return backend(gm, example_inputs)
    except (Unsupported, SkipFrame, InternalError, BackendCompilerFailed):
        raise
    except Exception as e:  # noqa: BLE001 -- any backend's failure
        raise BackendCompilerFailed(backend_name(backend), "compiling", e, where) from e


class FirstRun:
    """The compiled graph, checked on its first call; it then puts the callable that
    worked in its place in the entry's namespace (later calls pay nothing).

    If the first call raises, it runs the captured graph eagerly (``eager``): an
    exception of the same type there is the program's own and is raised as eager
    raised it. Otherwise the backend failed: with ``suppress_errors`` the eager result
    is returned and the graph runs eagerly from then on (a warning says why); without,
    a BackendCompilerFailed is raised. A failed run that changed its inputs (a version
    counter or a geometry moved) cannot be repeated: its exception is raised as it is.
    """

    def __init__(self, compiled, eager, backend, where, namespace, name, stream=None):
        self.compiled = compiled
        self.eager = eager
        self.backend = backend
        self.where = where
        self.namespace = namespace
        self.name = name
        #: "later": the graph is one size of a stream, first called as such
        #: (``shapes.variants.stream_size``: the kernel compiler may build it on a thread)
        self.stream = stream

    def __call__(self, *args):
        before = _input_state(args)
        try:
            if self.stream is None:
                out = self.compiled(*args)
            else:
                with stream_size(self.stream):
                    out = self.compiled(*args)
        except Exception as e:  # noqa: BLE001 -- decided below
            failure = e
        else:
            self.namespace[self.name] = self.compiled
            return out
        if _input_state(args) != before:
            raise failure
        try:
            out = self.eager(*args)
        except Exception as e:  # noqa: BLE001
            if type(e) is type(failure):  # the program's own error: eager raises it too
                raise
            raise failure
        err = BackendCompilerFailed(backend_name(self.backend), "running", failure, self.where)
        if not config.suppress_errors:
            raise err from failure
        logging.getLogger("kiln").warning("%s; running that graph eagerly from now on", tag("K0055", str(err)))
        self.namespace[self.name] = self.eager
        return out


def _input_state(args):
    state = []
    for a in args:
        if isinstance(a, torch.Tensor):
            try:
                version = a._version
            except RuntimeError:  # an inference tensor has no version counter
                version = None
            state.append((version, a.shape, a.stride(), a.storage_offset()))
    return state
