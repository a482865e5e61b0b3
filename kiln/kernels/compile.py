"""``compile_aten_graph``: an aten FX graph and real example inputs → a fast callable.

``plan``: graph passes (``pad_mm``) → graph cache (``toolchain/graph_cache``) → lower
(``lowering/``) → verify → schedule (``scheduler``) → C++ (``codegen/cpp``) or Triton
(``codegen/triton``) source;
``build``: the plan → its kernels loaded (``toolchain/cxx_build``, ``codegen/triton/launcher``)
→ steps → ``Runtime`` (``runtime/``). Each stage is one named function below.
The callable is specialised to the sizes, strides and dtypes of the example inputs; a
call with others compiles again for those (kept side by side).
"""
from __future__ import annotations

import ctypes
import logging
import weakref

import torch
import torch.fx as fx

from .. import config, gc_pause
from ..debug.breaks import describe, tag
from ..debug import trace_dir
from ..debug.logs import log_for
from ..debug.timing import timed
from ..shapes.variants import current_stream_size
from . import ir, pad_mm, provenance, size_prebuild
from .codegen.cpp import source as cpp_source
from .codegen.triton import heuristics as triton_heuristics
from .codegen.size_args import SizeArgs, lifting
from .lowering import GraphLowering, View
from .plan_artefacts import Artefacts
from .runtime import in_place, perf_fallback
from .runtime.replay_lru import Recordings
from .runtime.runner import ExternStep, Runtime
from .scheduler import format_schedule, schedule
from .toolchain import cxx_build, graph_cache

_code_log = log_for("output_code")
_fallback_log = log_for("fallbacks")
_cache_log = log_for("cache")


def _signature(args):
    """What a specialisation depends on: sizes, strides, dtype and device of tensors."""
    return tuple((a.shape, a.stride(), a.dtype, a.device)
                 if isinstance(a, torch.Tensor) else (type(a), a) for a in args)


def _signature_check(args):
    """A generated function that says, without building the signature, whether a call's
    arguments have ``_signature(args)`` — one ``and`` chain of C-level comparisons (a
    graph of 40 small layers takes ~80 inputs, and building and hashing their signature
    cost more than the kernels it guards)."""
    names, terms, ns = [], [], {}
    for i, a in enumerate(args):
        x = f"a{i}"
        names.append(x)
        if isinstance(a, torch.Tensor):
            ns[f"D{i}"], ns[f"V{i}"] = a.dtype, a.device
            ns[f"S{i}"], ns[f"T{i}"] = tuple(a.shape), tuple(a.stride())
            terms.append(f"{x}.dtype is D{i} and {x}.shape == S{i} and {x}.stride() == T{i} "
                         f"and {x}.device == V{i}")
        else:
            ns[f"K{i}"], ns[f"V{i}"] = type(a), a
            terms.append(f"type({x}) is K{i} and {x} == V{i}")
    src = (f"def check({', '.join(names)}):\n"
           f"    return {' and '.join(terms) or 'True'}\n")
    exec(compile(src, "<kiln signature check>", "exec"), ns)
    return ns["check"]


def pick_target(example_inputs, target=None) -> str:
    target = target or config.kernel_target
    if target != "auto":
        return target
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return "triton"
    return "cpp"


def plan(gm: fx.GraphModule, example_inputs, target: str = "cpp") -> graph_cache.Plan:
    """Lower, schedule and generate source — or find all of it in the graph cache."""
    lift = gm.meta.get(SYMBOL_VALUES, ())
    gm, notes = _passes(gm, example_inputs)
    key, p = _cached(gm, example_inputs, target, lift)
    if p is not None:
        return p
    lo = _lower(gm, example_inputs, target)
    sched = _schedule(lo, target)
    arte = Artefacts({"fallbacks": list(lo.fallbacks), "target": target, "passes": notes},
                     {"ir": lambda: ir.format_program(lo.buffers),
                      "schedule": lambda: format_schedule(sched)})
    symbolic = gm.meta.get(SYMBOLIC_SIZES)
    with lifting(lift, every=bool(lift) and target == "triton",
                 literal_divisors=(target == "triton" and config.triton_literal_divisors
                                   and (not lift or symbolic is not None)),
                 symbolic=symbolic or ()):
        source, entries, kinfo, sizes = _generate(sched, lo, target)
    arte["source"] = source
    arte["kinfo"] = kinfo
    arte["size_args"] = sizes.values
    if _code_log.isEnabledFor(logging.INFO):
        _code_log.info("kernels: %s source for graph\n%s\n%s", target, arte["ir"],
                       _shown(source, gm) + _sizes_shown(sizes))
    p = graph_cache.Plan(graph_cache.Lowered(lo.buffers, lo.outputs, lo.device),
                         sched, source, entries, kinfo, arte, list(lo.fallback_messages),
                         sizes)
    if key is not None:
        with timed("kernels.graph_cache"):
            graph_cache.store(key, p)
    return p


