"""Store a pointwise value that several ops read, or compute it again in each reader?

Storing costs one write of the value and one read of it per reader, and a buffer.
Recomputing costs each reader a read of what the value is made from, and its ops again.
When the value is cheap and what it reads takes no more bytes per element than the value
itself (float32 made from one bfloat16 input always qualifies, as GELU's pieces do in an
autocast backward), recomputing reads no more than loading the stored value back, and
the store, its buffer and the kernel that would make it disappear.

``STORE_RULES`` is the decision: each rule says why a value is better stored; the first
that holds stores it, and a value none holds is recomputed. The readers counted are
the nodes that read the value, looking through views (a view of a lazy value is the
same lazy value re-indexed).

Recomputing is the same ops in the same dtypes: float32 results are the stored
version's bit for bit (C++ contracts no multiply-add; a GPU's compiler may fuse a
recomputed multiply with a reader's add). A float16/bfloat16 value is held unrounded
between ops, as in any fused chain (codegen rounds at stores): each reader sees what
the producing kernel itself saw, where a stored copy gave other kernels its rounding.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Callable

import torch

from ... import config
from ...debug.logs import log_for
from ...ops import is_library_call, is_view
from ...ops.catalogue import ops_named
from .. import ir
from .base import LOWERINGS, STORAGE_OPS

aten = torch.ops.aten
_log = log_for("passes")

#: a recomputed value has at most this many ops (counting the stored values it is
#: made from as loads)
RECOMPUTE_MAX_OPS = 24
#: and its ops times its readers stay within this: each reader repeats the work
RECOMPUTE_MAX_WORK = 64

#: views whose schema does not say so
_VIEWS = frozenset({aten._unsafe_view.default})
#: views that may store a lazy value to reshape it (``shapes._view``), unless only size-1
#: dims come or go; a split, or a merge whose reads stay affine (``reindex``), keeps it
#: lazy, but a reader that reshapes still counts as one that stores (the reshape's own
#: readers are not known here)
_RESHAPES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})
#: readers besides pointwise-tagged ops that read each element of what they read once
#: (a multi-pass one — softmax, layer norm, variance — reads it once per pass)
READS_ONCE = frozenset(ops_named(
    "sum.default", "sum.dim_IntList", "mean.default", "mean.dim", "amax.default",
    "amin.default", "prod.default", "prod.dim_int", "any.default", "any.dim", "any.dims",
    "all.default", "max.default", "min.default", "max.dim", "min.dim", "argmax.default",
    "argmin.default", "cat.default", "constant_pad_nd.default", "_to_copy.default",
    "clone.default"))
#: readers that read one element of the value per element of their result: when the
#: result is no larger than the value, no more reads than reading it once (a loss's
#: gather of each row's target, ``index.gather_lazy``)
READS_PER_RESULT = frozenset(ops_named("gather.default"))


def _is_view(node) -> bool:
    """A reader that only re-indexes (``as_strided`` may overlap elements: a reader)."""
    t = node.target
    return node.op == "call_function" and t not in STORAGE_OPS and (
        t in _VIEWS or t is operator.getitem
        or (isinstance(t, torch._ops.OpOverload) and is_view(t)))


def _reshapes(lo, node) -> bool:
    """A reshape beyond size-1 dims: its lowering stores a lazy value first."""
    if node.target not in _RESHAPES or not node.args:
        return False
    src, dst = lo.meta.get(node.args[0]), lo.meta.get(node)
    if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)):
        return True
    return [s for s in src.shape if s != 1] != [s for s in dst.shape if s != 1]


def _is_library(node) -> bool:
    """A reader that needs the value stored: a library call, a fallback, the output."""
    return node.op != "call_function" or node.target not in LOWERINGS \
        or is_library_call(node.target)


def _is_pointwise(node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.pointwise in t.tags


#: ops that read only their argument's shape and dtype (nll_loss's backward makes its
#: gradient with ``full_like`` of the log-softmax): not readers of its values
SHAPE_ONLY = frozenset({aten.full_like.default, aten.zeros_like.default,
                        aten.empty_like.default})


def readers(lo, node) -> list:
    """(reader, the views between) for every node reading ``node``'s value, through
    views; the graph's output and a reshape that stores the value count as readers."""
    out, todo = [], [(u, ()) for u in node.users]
    while todo:
        u, via = todo.pop()
        if u.target in SHAPE_ONLY:
            continue
        if _is_view(u) and not _reshapes(lo, u):
            todo += [(w, via + (u,)) for w in u.users]
        else:
            out.append((u, via))
    return out


