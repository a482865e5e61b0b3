"""Symbolic sizes in a trace: arguments made symbolic, size reads, and arithmetic.

A tensor argument with dynamic dims (``kiln/shapes/policy.py``) gets a fake whose
sizes are ``torch.SymInt``s over kiln's size symbols, so every op's meta kernel
computes symbolic result sizes and every question it asks becomes a guard
(``kiln/shapes/env.py``). Reading a symbolic size (``x.size(1)``, ``x.shape``,
``len(x)``, ``x.numel()``) makes a ``SymIntValue`` whose graph node reads it from the
tensor at run time; Python arithmetic on it adds ``operator`` nodes, so ``x.view(b,
s, h, d // h)`` computes its arguments from the inputs it runs on. Comparisons are
answered at trace time and guarded. Python int arguments that become symbolic are
graph inputs of their own.
"""
from __future__ import annotations

import operator

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.fake import FakeTensor
from kiln.capture.rule_tables import BUILTINS
from kiln.shapes.env import SpecializedMarkedDim

_META = torch.device("meta")


def is_sym(x) -> bool:
    return isinstance(x, (torch.SymInt, torch.SymFloat))


# --- inputs -------------------------------------------------------------------------
def dense_order(t: torch.Tensor):
    """The dims of ``t`` from outermost to innermost when it is dense and
    non-overlapping (contiguous up to a permutation: transposed, channels-last); None
    otherwise."""
    if t.storage_offset() != 0 or any(n == 0 for n in t.shape):
        return None
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -d))
    acc = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride(d) != acc:
            return None
        acc *= t.shape[d]
    return order


def layout_guards(source, real, order, dims):
    """(code, words) checking the strides a permuted dense input was traced with, each
    the product of the sizes inside it (``x.stride(0) == x.size(1)``)."""
    out, inner_run, inner_words = [], [], []
    for d in reversed(order):
        run = " * ".join(inner_run) or "1"
        words = " * ".join(inner_words) or "1"
        if real.shape[d] == 1:   # any stride is dense here: the one traced
            run = words = str(real.stride(d))
        out.append((f"{source.expr()}.stride({d}) == {run}",
                    f"{source.pretty()}.stride({d}) == {words}"))
        if d in dims:
            inner_run.append(f"{source.expr()}.size({d})")
            inner_words.append(f"{source.pretty()}.size({d})")
        elif real.shape[d] != 1:
            inner_run.append(str(real.shape[d]))
            inner_words.append(str(real.shape[d]))
    return out


def symbolic_fake(out, real: torch.Tensor, source, dims: dict):
    """A fake of ``real`` whose ``dims`` ({dim: (min, max, marked)}) are symbols, laid
    out as ``real`` (dense up to a permutation); None where kiln keeps the tensor static
    (not dense, or a non-leaf that requires grad, whose autograd standing the fake
    would have to rebuild)."""
    order = dense_order(real)
    if order is None or (real.requires_grad and not real.is_leaf) or real.dim() == 0:
        return None
    env = out.shapes
    sizes = []
    for d, n in enumerate(real.shape):
        if d in dims:
            lo, hi, marked = dims[d]
            if (lo is not None and n < lo) or (hi is not None and n > hi):
                raise SpecializedMarkedDim(
                    f"{source.pretty()}.size({d}) is {n}, outside the range it was marked "
                    f"dynamic with (kiln.mark_dynamic min={lo}, max={hi})")
            lo = lo if lo is not None else (2 if n >= 2 else 0)
            sizes.append(env.new_symbol(f"{source.expr()}.size({d})", f"{source.pretty()}.size({d})",
                                        n, lo=lo, hi=hi, marked=marked))
        else:
            sizes.append(n)
    strides, acc = [None] * len(sizes), 1
    for d in reversed(order):
        strides[d] = acc if real.shape[d] != 1 else real.stride(d)
        acc = acc * sizes[d]
    elem = torch.empty_strided(sizes, tuple(strides), dtype=real.dtype, device=_META)
    fake = FakeTensor(elem, real.device)
    if real.requires_grad:
        fake.requires_grad_(True)
    return fake


@V.rule
def int_input(out, value: int, source) -> V.SymIntValue:
    """A Python int argument traced symbolic: a graph input of its own."""
    sym = out.shapes.new_symbol(source.expr(), source.pretty(), value, lo=None, is_int=True)
    out.guards.add(f"type({source.expr()}) is int", f"type({source.pretty()}) is int",
                   f"type({source.expr()})")
    node = out.graph.placeholder(out._fresh(source.pretty()))
    node.meta["example_value"] = sym
    out.inputs.append((source, node, value))
    return V.SymIntValue(node, sym, source)


# --- reading sizes ----------------------------------------------------------------
def _node(out, target, args, kind="call_function"):
    n = out.graph.create_node(kind, target, args, {})
    fr = out.active_frame
    if fr is not None and fr.inst is not None:
        n.meta["kiln_user_line"] = (fr.code.co_filename, fr.inst.line, fr.code.co_name)
    return n


def number(out, value, make_node):
    """``value`` as a Value: a SymIntValue (its node made by ``make_node``) if symbolic."""
    if is_sym(value):
        n = make_node()
        n.meta["example_value"] = value
        return V.SymIntValue(n, value)
    return V.ConstantValue(value)