#: ``gm.meta`` key: the values of the size symbols of the symbolic graph ``gm`` was
#: specialised from (``autograd/specialize``), lifted however small (``size_args.lifting``)
SYMBOL_VALUES = "kiln_symbol_values"
#: ``gm.meta`` key: the values of that symbolic graph's symbolic sizes and strides
#: (``autograd/specialize.size_expressions``): divisors with none of these values are literals
SYMBOLIC_SIZES = "kiln_symbolic_sizes"


def _sizes_shown(sizes) -> str:
    return ("\nsize arguments: " + ", ".join(f"ks{i}={v}" for i, v in enumerate(sizes.values))
            if sizes.values else "")


def _shown(source: str, gm) -> str:
    """The source as logged: each kernel under the user lines it computes (provenance)."""
    if not _code_log.isEnabledFor(logging.INFO):
        return source
    return provenance.annotate(source, provenance.user_lines_of(gm))


def build(gm: fx.GraphModule, example_inputs, target: str = "cpp", p=None):
    """One specialisation: returns (Runtime, artefacts dict for tests and logs).
    ``p``: its plan, when made already (``example_inputs`` are then not read)."""
    if p is None:
        p = checked_plan(gm, example_inputs, target)
    steps = _steps(p, _load(p, target), target)
    with timed("kernels.runtime"):
        # Triton kernels only: C++ kernels take their buffers ``__restrict__``
        rt = Runtime(p.lowered, p.sched, steps, p.lowered.device,
                     mutations=gm.meta.get(in_place.MUTATIONS) if target == "triton" else None)
    return rt, p.artefacts


def checked_plan(gm: fx.GraphModule, example_inputs, target: str):
    """``plan``, after the bug injector's check of the graph (``config.inject_bug``)."""
    if config.inject_bug:
        from ..debug.inject import check_compile
        check_compile(gm)
    return plan(gm, example_inputs, target)


# --- the pipeline's stages, in order ----------------------------------------------------
def _passes(gm, example_inputs):
    """Aten graph → aten graph: rewrites that change no value (``pad_mm``); the graph
    cache keys the rewritten graph. Returns (graph, the passes' log lines)."""
    with timed("kernels.passes"):
        return pad_mm.pad_matmuls(gm, example_inputs)


def _cached(gm, example_inputs, target, lift=()):
    """(key, plan found in the graph cache or None); key None: not cacheable. ``lift``:
    the values lifted however small (they change the source)."""
    with timed("kernels.graph_cache"):
        key = graph_cache.key_of(gm, example_inputs, target)
        if key is not None and lift:
            key = cxx_build.key_of(key, f"lift={sorted(lift)}")
        p = graph_cache.load(key)
    _cache_log.info("kernels: graph cache %s (%s source)", "hit" if p is not None else "miss" if key else "off",
                    target)
    if p is not None:
        for op, reason in p.fallback_messages:
            _fallback_log.info("kernels: %s falls back to aten (%s)", op, reason)
        _code_log.info("kernels: %s source for graph (cached)\n%s\n%s", target,
                       p.artefacts["ir"], _shown(p.source, gm))
    return key, p


def _lower(gm, example_inputs, target):
    """Aten graph → loop IR (``lowering``), verified."""
    with timed("kernels.lowering"):
        lo = GraphLowering(gm, example_inputs, target).run()
        ir.verify(lo.buffers)
    return lo


def _schedule(lo, target):
    """Loop IR → fused groups in order (``scheduler``)."""
    out_names = {v.buf for v in _leaf_views(lo.outputs)} | lo.pinned
    with timed("kernels.scheduling"):
        triton = target == "triton"
        return schedule(lo.buffers, out_names,
                        matmul_epilogues=triton and config.matmul_epilogue != "off",
                        loops_apart=triton_heuristics.loops_apart if triton else None)


