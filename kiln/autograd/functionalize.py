"""Functionalization rules of the tracer: how an in-place op becomes functional.

The tracer (``trace._TraceMode``) gives every meta tensor a storage and the chain of
view ops that derives it from the storage's *base*. Here, a mutation is recorded as its
out-of-place twin (``ops.functional_variant``), and the new value is scattered back into
the base through the inverse of each view op in the chain (``SCATTER``), or, where a
view op has no inverse, through ``as_strided_scatter`` of the base at the view's
geometry. Ops that change a tensor's geometry in place (``t_``, ``squeeze_``…) extend
its chain instead; on a graph input they are replayed on the real tensor afterwards
(``meta_mutations``).

What functionalization cannot reproduce exactly raises ``AotUnsupported`` (the runtime
then runs that graph eagerly): writes to tensors whose elements overlap in memory,
writes that partially overlap an argument, ops that replace a storage (``resize_``,
``set_``), ``out=`` forms that would resize or cast their output, and storage addressing
(``as_strided``) of a base whose layout a write could not keep.
"""
from __future__ import annotations

import dataclasses

import torch

from kiln.autograd import ops as opinfo
from kiln.debug.breaks import split_id

aten = torch.ops.aten
_META = torch.device("meta")


class AotUnsupported(RuntimeError):
    """The graph does something the ahead-of-time tracer cannot express:
    ``AotUnsupported("K0101", "why")``, the first argument the reason's ID in
    kiln/debug/breaks.py (``break_id``)."""

    def __init__(self, *args):
        self.break_id, (msg,) = split_id(args)
        super().__init__(msg)


def _replay(chain, t):
    """Apply a view chain to a tensor (meta under the mode, or real at runtime)."""
    for op, rest, kwargs, index in chain:
        t = op(t, *rest, **kwargs)
        if index is not None:
            t = t[index]
    return t


def replay_in_modes(chain, modes, t):
    """``_replay`` with each step made in the grad mode eager made it in (``modes``: a
    mode per step, None for the current one): a view made with grad off is one eager
    refuses to write in place with grad on, and a view of it inherits that."""
    now = torch.is_grad_enabled()
    if all(m is None or m == now for m in modes):
        return _replay(chain, t)
    modes = tuple(modes) + (None,) * (len(chain) - len(modes))
    for step, mode in zip(chain, modes):
        with torch.set_grad_enabled(now if mode is None else mode):
            t = _replay((step,), t)
    return t


# --- scattering a written view back into its base: one rule per view op ----------
# rule(base, new, rest, kwargs, index) -> base's new value, or None (no inverse here)

def _scatter_view(base, new, rest, kw, index):
    return aten.view.default(new, list(base.shape))


def _scatter_slice(base, new, rest, kw, index):
    return aten.slice_scatter.default(base, new, *rest, **kw)


def _scatter_select(base, new, rest, kw, index):
    return aten.select_scatter.default(base, new, *rest, **kw)


def _scatter_diagonal(base, new, rest, kw, index):
    return aten.diagonal_scatter.default(base, new, *rest, **kw)


def _scatter_permute(base, new, rest, kw, index):
    dims = [d % base.dim() for d in rest[0]]
    inverse = [dims.index(i) for i in range(len(dims))]
    return aten.permute.default(new, inverse)


def _scatter_transpose(base, new, rest, kw, index):
    return aten.transpose.int(new, *rest)


def _scatter_alias(base, new, rest, kw, index):
    return new


def _scatter_expand(base, new, rest, kw, index):
    """An expand that repeats no element (only size-1 dims added in front)."""
    if new.numel() != base.numel():
        return None
    return aten.view.default(new, list(base.shape))


def _dim_arg(rest, kw, pos):
    d = rest[pos] if len(rest) > pos else kw.get("dim", 0)
    return d


def _scatter_split_piece(base, new, dim, start):
    return aten.slice_scatter.default(base, new, dim, start, start + new.shape[dim])


def _scatter_split(base, new, rest, kw, index):
    dim = _dim_arg(rest, kw, 1) % base.dim()
    return _scatter_split_piece(base, new, dim, index * rest[0])