def size(out, tv, dim: int):
    f = tv.fake
    return number(out, f.shape[dim], lambda: _node(out, "size", (tv.node, dim), "call_method"))


@V.kind
class SizeValue(V.TupleValue):
    """``x.shape`` with symbolic items: a ``torch.Size`` to ``type()`` and
    ``isinstance``; its methods (``numel()``) and rebuilding it after the graph use the
    traced sizes, fixed by guards."""

    def python_type(self):
        return torch.Size

    def const(self):
        return torch.Size([i.const() for i in self.items])

    def getattr(self, tx, name):
        if name == "numel":
            return V.MethodValue(V.BuiltinValue(torch.Size.numel), self)
        return V.ConstantValue(self.const()).getattr(tx, name)


def _size_numel(tx, size):
    """``x.shape.numel()``: the product of the sizes, symbolic."""
    if not isinstance(size, SizeValue):
        return V.ConstantValue(size.const().numel())
    acc = V.ConstantValue(1)
    for item in size.items:
        acc = sym_binary(tx, operator.mul, acc, item)
    return acc


BUILTINS[torch.Size.numel] = _size_numel


def shape(out, tv):
    f = tv.fake
    if not any(is_sym(s) for s in f.shape):
        return V.ConstantValue(torch.Size(f.shape))
    return SizeValue([size(out, tv, d) for d in range(f.dim())])


@V.rule
def symbolic_meta(tx, tv, name, args, kwargs):
    """``x.shape``, ``x.size()``, ``x.size(d)``, ``x.stride(d)``, ``x.numel()``,
    ``len(x)`` of a tensor with symbolic sizes; None for anything else."""
    f = tv.fake
    if not (any(is_sym(s) for s in f.shape) or any(is_sym(s) for s in f.stride())):
        return None
    out = tx.output
    consts = [a.const() for a in args]
    kw = {k: v.const() for k, v in kwargs.items()}
    if name == "shape" or (name == "size" and not consts and not kw):
        return shape(out, tv)
    if name == "size":
        d = consts[0] if consts else kw["dim"]
        return size(out, tv, d % max(f.dim(), 1) if f.dim() else d)
    if name in ("__len__",):
        return size(out, tv, 0)
    if name in ("numel", "nelement"):
        return number(out, f.numel(), lambda: _node(out, "numel", (tv.node,), "call_method"))
    if name == "stride":
        if consts or kw:
            d = consts[0] if consts else kw["dim"]
            return number(out, f.stride(d), lambda: _node(out, "stride", (tv.node, d), "call_method"))
        return V.TupleValue([number(out, st, lambda d=d: _node(out, "stride", (tv.node, d), "call_method"))
                             for d, st in enumerate(f.stride())])
    return None


@V.rule
def concrete(value):
    """A metadata answer with no symbolic rule, as plain ints (each fixed by a guard):
    SymInts never reach the user's code."""
    if is_sym(value):
        return int(value) if isinstance(value, torch.SymInt) else float(value)
    if isinstance(value, (tuple, list)):
        return type(value)(concrete(v) for v in value) if type(value) in (tuple, list) \
            else type(value)([concrete(v) for v in value])
    return value


# --- arithmetic ----------------------------------------------------------------------
_ARITH = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
          operator.truediv, operator.pow, operator.neg, operator.iadd, operator.isub,
          operator.imul, operator.ifloordiv, operator.imod, operator.itruediv}
_PLAIN = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
          operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
          operator.itruediv: operator.truediv}


def _operand(v):
    if isinstance(v, V.SymIntValue):
        return v.fake, v.node
    if isinstance(v, V.ConstantValue) and type(v.value) in (int, float, bool):
        return v.value, v.value
    return None


@V.rule
def sym_binary(tx, fn, a, b):
    """``a fn b`` where one side is symbolic: a graph node and a symbolic result; None
    if kiln has no rule (the caller decides)."""
    fn = _PLAIN.get(fn, fn)
    if fn not in _ARITH:
        return None
    pa, pb = _operand(a), _operand(b)
    if pa is None or pb is None:
        return None
    try:
        value = fn(pa[0], pb[0])
    except Exception as e:  # noqa: BLE001  (ZeroDivisionError…: the user's own)
        raise UserException(V.ExceptionValue.of_real(e))
    return number(tx.output, value, lambda: _node(tx.output, fn, (pa[1], pb[1])))


@V.rule
def sym_compare(tx, fn, a, b):
    """A comparison involving a symbolic size: answered now, the answer guarded."""
    pa, pb = _operand(a), _operand(b)
    if pa is None or pb is None:
        return None
    return V.ConstantValue(bool(fn(pa[0], pb[0])))


@V.rule
def sym_unary(tx, fn, v):
    if fn is operator.neg:
        return number(tx.output, -v.fake, lambda: _node(tx.output, operator.neg, (v.node,)))
    if fn is operator.pos:
        return v
    if fn is operator.not_:
        return V.ConstantValue(not bool(v.fake != 0))
    return None


@V.rule
def specialize(v):
    """A SymIntValue fixed to its traced value (a guard keeps it); anything else as it is."""
    if isinstance(v, V.SymIntValue):
        return V.ConstantValue(v.const())
    return v