def _generate(sched, lo, target):
    """Groups → source: (source, entries, Triton kernel info or None, the size
    arguments' values: ``codegen/size_args``) (``codegen``)."""
    with timed("kernels.codegen"):
        if target == "cpp":
            source, entries, vals = cpp_source.generate(sched, lo.buffers)
            return source, entries, None, SizeArgs(vals)
        from .codegen.triton import source as triton_source
        return triton_source.generate_sized(sched, lo.buffers)


def _load(p, target):
    """Source → callables (``toolchain``): the C++ library's entry points, or one Triton
    launcher per segment."""
    sizes = p.size_args or SizeArgs()
    if target == "cpp":
        lib = _cpp_library(p.source, sizes) if p.entries else None
        ks = (ctypes.c_int64 * max(1, len(sizes.values)))(*sizes.values)
        steps = [_cpp_step(getattr(lib, name), params, ks) for name, params in p.entries]
        for s in steps:
            s.lib = lib               # keeps the library in _LIBRARIES while the step lives
        return steps
    from .codegen.triton import launcher
    return list(launcher.load(p.source, p.entries, p.kinfo, sizes, p.lowered.device))


def _steps(p, kernels, target):
    """The runtime's steps: each group's library call, or the next segment's kernel."""
    by_name = {b.name: b for b in p.lowered.buffers}
    kernels = iter(kernels)
    steps, seg_open = [], False
    for g in p.sched.groups:
        if g.extern is not None:
            steps.append(ExternStep(g.extern, by_name))
            seg_open = False
        elif not seg_open:
            seg_open = True
            steps.append(next(kernels))
    return steps


#: C++ libraries loaded by graphs still alive, by source: one loaded again means a graph
#: differing only in sizes reuses it (``size_args``), which the output_code log says
_LIBRARIES = weakref.WeakValueDictionary()


def _cpp_library(source: str, sizes):
    lib = _LIBRARIES.get(source)
    if lib is not None:
        _code_log.info("kernels: C++ library reused for new sizes (%s)",
                       ", ".join(f"ks{i}={v}" for i, v in enumerate(sizes.values)) or "none")
        return lib
    lib = _LIBRARIES[source] = ctypes.CDLL(cxx_build.compile_cpp(source))
    return lib


def _needs_compiler(p, target: str) -> bool:
    """Does building plan ``p`` run a compiler (nothing in this process nor on disk
    has its kernels, and no background compile of its source ended)?"""
    if not p.entries or size_prebuild.compiled(target, p.source):
        return False
    if target == "cpp":
        return p.source not in _LIBRARIES and not cxx_build.library_cached(p.source)
    from .codegen.triton import launcher
    return launcher.needs_compiler(p.source, p.kinfo)


def _cpp_step(fn, params, ks):
    """One segment's call: the size arguments ``ks`` (a ctypes array the step keeps
    alive), then an array of the tensors' data pointers (made per call: two threads
    may run one graph, and autograd's backward does)."""
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    ks_ptr = ctypes.addressof(ks)
    pointers = ctypes.c_uint64 * max(1, len(params))

    def step(rt, tensors):
        fn(ks_ptr, pointers(*[tensors[p].data_ptr() for p in params]))
    step.ks = ks
    step.params = params
    return step


def _leaf_views(tree):
    from torch.utils import _pytree as pytree
    return [v for v in pytree.tree_leaves(tree, is_leaf=lambda x: isinstance(x, View))
            if isinstance(v, View)]


class EagerGraph(perf_fallback.EagerVariant):
    """A specialisation whose kernels could not be built or loaded, with
    ``config.suppress_errors`` on: the aten graph run by PyTorch op by op. ``break_id``
    names the reason in kiln/debug/breaks.py."""

    def __init__(self, gm, break_id: str, reason: str):
        super().__init__(gm)
        self.break_id, self.reason = break_id, reason