def _scatter_split_with_sizes(base, new, rest, kw, index):
    dim = _dim_arg(rest, kw, 1) % base.dim()
    return _scatter_split_piece(base, new, dim, sum(rest[0][:index]))


def _scatter_unbind(base, new, rest, kw, index):
    return aten.select_scatter.default(base, new, _dim_arg(rest, kw, 0), index)


_OP_RULES = [
    (("view.default", "_unsafe_view.default", "squeeze.dims", "squeeze.dim",
      "squeeze.default", "unsqueeze.default", "reshape.default"), _scatter_view),
    (("slice.Tensor",), _scatter_slice),
    (("select.int",), _scatter_select),
    (("diagonal.default",), _scatter_diagonal),
    (("permute.default",), _scatter_permute),
    (("transpose.int",), _scatter_transpose),
    (("alias.default", "detach.default"), _scatter_alias),
    (("expand.default",), _scatter_expand),
    (("split.Tensor", "unsafe_split.Tensor"), _scatter_split),
    (("split_with_sizes.default", "unsafe_split_with_sizes.default"),
     _scatter_split_with_sizes),
    (("unbind.int",), _scatter_unbind),
]

#: view op -> the rule that scatters a new value of the view into the view's source
SCATTER = {op: rule for names, rule in _OP_RULES for op in opinfo._ops(*names)}

#: Ops that address a storage rather than a tensor: their views are scattered through
#: the base of the storage (``as_strided_scatter``), never step by step.
STORAGE_VIEWS = frozenset(opinfo._ops("as_strided.default"))

#: In-place ops that give a tensor another storage or another number of elements.
_STORAGE_MUTATIONS = frozenset(opinfo._ops(
    "resize_.default", "resize_as_.default", "set_.source_Tensor", "set_.source_Storage",
    "set_.source_Storage_storage_offset", "set_.source_Tensor_storage_offset",
    "set_.default", "_resize_output_.default", "resize_as_sparse_.default"))


# --- geometry ---------------------------------------------------------------------

def dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (strides a permutation of contiguous ones): a copy
    laid out with ``t``'s strides fills its storage exactly."""
    expect = 1
    for st, n in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if st != expect:
            return False
        expect *= n
    return True


def _overlaps_itself(t: torch.Tensor) -> bool:
    """Some elements of ``t`` may share a memory location (expanded, unfolded): unless
    each stride, smallest first, steps past everything the smaller ones span."""
    if t.numel() <= 1:
        return False
    span = 0
    for st, n in sorted((abs(st), n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if st <= span:
            return True
        span += (n - 1) * st
    return False


def _broadcasts_to(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return torch.broadcast_shapes(a.shape, b.shape) == b.shape
    except RuntimeError:
        return False


def _extent(t: torch.Tensor):
    lo = t.storage_offset()
    return lo, lo + 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))


def _partially_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two views of one storage whose elements may meet without being the same."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if (a.shape, a.stride(), a.storage_offset()) == (b.shape, b.stride(),
                                                     b.storage_offset()):
        return False
    (alo, ahi), (blo, bhi) = _extent(a), _extent(b)
    return max(alo, blo) < min(ahi, bhi)


# --- the rules the trace mode applies -------------------------------------------