def only_stored_readers(lo, node) -> bool:
    """Do only library calls (or the output) read ``node``'s value? It is stored for
    them anyway: a reshape then stores it at once, in the kernel that computes it."""
    found = readers(lo, node)
    return bool(found) and all(_is_library(r) for r, _ in found)


class Candidate:
    """What the rules look at: the value's expression at its own index, its readers."""

    def __init__(self, lo, node, lazy, probe: ir.Expr):
        self.lo, self.node, self.probe = lo, node, probe
        self.numel = max(ir.numel_of(lazy.sizes), 1)
        self.dtype = lazy.dtype
        self.itemsize = lazy.dtype.itemsize
        self.n_ops = ir.op_count(probe)
        self.readers = readers(lo, node)
        self.stores = [r for r, _ in self.readers if _is_library(r) or _reshapes(lo, r)]

    def bytes_read(self) -> float:
        """Bytes per element of the value that computing it reads: each buffer it
        loads once, a smaller (broadcast) one in proportion to its size."""
        total = 0.0
        for b in {x.buf for x in ir.walk(self.probe) if isinstance(x, ir.Load)}:
            buf = self.lo.by_name[b]
            total += buf.dtype.itemsize * min(1.0, buf.numel / self.numel)
        return total

    def reads_less(self, reader) -> bool:
        """Does ``reader`` read one element per element of a result no larger than the
        value?"""
        m = self.lo.meta.get(reader)
        return reader.target in READS_PER_RESULT and isinstance(m, torch.Tensor) \
            and m.numel() <= self.numel

    def broadcast(self) -> bool:
        """Does a pointwise reader, or a view on the way to one, cover more elements
        than the value has (each element computed again per copy)?"""
        def numel(n):
            m = self.lo.meta.get(n)
            return m.numel() if isinstance(m, torch.Tensor) else 0
        return any(numel(n) > self.numel for r, via in self.readers
                   for n in via + ((r,) if _is_pointwise(r) else ()))


@dataclass(frozen=True)
class Rule:
    """A reason to store: ``test(candidate)`` holds. Printed without its test, so that
    the table keys the graph cache by names, the same in every process."""
    name: str
    why: str
    test: Callable = field(repr=False, compare=False)


#: the first rule whose test holds stores the value
STORE_RULES = (
    Rule("off", "recomputing is switched off (KILN_RECOMPUTE_POINTWISE)",
         lambda c: not config.recompute_pointwise),
    Rule("indirect", "it reads through a gather: an index, then the data, per reader",
         lambda c: any(isinstance(x, ir.Load) and x.gather for x in ir.walk(c.probe))),
    Rule("ops", f"more than {RECOMPUTE_MAX_OPS} ops to repeat",
         lambda c: c.n_ops > RECOMPUTE_MAX_OPS),
    Rule("library", "a library call, a reshape or the output reads it: it is stored "
                    "for them anyway, and the other readers read that copy",
         lambda c: bool(c.stores)),
    Rule("repeats", "a reader reads an element more than once (a window, a product, a "
                    "pass per statistic): each read would compute it again",
         lambda c: any(not _is_pointwise(r) and r.target not in READS_ONCE
                       and r not in c.stores and not c.reads_less(r) for r, _ in c.readers)),
    Rule("broadcast", "a reader covers more elements than it has: each would be "
                      "computed again per copy", Candidate.broadcast),
    Rule("work", f"ops times readers over {RECOMPUTE_MAX_WORK}: each reader repeats them",
         lambda c: c.n_ops * len(c.readers) > RECOMPUTE_MAX_WORK),
    Rule("bytes", "it reads more bytes per element than it stores",
         lambda c: c.bytes_read() > c.itemsize),
)


def store_reason(lo, node, lazy, probe: ir.Expr) -> str | None:
    """Why the value of ``node`` (``lazy``, which several nodes read; ``probe``: its
    expression at its own index) should be stored; None: each reader recomputes it.
    Logged under ``KILN_LOGS=passes``."""
    c = Candidate(lo, node, lazy, probe)
    for rule in STORE_RULES:
        if rule.test(c):
            if _log.isEnabledFor(logging.INFO):
                _log.info("kernels: store %s [%s] (%s, %d ops, %d readers): %s", node.name,
                          rule.name, str(c.dtype).replace("torch.", ""), c.n_ops,
                          len(c.readers), rule.why)
            return rule.name
    if _log.isEnabledFor(logging.INFO):
        _log.info("kernels: recompute %s in each of its %d readers (%s, %d ops, "
                  "%.3g bytes read per %d stored)", node.name, len(c.readers),
                  str(c.dtype).replace("torch.", ""), c.n_ops, c.bytes_read(), c.itemsize)
    return None