class CompiledGraph:
    """Callable over the graph's inputs, one specialisation per input signature.

    Building a specialisation (lowering, the C++ or Triton compiler, loading the
    library) and its first call (where Triton compiles what it has not yet and CUDA
    loads modules) are where kernels fail to build: with ``config.suppress_errors`` the
    specialisation then runs the aten graph eagerly (``EagerGraph``, a warning naming
    why); without it the error is raised. The graph is functional, so a first call that
    failed leaves its inputs as they were and is simply run again eagerly."""

    def __init__(self, gm, example_inputs, target=None, perf_fallback=True, recordings=None,
                 pinned=False):
        self.gm = gm
        #: every caller's guards pin the inputs' signature (``capture.backend_call.
        #: PINNED_INPUTS``): after the first call, calls skip the signature check (for a
        #: large model, hundreds of parameters' sizes and strides read again per call)
        self.pinned = pinned
        #: the CUDA-graph recordings of this graph's size variants, bounded together
        #: (``runtime/replay_lru``); a caller compiling one graph per size passes one
        self.recordings = recordings if recordings is not None else Recordings()
        #: time this graph's specialisations against eager (``runtime/perf_fallback``)
        self.perf_fallback = perf_fallback
        self.requested_target = target
        self.variants = {}
        #: per signature, the generated check of it (``_signature_check``)
        self._checks = {}
        #: the last variant used, with its check: a call with the same signature (every
        #: call, usually) skips building the key
        self._last = None
        #: id of each built Runtime not yet called -> its signature
        self._untried = {}
        self.artefacts = None
        #: shape class -> the perf fallback's decision (``runtime/perf_fallback.py``)
        self.perf_choices = {}
        #: the traced compile this graph belongs to: kernels built later are filed there
        self._trace_owner = trace_dir.current()
        # Meta stand-ins (what the autograd stage passes) say nothing of the device nor
        # of real values: compile on the first call instead.
        if not any(isinstance(t, torch.Tensor) and t.device.type == "meta"
                   for t in example_inputs):
            self._build(example_inputs)

    def _build(self, args):
        sig = _signature(args)
        if any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args):
            # real meta tensors: there is no data for kernels to read
            _fallback_log.info("kernels: %s", tag("K0203", "a graph called on meta tensors runs op by op"))
            rt = self.variants[sig] = EagerGraph(self.gm, "K0203", "called on meta tensors")
            return rt

        def make():
            target = pick_target(args, self.requested_target)
            if target == "triton" and any(isinstance(a, torch.Tensor) and
                                          a.device.type == "cuda" for a in args):
                from .toolchain import triton_setup
                triton_setup.start()          # overlaps this graph's lowering
            if current_stream_size() == "first" and size_prebuild.targets(target):
                from . import plan_process
                plan_process.start_for(target, args)
            if size_prebuild.wanted(target):
                pending = size_prebuild.planned_elsewhere(
                    self.gm, args, target, lambda p: _needs_compiler(p, target))
                if pending is not None:
                    # planned in the planner process (and compiled on a thread, if new)
                    return pending
                p = checked_plan(self.gm, list(args), target)
                if _needs_compiler(p, target):
                    # a new size class of a stream: compiled on a thread meanwhile
                    self.artefacts = p.artefacts
                    return size_prebuild.Pending(self.gm, p, target)
                return self._built(sig, *build(self.gm, None, target, p=p))
            return self._built(sig, *build(self.gm, list(args), target))
        return self._guarded(sig, make)

    def _guarded(self, sig, make):
        """The variant ``make()`` returns, kept for ``sig``; when it raises, with
        ``config.suppress_errors``, the graph run eagerly instead (a warning says why)."""
        try:
            rt = make()
        except Exception as e:                # noqa: BLE001  (suppress_errors: eager)
            if not config.suppress_errors:
                raise
            rt = self._eager("K0201", e, "built")
        self.variants[sig] = rt
        return rt

    def _built(self, sig, rt, artefacts, size_seen: bool = False):
        """A built Runtime as this graph calls it: in its CUDA-graph family, timed
        against eager (``perf_fallback``), first called through ``_first_call``.
        ``size_seen``: calls of these sizes ran before (op by op: ``size_prebuild``)."""
        self.artefacts = artefacts
        size_prebuild.built()
        if getattr(rt, "graphs", None) is not None:
            rt.graphs.family = self.recordings
            rt.graphs.size_seen = size_seen
        rt = perf_fallback.maybe_trial(rt, self, sig, self.perf_fallback)
        self._untried[id(rt)] = sig
        return rt

    def _prebuilt(self, pending, args):
        """The variant of a Pending whose background work ended, built now (its kernels
        found compiled; one whose compile failed there compiles here; one the planner
        could not plan is planned here, from ``args``)."""
        sig = next(k for k, v in self.variants.items() if v is pending)
        self._last = None
        p, target = pending.plan, pending.target
        if p is not None:
            self.artefacts = p.artefacts

        def make():
            if p is None:
                return self._built(sig, *build(self.gm, list(args), target), size_seen=True)
            return self._built(sig, *build(self.gm, None, target, p=p), size_seen=True)
        with timed("kernels"), trace_dir.within(self._trace_owner), gc_pause.paused():
            return self._guarded(sig, make)

    def _eager(self, break_id: str, error: Exception, stage: str) -> EagerGraph:
        reason = f"{type(error).__name__}: {error}"
        _fallback_log.warning("kiln: the kernels of a graph could not be %s (%s); "
                              "running that graph with PyTorch eagerly",
                              stage, describe(break_id, reason.strip()))
        if self.artefacts is None:
            self.artefacts = {"target": "eager", "error": reason}
        return EagerGraph(self.gm, break_id, reason)

    @property
    def target(self):
        return self.artefacts["target"] if self.artefacts else None

    def __call__(self, *args):
        last = self._last
        rt = last[1] if self.pinned and last is not None else self._variant(args)
        if type(rt) is size_prebuild.Pending and rt.done.is_set():
            rt = self._prebuilt(rt, args)
        if self._untried and id(rt) in self._untried:
            return self._first_call(rt, list(args), boxed=False)
        return rt(*args)

    def call_boxed(self, args: list):
        """Call with the inputs in a list the call takes over and empties, so each is
        freed after its last reader (``Runtime.call_boxed``)."""
        last = self._last
        rt = last[1] if self.pinned and last is not None else self._variant(args)
        if type(rt) is size_prebuild.Pending and rt.done.is_set():
            rt = self._prebuilt(rt, args)
        if self._untried and id(rt) in self._untried:
            try:
                return self._first_call(rt, args, boxed=True)
            finally:
                args.clear()
        return rt.call_boxed(args)

    def _first_call(self, rt, args: list, boxed: bool):
        sig = self._untried.pop(id(rt))
        if not config.suppress_errors:
            return rt.call_boxed(args) if boxed else rt(*args)
        try:
            return rt.call_boxed(list(args)) if boxed else rt(*args)
        except Exception as e:                # noqa: BLE001  (suppress_errors: eager)
            failure = e
        eager = EagerGraph(self.gm, "K0202", f"{type(failure).__name__}: {failure}")
        try:
            out = eager(*args)
        except Exception as e:                # noqa: BLE001
            if type(e) is type(failure):      # the program's own error: eager raises it too
                raise
            raise failure from None
        self.variants[sig] = self._eager("K0202", failure, "loaded or launched")
        self._last = None
        return out

    def _variant(self, args):
        """The Runtime of the specialisation matching ``args`` (built if new)."""
        last = self._last
        if last is not None:
            try:
                hit = last[0](*args)
            except (AttributeError, TypeError, RuntimeError):  # not a tensor now; arity
                hit = False
            if hit:
                return last[1]
        sig = _signature(args)
        rt = self.variants.get(sig)
        if rt is None:
            with timed("kernels"), trace_dir.within(self._trace_owner), gc_pause.paused():
                rt = self._build(args)
        check = self._checks.get(sig)
        if check is None:
            check = self._checks[sig] = _signature_check(args)
        self._last = (check, rt)
        return rt


def compile_aten_graph(aten_gm: fx.GraphModule, example_inputs, target: str | None = None,
                       perf_fallback: bool = True, recordings=None, pinned: bool = False):
    """Compile a functional aten graph; the result takes its inputs positionally and
    returns what the graph returns. ``target``: "cpp", "triton" or None (by device).
    ``perf_fallback``: time it against the aten graph run eagerly (when
    ``config.perf_fallback`` is on; False where a caller times it itself).
    ``recordings``: a ``runtime.replay_lru.Recordings`` shared by the graphs compiled for
    each size of one graph, bounding their CUDA-graph recordings together.
    ``pinned``: every call has the first call's input signature (its caller's guards
    say so), which is then not checked again."""
    if config.repro_after:                    # the minifier checks this stage
        from ..debug import minifier
        if minifier.active("kernels"):
            return minifier.Checked("kernels", aten_gm,
                                    lambda: CompiledGraph(aten_gm, list(example_inputs), target),
                                    example_inputs, target=target)
    with timed("kernels"):
        return CompiledGraph(aten_gm, list(example_inputs), target, perf_fallback, recordings,
                             pinned)
