"""Compilers that take only concrete sizes, fed from one symbolic autograd trace.

The kernel compiler lowers graphs of plain int sizes. Given the forward, backward or
inference aten graph of a symbolic trace (``symbolic.py``), ``PerSizeGraph`` compiles,
per sizes and strides of the arguments whose sizes are symbolic (and the values of
symbolic ints; every size of a stream, the variants kept in
``shapes/variants.SizeVariants``: least recently used dropped beyond
``config.dynamic_specializations``), a copy of the
graph specialised to those sizes: the symbols' values read off the arguments (solved
from each placeholder's symbolic sizes), every size node (``sym_size``, ``operator``)
folded to its int, int placeholders and int outputs taken out (the compiled graph sees
tensors only; the wrapper puts the ints back), and each node's ``meta["val"]``
recomputed on meta tensors of the concrete sizes, as a concrete trace records it. The
autograd trace, functionalization, decomposition and partition ran once.
"""
from __future__ import annotations

import copy
import hashlib
import operator
import warnings

import sympy
import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule

from kiln import config, gc_pause
from kiln.autograd import sdpa
from kiln.autograd.grad_parts import free_symbols
from kiln.autograd.sym_nodes import SymbolicUnsupported
from kiln.debug import trace_dir
from kiln.debug.logs import log_for
from kiln.fast_meta import meta_result
from kiln.shapes.variants import SizeVariants, stream_size

_META = torch.device("meta")
_log = log_for("perf_hints")


def _symbols_of(graph: fx.Graph) -> set:
    return set().union(*(free_symbols(n.meta.get("val")) for n in graph.nodes))


def _equations(placeholders, values):
    """(symbolic size, its value) for every size of every placeholder."""
    eqs = []
    for ph, a in zip(placeholders, values):
        v = ph.meta.get("val")
        if isinstance(v, torch.Tensor):
            for n, m in zip(v.shape, a.shape if isinstance(a, torch.Tensor) else a):
                if isinstance(n, torch.SymInt):
                    eqs.append((n.node.expr, int(m)))
        elif isinstance(v, torch.SymInt):
            eqs.append((v.node.expr, int(a)))
    return eqs


def solve(eqs, wanted) -> dict | None:
    """Values of the ``wanted`` symbols from ``eqs`` [(expression, int)], solving each
    equation with one unknown left; None when some stay unknown."""
    bound: dict = {}
    progress = True
    while progress and not wanted <= set(bound):
        progress = False
        for e, v in eqs:
            e2 = e.xreplace(bound)
            free = e2.free_symbols
            if len(free) != 1:
                continue
            (s,) = free
            if e2 == s:
                bound[s] = sympy.Integer(v)
            else:
                sol = [r for r in sympy.solve(sympy.Eq(e2, v), s) if r.is_Integer and r > 0]
                if len(sol) != 1:
                    continue
                bound[s] = sol[0]
            progress = True
    return bound if wanted <= set(bound) else None


def _is_symbolic(v) -> bool:
    if isinstance(v, torch.SymInt):
        return True
    return isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt)
                                               for s in (*v.shape, *v.stride()))


