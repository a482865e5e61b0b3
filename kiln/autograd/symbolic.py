"""Ahead-of-time autograd once for a stream of sizes.

A captured graph whose placeholders carry symbolic sizes (``meta["kiln_sym"]``,
capture's ``ShapeEnv``) is traced by ``trace_joint`` on meta tensors with those
SymInt sizes, so the joint, forward, backward and inference aten graphs compute their
sizes from their inputs (``sym_nodes``) and serve every size the capture's guards
admit. The trace runs in a fork of capture's ``ShapeEnv``: a question it asks that
the capture's guards and ranges do not already answer (a new guard, a narrowed range,
a specialised size) would make the graph valid for fewer sizes than the guards let
in, so that graph is not used; neither is one the symbolic trace cannot express
(``SymbolicUnsupported``). Then every call goes through ``PerSizeCompiled`` (one
concrete trace per size signature), logged under "fallbacks".
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from kiln.autograd.sym_nodes import SymbolicUnsupported
from kiln.debug.logs import log_for
from kiln.shapes.env import ShapeEnv, canonical
from kiln.shapes.implied import implied
from kiln.shapes.node import KilnSymNode

_log = log_for("fallbacks")


def capture_env(gm) -> ShapeEnv | None:
    """The ``ShapeEnv`` of the symbolic sizes ``gm``'s placeholders carry, if any."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        sym = n.meta.get("kiln_sym")
        for s in (sym if isinstance(sym, tuple) else (sym,)):
            if isinstance(s, torch.SymInt) and isinstance(s.node, KilnSymNode):
                return s.node.env
    return None


def fork(env: ShapeEnv) -> ShapeEnv:
    """A copy of ``env`` whose answers do not reach the capture's guards."""
    return ShapeEnv(symbols={s: dataclasses.replace(i) for s, i in env.symbols.items()},
                    guards=list(env.guards), replacements=dict(env.replacements),
                    defining=set(env.defining), where=None)


@dataclasses.dataclass
class Snapshot:
    n_guards: int
    known: frozenset
    ranges: dict
    replacements: dict


def snapshot(env: ShapeEnv) -> Snapshot:
    return Snapshot(len(env.guards), frozenset(_key(env, g) for g, _ in env.guards),
                    {s: (i.lo, i.hi) for s, i in env.symbols.items()},
                    dict(env.replacements))


def _key(env, g):
    try:
        return canonical(env.simplify(g))
    except Exception:  # noqa: BLE001  (sympy declines some forms: compared as they are)
        return g


def new_assumptions(env: ShapeEnv, before: Snapshot) -> list[str]:
    """What the trace assumed since ``before`` that the capture did not."""
    out = [f"{i.pretty} range now [{i.lo}, {i.hi}]" for s, i in env.symbols.items()
           if (i.lo, i.hi) != before.ranges.get(s)]
    out += [f"{s} = {e}" for s, e in env.replacements.items()
            if before.replacements.get(s) != e]
    known = [k for k in before.known if isinstance(k, sympy.Basic)]
    seen = set(before.known)
    for g, _ in env.guards[before.n_guards:]:
        k = _key(env, g)
        if k in seen:
            continue
        seen.add(k)
        if k is not sympy.true and not implied(k, env, known):
            out.append(str(g))
    return out


def _dense_strides(shape, real: torch.Tensor):
    """Symbolic strides for a dense (up to a permutation) input of symbolic ``shape``,
    whose real strides they reproduce for the traced sizes; None where it is not."""
    order = sorted(range(real.dim()), key=lambda d: (real.stride(d), -d))
    strides = [None] * real.dim()
    acc = 1
    for d in order:
        if real.shape[d] != 1 and real.stride(d) != _hint(acc):
            return None
        strides[d] = acc if real.shape[d] != 1 else real.stride(d)
        acc = acc * shape[d]
    return strides


def _hint(x) -> int:
    return x.node.hint if isinstance(x, torch.SymInt) else int(x)


def _rebased(x, env: ShapeEnv):
    """``x`` (a capture SymInt or an int) as a SymInt of ``env`` (an int when fixed)."""
    if not isinstance(x, torch.SymInt):
        return x
    e = env.simplify(x.node.expr)
    if e.is_Integer:
        return int(e)
    return torch.SymInt(KilnSymNode(e, x.node.hint, int, env))


def symbolic_examples(gm, example_inputs):
    """(meta examples with symbolic sizes, their ``ShapeEnv``) for ``gm``, or None
    when its placeholders carry no symbolic size (or the examples do not match them)."""
    env0 = capture_env(gm)
    if env0 is None:
        return None
    env = fork(env0)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(example_inputs):
        return None
    out = []
    for ph, a in zip(phs, example_inputs):
        sym = ph.meta.get("kiln_sym")
        if isinstance(a, torch.Tensor):
            if not isinstance(sym, tuple) or len(sym) != a.dim():
                out.append(torch.empty_strided(a.size(), a.stride(), dtype=a.dtype,
                                               device="meta"))
                continue
            shape = [_rebased(s, env) for s in sym]
            if [_hint(s) for s in shape] != list(a.shape):
                return None
            strides = _dense_strides(shape, a)
            if strides is None:
                return None
            out.append(torch.empty_strided(shape, strides, dtype=a.dtype, device="meta"))
        elif isinstance(sym, torch.SymInt) and isinstance(a, int) and not isinstance(a, bool):
            s = _rebased(sym, env)
            if _hint(s) != a:
                return None
            out.append(s)
        else:
            out.append(a)
    return out, env


