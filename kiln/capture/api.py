"""The public capture API: ``kiln.compile``, ``optimize``, ``explain``, ``export`` and
the small switches around them, with the semantics of PyTorch's own compile."""
# Names torch.compile only as the reference for the contract and semantics kiln
# follows (DESIGN.md); nothing here imports or calls torch's compiler stack.
from __future__ import annotations

import functools
import types

import torch

from kiln import config
from kiln.backends import lookup_backend
from kiln.capture.errors import Unsupported
from kiln.debug.breaks import hint, tag
from kiln.capture import eval_frame, marks
from kiln.capture.eval_frame import CompiledFunction, Recorder
from kiln.capture.marks import allow_in_graph, disallow_in_graph, graph_break, is_compiling

__all__ = ["Unsupported", "compile", "optimize", "explain", "export", "disable",
           "allow_in_graph", "disallow_in_graph", "graph_break", "reset", "run", "is_compiling"]


class CompiledModule(torch.nn.Module):
    """A module whose forward runs through kiln; shares parameters and state with the
    original (``_orig_mod``), as PyTorch's compiled modules do."""

    def __init__(self, mod, compiled_forward):
        super().__init__()
        self._orig_mod = mod
        self._kiln_forward = compiled_forward

    def forward(self, *args, **kwargs):
        return self._kiln_forward(self._orig_mod, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        mod = self._orig_mod
        if mod._forward_hooks or mod._forward_pre_hooks or "forward" in mod.__dict__ \
                or type(mod).forward is not self._kiln_forward.fn:  # patched on the class
            return self._kiln_call(*args, **kwargs)
        return self._kiln_forward(mod, *args, **kwargs)

    def __getattr__(self, name):
        if name in ("_orig_mod", "_kiln_forward", "_kiln_call"):
            return super().__getattr__(name)
        return getattr(self._orig_mod, name)


def _compile_callable(fn, backend, fullgraph, recorder=None, frozen=False, settings=None):
    recorder = recorder if recorder is not None else getattr(backend, "kiln_recorder", None)  # CompileProfiler
    be = lookup_backend(backend)
    make = _compiled_function_type(settings)
    if isinstance(fn, torch.nn.Module) and _is_ddp(fn):
        from kiln.distributed.ddp import compile_ddp
        return compile_ddp(fn, be, lambda f, b: _compile_callable(f, b, fullgraph, recorder, frozen, settings))
    if isinstance(fn, torch.nn.Module):
        fwd = make(type(fn).forward, be, fullgraph, recorder, frozen)
        cm = CompiledModule(fn, fwd)
        object.__setattr__(cm, "_kiln_call", make(_call_module_fn, be, fullgraph, recorder, frozen).__get__(fn))
        return cm
    if isinstance(fn, types.MethodType):
        return types.MethodType(make(fn.__func__, be, fullgraph, recorder, frozen), fn.__self__)
    if isinstance(fn, types.FunctionType):
        return make(fn, be, fullgraph, recorder, frozen)
    if isinstance(fn, CompiledFunction):
        return fn
    if callable(fn) and isinstance(getattr(type(fn), "__call__", None), types.FunctionType):
        return types.MethodType(make(type(fn).__call__, be, fullgraph, recorder, frozen), fn)
    raise TypeError(f"kiln.compile expects a function, method or nn.Module, got {type(fn).__qualname__}")


def _is_ddp(mod) -> bool:
    """A DistributedDataParallel (kiln/distributed/ddp.py compiles it), without
    importing torch.distributed when nothing loaded it."""
    import sys
    parallel = sys.modules.get("torch.nn.parallel.distributed")
    return parallel is not None and isinstance(mod, parallel.DistributedDataParallel)


def _compiled_function_type(settings):
    """CompiledFunction, or one applying ``settings`` (mode/options) around its calls."""
    if not settings:
        return eval_frame.CompiledFunction
    from kiln.capture.compile_options import ConfiguredFunction
    return functools.partial(ConfiguredFunction, settings=settings)


def _call_module_fn(mod, *args, **kwargs):
    return mod(*args, **kwargs)


def compile(fn=None, *, backend=None, fullgraph=False, dynamic=None, mode=None,
            options=None, disable=False):
    """Compile ``fn`` (a function, method or nn.Module); usable as a decorator with or
    without arguments. ``mode`` ("default", "reduce-overhead", "max-autotune",
    "max-autotune-no-cudagraphs") or ``options`` (``kiln.list_options()``) set kiln.config
    settings for this function's compiles and calls (``compile_options.py``); anything
    else is rejected. ``dynamic``: None (sizes that change between calls become symbolic),
True (symbolic from the first call) or False (a graph per size)."""
    from kiln.capture.compile_options import settings_for

    settings = settings_for(mode, options)
    if dynamic is not None:   # True / False: this function's sizes (kiln/shapes/policy.py)
        settings["dynamic_shapes"] = "true" if dynamic else "false"
    backend = backend if backend is not None else config.default_backend
    if fn is None:
        return lambda f: compile(f, backend=backend, fullgraph=fullgraph, dynamic=dynamic,
                                 mode=mode, options=options, disable=disable)
    if disable:
        return fn
    return _compile_callable(fn, backend, fullgraph, settings=settings)


def optimize(backend="kiln", nopython=False):
    """The decorator factory of the seed tutorial: ``kiln.optimize("eager")(fn)``."""
    def deco(fn):
        return _compile_callable(fn, backend, nopython)

    return deco


class ExplainOutput:
    def __init__(self, rec: Recorder):
        self.graphs = rec.graphs
        self.graph_count = len(rec.graphs)
        self.graph_break_count = len(rec.breaks)
        self.break_reasons = rec.breaks
        self.ops_per_graph = [[n for n in g.graph.nodes if n.op in ("call_function", "call_method", "call_module")
                               and n.target is not torch._C._set_grad_enabled] for g in rec.graphs]
        self.op_count = sum(len(o) for o in self.ops_per_graph)
        self.out_guards = rec.guards
        self.skipped_frames = rec.skips
        self.compile_time = rec.compile_time

    def __str__(self):
        lines = [f"Graph Count: {self.graph_count}",
                 f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}",
                 "Break Reasons:"]
        for i, b in enumerate(self.break_reasons, 1):
            lines.append(f"  Break Reason {i}:")
            lines.append(f"    Reason: {tag(b.break_id, b.reason)}")
            if hint(b.break_id):
                lines.append(f"    Hint: {hint(b.break_id)}")
            lines.append("    User Stack:")
            for s in b.user_stack:
                lines.append(f"      {s}")
        if self.skipped_frames:
            lines.append("Frames run eagerly:")
            lines += [f"  {s}" for s in self.skipped_frames]
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Graph {i}:")
            for n in ops:
                t = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
                lines.append(f"    {t}")
        lines.append("Out Guards:")
        for g in self.out_guards:
            lines.append(f"  {g.description}")
        return "\n".join(lines)