class PerSizeGraph:
    """``compiler`` applied to ``gm`` specialised per signature of arguments (see the
    module docstring). Refuses (``SymbolicUnsupported``) a graph whose symbols its
    placeholders do not give."""

    def __init__(self, gm: fx.GraphModule, compiler):
        self.gm = gm
        self.compiler = compiler
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.symbols = _symbols_of(gm.graph)
        hints = [_hint_value(n.meta.get("val")) for n in self.placeholders]
        if solve(_equations(self.placeholders, hints), self.symbols) is None:
            raise SymbolicUnsupported("a backward or forward graph whose sizes its inputs "
                                      "do not give")
        #: the arguments whose sizes are symbolic: their sizes and strides (an int's value)
        #: key the variants. The others' shapes, dtypes and layouts are the capture's
        #: guards' to keep; a layout the guards leave free (a tangent's strides) the
        #: compiled graph tells apart itself (``CompiledGraph``: one build per signature)
        self.dynamic = [i for i, n in enumerate(self.placeholders) if _is_symbolic(n.meta.get("val"))]
        self.code_key = _code_key(gm)
        self.literal_symints = literal_symints(gm.graph)
        self.size_expressions = size_expressions(gm.graph)
        #: key -> (compiled callable, kept argument positions, output template)
        self.variants = SizeVariants()
        #: the frame compile this graph belongs to: each size's kernels are its artefacts
        #: (KILN_TRACE), though compiled at that size's first call
        self.trace_owner = trace_dir.current()
        self.logged = False

    @property
    def compiled(self):
        """The variants kept, by signature (an OrderedDict, least recently used first)."""
        return self.variants.table

    @property
    def uncompiled_calls(self) -> int:
        return self.variants.uncompiled_calls

    def _key(self, args):
        return tuple((a.shape, a.stride()) if isinstance(a, torch.Tensor) else a
                     for a in [args[i] for i in self.dynamic])

    def __call__(self, *args):
        before = sdpa.in_stream(True)
        try:
            return self._call(args)
        finally:
            sdpa.in_stream(before)

    def _call(self, args):
        key = self._key(args)
        hit = self.variants.get(key)
        if hit is not None:
            return _run(hit, args)
        if not self.variants.admit():
            return self._uncompiled(args)
        # a new size: compiled, and first called, as the first or a later size
        which = "later" if self.variants.compiles else "first"
        with trace_dir.within(self.trace_owner), stream_size(which):
            return _run(self.variants.put(key, self._compile(args)), args)

    def _uncompiled(self, args):
        """A new signature once the stream has cycled past the bound (``SizeVariants``)
        runs the symbolic graph itself, op by op as aot_eager does: compiling it would
        drop a variant the stream comes back to, a compile on every call."""
        if not self.logged:
            self.logged = True
            _log.info("more input sizes than KILN_DYNAMIC_SPECIALIZATIONS (%d) keep reaching "
                      "one graph: new sizes run its aten graph without compiling kernels",
                      SizeVariants.bound())
        self.variants.uncompiled_calls += 1
        out = self.gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def _compile(self, args):
        values = solve(_equations(self.placeholders, args), self.symbols)
        if values is None:
            raise RuntimeError("kiln: the sizes of a symbolic graph's inputs do not give "
                               "its symbols")
        with gc_pause.paused():
            gm, keep, template = specialise(self.gm, values, args, self.code_key,
                                            literal_symints=self.literal_symints,
                                            expressions=self.size_expressions)
        examples = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        return self.compiler(gm, examples), keep, template


_FROM_GRAPH = object()


def _run(variant, args):
    """A variant (compiled callable, kept argument positions, output template) called
    on a call's arguments, the ints put back among its outputs."""
    fn, keep, template = variant
    outs = fn(*[args[i] for i in keep])
    if template is None:
        return outs
    it = iter(outs)
    return tuple(next(it) if t is _FROM_GRAPH else t for t in template)


def _hint_value(v):
    if isinstance(v, torch.Tensor):
        return [s.node.hint if isinstance(s, torch.SymInt) else s for s in v.shape]
    if isinstance(v, torch.SymInt):
        return v.node.hint
    return v


def _concrete(x, values):
    if isinstance(x, torch.SymInt):
        e = x.node.expr.xreplace(values)
        if not e.is_Integer:
            raise RuntimeError(f"kiln: the size {x} is not an integer at {values}")
        return int(e)
    return x


def _code_key(gm: fx.GraphModule) -> str:
    return hashlib.sha256(gm.code.encode()).hexdigest()


def _holds_symint(x) -> bool:
    if isinstance(x, torch.SymInt):
        return True
    if isinstance(x, (tuple, list)):
        return any(_holds_symint(y) for y in x)
    if isinstance(x, dict):
        return any(_holds_symint(y) for y in x.values())
    return False


def literal_symints(graph: fx.Graph) -> bool:
    """Does a node take a SymInt as it is, not through a size node (a structural zero
    of a backward for some tangents: ``grad_parts._present``'s ``zeros([s1])``)?"""
    return any(n.op == "call_function" and _holds_symint((n.args, n.kwargs))
               for n in graph.nodes)


def size_expressions(graph: fx.Graph) -> tuple:
    """The symbolic sizes and strides of the graph's values (each expression once, no
    constant): at a specialisation their values are the integers that may change with
    the symbols (``kernels/compile.SYMBOLIC_SIZES``)."""
    out = set()
    for n in graph.nodes:
        v = n.meta.get("val")
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, torch.Tensor):
                sizes = (*x.shape, *x.stride())
            elif isinstance(x, torch.SymInt):
                sizes = (x,)
            else:
                continue
            out.update(s.node.expr for s in sizes if isinstance(s, torch.SymInt))
    return tuple(e for e in out if not e.is_Integer)