class DynamicAot:
    """The symbolic ``AotFunction`` of a graph, or, once a symbolic trace of one of its
    paths fails (``SymbolicUnsupported``), ``PerSizeCompiled`` for every call."""

    def __init__(self, gm, example_inputs, make_symbolic, compile_concrete):
        from kiln.backends_dynamic import PerSizeCompiled, without_symbols

        self._per_size_factory = lambda: PerSizeCompiled(
            lambda g, ins: compile_concrete(without_symbols(g), ins), gm,
            lambda backend, g, ins: backend(g, ins))
        self.per_size = None
        self.gm = gm
        try:
            self.symbolic = make_symbolic()
        except SymbolicUnsupported as e:
            self._give_up(e)
            self.per_size._for(list(example_inputs), first=True)

    def _give_up(self, e) -> None:
        _log.info("kiln: autograd traces this graph per size: %s", e)
        self.symbolic = None
        self.per_size = self._per_size_factory()

    def _parts(self) -> list:
        if self.per_size is None:
            return [self.symbolic]
        return [fn for fn, _ in self.per_size.compiled.values()]

    @property
    def eager_reasons(self) -> list:
        """Why calls ran eagerly (``AotFunction.eager_reasons``), each reason once."""
        out = []
        for f in self._parts():
            out += [r for r in getattr(f, "eager_reasons", ()) if r not in out]
        return out

    @property
    def eager_calls(self) -> int:
        return sum(getattr(f, "eager_calls", 0) for f in self._parts())

    def __call__(self, *args):
        if self.per_size is None:
            try:
                return self.symbolic(*args)
            except SymbolicUnsupported as e:    # raised by a trace, before anything ran
                self._give_up(e)
        return self.per_size(*args)


def traced_symbolically(trace, env: ShapeEnv):
    """``trace()`` (a ``trace_joint`` on symbolic examples), refused with
    ``SymbolicUnsupported`` where it fails or assumes what the capture did not."""
    from kiln.debug.timing import timed

    before = snapshot(env)
    try:
        with timed("aot_trace"):
            tr = trace()
    except SymbolicUnsupported:
        raise
    except Exception as e:  # noqa: BLE001  (the per-size trace decides, eager fallback included)
        raise SymbolicUnsupported(f"the symbolic trace failed: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}") from e
    new = new_assumptions(env, before)
    if new:
        raise SymbolicUnsupported("the autograd trace assumed what the capture's guards do "
                                  "not: " + "; ".join(new[:4]))
    return tr


def symbolic_entry(entry):
    """``AotFunction._entry`` for symbolic examples: a path that fails to partition or
    compile symbolically is refused (``SymbolicUnsupported``) too."""
    def wrapped(args):
        try:
            return entry(args)
        except SymbolicUnsupported:
            raise
        except Exception as e:  # noqa: BLE001  (the per-size path decides)
            raise SymbolicUnsupported(f"{type(e).__name__}: {e}") from e
    return wrapped


def refuse_aliased(args, key):
    """Inputs sharing storage with a mutated input: their geometry is concrete, so
    such calls are traced per size."""
    raise SymbolicUnsupported("inputs share storage with an input the graph mutates")


def aot_compile_dynamic(gm, example_inputs, specialize=False, **kwargs):
    """``aot_compile(gm, example_inputs, **kwargs)``, traced once for every size when
    ``gm``'s placeholders carry symbolic sizes (``DynamicAot``); ``specialize``: the
    compilers take concrete sizes (each graph compiled per size after the one trace)."""
    from kiln.autograd.runtime import aot_compile

    if capture_env(gm) is None:
        return aot_compile(gm, example_inputs, **kwargs)
    from kiln.backends_dynamic import without_symbols

    def make_symbolic():
        sym = symbolic_examples(gm, example_inputs)
        if sym is None:
            raise SymbolicUnsupported("an input is not dense, or its sizes are not the "
                                      "placeholder's")
        return aot_compile(gm, example_inputs, symbolic=sym, specialize=specialize, **kwargs)
    return DynamicAot(gm, example_inputs, make_symbolic,
                      lambda g, ins: aot_compile(without_symbols(g), ins, **kwargs))


def concrete_steps(tr, args):
    """``tr`` with the symbolic sizes of its output view chains and geometry changes
    (replayed on the real tensors) made the values they have for ``args``, solved from
    the inputs' sizes (``specialize.solve``)."""
    from torch.utils._pytree import tree_map

    from kiln.autograd.specialize import _equations, solve

    phs = [n for n in tr.graph.nodes if n.op == "placeholder"][:tr.num_inputs]
    wanted = set()

    def symbols(v):
        if isinstance(v, torch.SymInt):
            wanted.update(v.node.expr.free_symbols)
        return v
    steps = (tr.output_specs, tr.meta_mutations)
    tree_map(symbols, steps)
    values = solve(_equations(phs, args), wanted)
    if values is None:
        raise RuntimeError("kiln: the inputs' sizes do not give an output view's sizes")

    def concrete(v):
        if isinstance(v, torch.SymInt):
            return int(v.node.expr.xreplace(values))
        return v
    specs, meta_mutations = tree_map(concrete, steps)
    return dataclasses.replace(tr, output_specs=specs, meta_mutations=meta_mutations,
                               symbolic_steps=False)