def explain(fn, *extra_args, **extra_kwargs):
    """``kiln.explain(fn)(*args)`` runs ``fn`` once under kiln (eager backend) and reports
    graphs, breaks with the user's lines, ops and guards."""
    def inner(*args, **kwargs):
        rec = Recorder()

        def counting_backend(gm, example_inputs):
            return gm.forward

        compiled = _compile_callable(fn, counting_backend, False, recorder=rec)
        compiled(*args, **kwargs)
        return ExplainOutput(rec)

    if extra_args or extra_kwargs:
        return inner(*extra_args, **extra_kwargs)
    return inner


def export(fn, *args, **kwargs):
    """One graph for ``fn`` on these inputs, and its guards; raises ``kiln.Unsupported``
    (naming the user's line) when ``fn`` cannot be a single graph."""
    rec = Recorder()
    captured = []

    def capture_backend(gm, example_inputs):
        captured.append(gm)
        return gm.forward

    compiled = _compile_callable(fn, capture_backend, True, recorder=rec)
    compiled(*args, **kwargs)
    if len(captured) != 1:
        raise Unsupported("K0047", f"export expected one graph, got {len(captured)}")
    return captured[0], rec.guards


def disable(fn=None, recursive=True):
    """Run ``fn`` eagerly even when called from compiled code (a graph break at the call),
    and everything it calls; with ``recursive=False`` only ``fn``'s own frame: the
    functions it calls by global name are compiled (``disable_frame.py``)."""
    if fn is None:
        return lambda f: disable(f, recursive)
    if not recursive:
        from kiln.capture.disable_frame import disable_frame
        return disable_frame(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        marks.state.disabled = marks.disabled_depth() + 1
        try:
            return fn(*args, **kwargs)
        finally:
            marks.state.disabled -= 1

    return marks.mark_disabled(wrapper)


def reset():
    """Forget everything compiled."""
    eval_frame.reset_all()


def run(fn):
    """Use existing compiled entries for ``fn`` but never compile new ones."""
    if isinstance(fn, CompiledFunction):
        fn.frozen = True
        return fn
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, CompiledFunction):
        fn.__func__.frozen = True
        return fn
    if isinstance(fn, CompiledModule):
        fn._kiln_forward.frozen = True
        return fn
    return fn