def specialise(gm: fx.GraphModule, values: dict, args, code_key: str | None = None,
               literal_symints: bool = True, expressions: tuple | None = None):
    """(a copy of ``gm`` at these symbol ``values``, positions of the arguments it
    takes, a template of its outputs with the ints put back, or None).
    ``literal_symints``: a node may take a SymInt as it is (``literal_symints(graph)``;
    made concrete too). ``expressions``: ``size_expressions(gm.graph)``, when
    known (their values go in the copy's ``meta["kiln_symbolic_sizes"]``). The copy's
    ``meta["kiln_code_key"]`` names its code without generating it: ``gm``'s code
    (``code_key``: its hash, when known), the values, the non-tensor arguments —
    what the copy is made from besides the tensors' layouts, which the graph cache
    keys on itself."""
    with warnings.catch_warnings():
        # (a node taking a SymInt as it is: made concrete below)
        warnings.filterwarnings("ignore", message="Raw SymInt value")
        graph = copy.deepcopy(gm.graph)
    keep = []
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    for i, (ph, a) in enumerate(zip(phs, args)):
        if isinstance(a, torch.Tensor) or a is None:
            keep.append(i)
            if isinstance(a, torch.Tensor):
                ph.meta["val"] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype,
                                                     device=_META)
        else:
            ph.replace_all_uses_with(_concrete(ph.meta.get("val"), values)
                                     if isinstance(ph.meta.get("val"), torch.SymInt) else a)
            graph.erase_node(ph)
    for n in list(graph.nodes):
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.SymInt):
            n.replace_all_uses_with(_concrete(n.meta["val"], values))
            graph.erase_node(n)
    if literal_symints:
        for n in graph.nodes:
            if n.op == "call_function" and _holds_symint((n.args, n.kwargs)):
                n.args, n.kwargs = fx.node.map_aggregate(
                    (n.args, n.kwargs), lambda x: _concrete(x, values))
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    results = out.args[0]
    template = None
    if any(not isinstance(r, fx.Node) and r is not None for r in results):
        template = tuple(_FROM_GRAPH if isinstance(r, fx.Node) or r is None else r
                         for r in results)
        meta = dict(out.meta)
        kept = tuple(r for r in results if isinstance(r, fx.Node) or r is None)
        graph.erase_node(out)
        out = graph.output(kept)
        out.meta.update(meta)
        shift = sum(1 for r in results[:meta.get("kiln_internal_outputs_from", len(results))]
                    if not (isinstance(r, fx.Node) or r is None))
        if "kiln_internal_outputs_from" in meta:
            out.meta["kiln_internal_outputs_from"] = meta["kiln_internal_outputs_from"] - shift
    _recompute_meta(graph, values)
    graph.lint()
    # Python code only when something runs or reads it (the graph run op by op, a log):
    # the kernel compiler reads the graph, and keys its cache on ``kiln_code_key``
    new = _LazyGraphModule(gm, graph, class_name=type(gm).__name__)
    new.meta["kiln_code_key"] = (code_key or _code_key(gm), tuple(sorted(
        (str(s), int(v)) for s, v in values.items())), tuple(
        repr(a) for a in args if not isinstance(a, torch.Tensor)))
    # the kernel compiler lifts these into arguments however small (a batch of 3 and one
    # of 20 make one kernel text; ``kernels/codegen/size_args.lifting``)
    new.meta["kiln_symbol_values"] = sorted({int(v) for v in values.values()})
    # the kernel compiler divides by literals but these (``kernels/compile.SYMBOLIC_SIZES``)
    exprs = size_expressions(gm.graph) if expressions is None else expressions
    # (a literal divisor is sound whatever this holds: an expression it cannot evaluate
    # to an integer is left out)
    new.meta["kiln_symbolic_sizes"] = sorted({int(r) for r in (e.xreplace(values) for e in exprs)
                                              if r.is_Integer})
    return new, keep, template


def _recompute_meta(graph: fx.Graph, values) -> None:
    """Each node's ``meta["val"]`` on meta tensors of the concrete sizes: the layouts a
    concrete trace records (``fast_meta``'s device-aware ones first)."""
    for n in graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        old = n.meta.get("val")
        if n.op == "get_attr":
            if isinstance(old, torch.Tensor):
                n.meta["val"] = _concrete_tensor(old, values)
            continue
        if n.target is operator.getitem:
            src = n.args[0].meta.get("val")
            n.meta["val"] = src[n.args[1]] if isinstance(src, (tuple, list)) else old
            continue
        if not isinstance(n.target, torch._ops.OpOverload):
            continue
        a, kw = fx.node.map_arg((n.args, n.kwargs), lambda m: m.meta.get("val"))
        dev = n.meta.get("device")
        kw = dict(kw)
        if "device" in kw:
            kw["device"] = _META
        try:
            val = meta_result(n.target, a, kw, dev if dev is not None else torch.device("cpu"))
            if val is None:
                val = n.target(*a, **kw)
        except Exception:  # noqa: BLE001  (kept: the symbolic value, made concrete)
            val = _concrete_tensor(old, values) if isinstance(old, torch.Tensor) else old
        n.meta["val"] = val


def _concrete_tensor(t, values):
    return torch.empty_strided([_concrete(s, values) for s in t.shape],
                               [_concrete(s, values) for s in t.stride()],
                               dtype=t.dtype, device=_META)


def per_size(compiler):
    """``compiler`` (of concrete sizes) as a compiler of symbolic aten graphs."""
    return lambda gm, example_inputs: PerSizeGraph(gm, compiler)