class Functionalize:
    """Mutation handling of ``trace._TraceMode`` (which provides ``infos``, the
    ``_Info`` record, ``register`` and ``value``, and is the dispatch mode itself)."""

    def _mutate(self, func, args, kwargs):
        if func in _STORAGE_MUTATIONS:
            raise AotUnsupported("K0101", f"{func} gives a tensor another storage or size")
        functional = opinfo.functional_variant(func)
        if functional is None:
            raise AotUnsupported("K0102", f"no out-of-place twin for mutating op {func}")
        if opinfo.is_view(functional):
            return self._mutate_geometry(func, functional, args, kwargs)
        schema = func._schema
        args = list(args)
        for a in schema.arguments[len(args):]:     # spell out defaults for the twin
            if a.kwarg_only or a.name in kwargs:
                break
            if not a.has_default_value():
                break
            args.append(a.default_value)
        written = []
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
                if a.kwarg_only or i >= len(args):
                    kwargs = {k: x for k, x in kwargs.items() if k != a.name}
                if v is not None:
                    written.append(v)
        targets = [t for w in written for t in (w if isinstance(w, (list, tuple)) else [w])]
        self._check_writes(func, targets, (args, kwargs))
        with self:
            outs = functional(*args, **kwargs)
        outs_t = outs if isinstance(outs, tuple) else (outs,)
        returns = schema.returns
        aliased = [r for r in returns if r.alias_info is not None and r.alias_info.is_write]
        if len(aliased) == len(returns):
            new_values = list(outs_t)[: len(written)]
            result_vals = written
        else:
            n = len(returns) - len(aliased)
            new_values = list(outs_t)[n:]
            result_vals = list(outs_t)[:n]
        exact = opinfo.is_out_variant(func)
        for target, new in zip(written, new_values):
            if isinstance(target, (list, tuple)):
                for t, v in zip(target, new):
                    self._write(t, v, exact)
            else:
                self._write(target, new, exact)
        if len(returns) == 1:
            return result_vals[0]
        if not returns:
            return None
        return tuple(result_vals)

    def _mutate_geometry(self, func, view_op, args, kwargs):
        """``t_``, ``squeeze_``, ``as_strided_``…: ``t`` becomes a view of what it was
        (its chain grows, no value changes); the meta tensor takes the new geometry, so
        that autograd and later ops see it as eager's tensor."""
        t = args[0]
        if t.requires_grad and not torch.is_grad_enabled() and \
                self.input_of.get(id(t)) is not None:
            # autograd does not see it: on a leaf (traced as a non-leaf stand-in) the
            # gradient takes the new shape, on a non-leaf eager's backward then fails
            raise AotUnsupported("K0103", f"{func} with grad off on an input that requires grad")
        with self:
            view = view_op(*args, **kwargs)
        # the recorded values keep their geometry: a stand-in takes t's place in every
        # node that recorded t (the op that made it, and after a write to t also the
        # node of its new value: neither need be an input of the other)
        old = self.infos[id(t)]
        standin = t.as_strided(t.size(), t.stride(), t.storage_offset())
        self.keep.append(standin)
        self.infos[id(standin)] = dataclasses.replace(old)
        for n in old.node.graph.nodes:
            val = n.meta.get("val")
            if val is t:
                n.meta["val"] = standin
            elif isinstance(val, tuple) and any(v is t for v in val):
                n.meta["val"] = tuple(standin if v is t else v for v in val)
        if old.storage.base is t:
            old.storage.base = standin
        _change_geometry(func, t, args, kwargs)      # below autograd: geometry only
        v = self.infos[id(view)]
        self.infos[id(t)] = info = dataclasses.replace(v)
        if info.modes:
            # eager keeps t's autograd standing through the change, whatever the grad
            # mode (a differentiable view stays one, its grad_fn remade): the step is
            # replayed in the mode of the step before it, or the caller's
            info.modes = info.modes[:-1] + (info.modes[-2] if len(info.modes) > 1 else None,)
        i = self.input_of.get(id(t))
        if i is not None:
            self.meta_mutations.append((i, func, tuple(args[1:]), dict(kwargs),
                                        self.grad_set))
            # inputs that are views of the same tensor at run time share its version
            # counter: eager's op bumps theirs too
            partners = self.version_partners.get(i)
            if partners:
                torch.autograd.graph.increment_version(partners)
        return t

    def _check_writes(self, func, targets, read):
        """Refuse writes that functionalization would not reproduce exactly: eager
        raises for most of them, or gives a result that depends on element order."""
        reads = [a for a in torch.utils._pytree.tree_flatten(read)[0]
                 if isinstance(a, torch.Tensor) and id(a) in self.infos]
        for t in targets:
            st = self.infos[id(t)].storage
            if _overlaps_itself(t) or _overlaps_itself(st.base):
                raise AotUnsupported("K0104", f"{func} writes a tensor whose elements share memory")
            for a in reads:
                if self.infos[id(a)].storage is st and _partially_overlap(t, a):
                    raise AotUnsupported("K0104", f"{func} writes a tensor that partially overlaps "
                                         "one of its arguments")

    def _write(self, t, new, exact=False):
        """``t`` now holds ``new``: scatter it into the base and bump the version.
        ``exact``: an ``out=`` argument, which eager resizes or casts by rules of its own
        where ``new`` does not fit it as it is."""
        info = self.infos[id(t)]
        st = info.storage
        if new.dtype != t.dtype and (exact or not torch.can_cast(new.dtype, t.dtype)):
            raise AotUnsupported("K0105", f"a {new.dtype} result written into a {t.dtype} tensor")
        if tuple(new.shape) != tuple(t.shape) and (exact or not _broadcasts_to(new, t)):
            raise AotUnsupported("K0105", f"a result of shape {tuple(new.shape)} written into a "
                                 f"tensor of shape {tuple(t.shape)}")
        with self:
            if new.dtype != t.dtype:
                new = aten._to_copy.default(new, dtype=t.dtype)
            if tuple(new.shape) != tuple(t.shape):
                new = aten.expand.default(new, list(t.shape))
            written = new
            new = self._scatter(info, t, new)
            new = self._restride(new, st)
        st.version += 1
        base_info = self.infos[id(st.base)]
        base_info.node, base_info.version = self.infos[id(new)].node, st.version
        info.node, info.version = self.infos[id(written)].node, st.version

    def _scatter(self, info, t, new):
        """The base's new value once its view ``t`` holds ``new`` (under the mode)."""
        st = info.storage
        chain = info.chain
        if not chain:
            return new
        value = new
        rules = [None if op in STORAGE_VIEWS else SCATTER.get(op) for op, *_ in chain]
        if all(rules):
            vals = [st.base]
            for step in chain[:-1]:
                vals.append(_replay((step,), vals[-1]))
            for rule, (op, rest, kw, index), base in zip(reversed(rules), reversed(chain),
                                                         reversed(vals)):
                new = rule(base, new, rest, kw, index)
                if new is None:
                    break
            else:
                return new
        return self._scatter_at_geometry(st, t, value)

    def _scatter_at_geometry(self, st, t, new):
        """Scatter through the storage: ``t``'s elements of the base, addressed by
        ``t``'s geometry, which is the base's only while the base is laid out as eager's
        tensor and fills its storage."""
        base = st.base
        if not st.layout_exact or not dense(base) or base.numel() == 0:
            raise AotUnsupported("K0106", "writing through a view that has no inverse into a base "
                                 "that does not fill its storage")
        self.storage_addressed(st)
        return aten.as_strided_scatter.default(base, new, list(t.shape), list(t.stride()),
                                               t.storage_offset() - base.storage_offset())

    def storage_addressed(self, st):
        """``st``'s base is addressed by storage offsets, which the trace assumes are
        the real input's own: an input must start its storage (checked per call)."""
        if st.input_index is not None:
            self.storage_inputs.add(st.input_index)

    def _restride(self, new, st):
        """The base's new value keeps the base's strides, so that views re-derived from
        it (as_strided in particular) address the same elements. A base that does not
        fill its storage cannot: storage addressing of it is then refused."""
        base = st.base
        if new.stride() == base.stride() or base.numel() <= 1:
            return new
        if not dense(base):
            st.layout_exact = False
            return new
        if base.is_contiguous():
            return aten.clone.default(new, memory_format=torch.contiguous_format)
        empty = aten.empty_strided.default(base.size(), base.stride(), dtype=base.dtype,
                                           device=_META)
        return aten.as_strided_scatter.default(empty, new, base.size(), base.stride(), 0)


def _change_geometry(func, t, args, kwargs):
    """``func`` (an in-place view op) on the meta tensor ``t``. With symbolic sizes
    PyTorch's C++ ``squeeze_`` crashes the process, so the ops kiln computes itself there
    (``shapes.fake_ops.META``: the out-of-place view's geometry set by ``as_strided_``)
    run as kiln's; where ``t`` requires grad that would record an ``as_strided`` for
    autograd, not the op's own backward, so the graph runs eagerly instead."""
    from kiln.shapes.fake_ops import META, is_symbolic
    own = META.get(func) if is_symbolic(t) else None
    if own is None:
        func(*args, **kwargs)
        return
    if t.requires_grad:
        raise AotUnsupported("K0115", f"{func} on a tensor of symbolic sizes that requires grad")
    own(*args, **kwargs)
