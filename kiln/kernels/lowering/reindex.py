"""A reshape that merges dims keeps a lazy value lazy when its reads allow it.

A lazy value is a function from an affine index to an expression. Reshaped from
``[B, S, V]`` to ``[B*S, V]``, it is asked for element ``(m, v)``, which is its own
``(m // S, m % S, v)``: not affine. Yet what a lazy value reads usually is: a
contiguous read ``buf[i0*S*V + i1*V + v]`` is ``buf[m*V + v]``. So the value is built
once at placeholder variables (the *probe*), and when every affine index in it (loads,
``Index`` values, masks, gather terms) uses the dims of each merged run as the digits of
one number — the coefficient of a dim is that of the run's last dim times the sizes
after it — every read is re-indexed by putting the merged index in place of those
digits. The reshaped value is then computed where it is read (an LM head's fp32 cast
of its bf16 logits, flattened for the loss, goes into the loss's reductions) instead of
stored first. Anything else — a transposed read, a broadcast along an inner merged dim,
an ``arange`` along it — keeps the store (``shapes._view``): its index would need a
division.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import ir
from ..ir import Affine, Index, Load, Op
from ..ops import op
from .base import Lazy, View

#: names of the placeholder variables the probe is built at (never a loop variable's)
_PLACEHOLDER = "_p"


def concrete(sizes) -> list | None:
    """The sizes as ints; None when one is symbolic (its index map is not known here)."""
    try:
        return [int(s) for s in sizes]
    except TypeError:
        return None


def reshape_runs(in_sizes, out_sizes):
    """The runs of a reshape: ``[(input dims, output dims)]``, each a stretch of dims
    on both sides with the same product, size-1 dims left out (their index is 0). None
    when a size is 0 or the element counts differ."""
    ins, outs = concrete(in_sizes), concrete(out_sizes)
    if ins is None or outs is None or 0 in ins or 0 in outs \
            or ir.numel_of(ins) != ir.numel_of(outs):
        return None
    a = [k for k, s in enumerate(ins) if s != 1]
    b = [k for k, s in enumerate(outs) if s != 1]
    runs, i, j = [], 0, 0
    while i < len(a):
        gi, gj = [a[i]], [b[j]]
        pa, pb = ins[a[i]], outs[b[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                gi.append(a[i])
                pa *= ins[a[i]]
                i += 1
            else:
                gj.append(b[j])
                pb *= outs[b[j]]
                j += 1
        runs.append((tuple(gi), tuple(gj)))
    return runs


def _place_values(dims, sizes) -> list:
    """What one step of each dim of a run is worth in the run's number (row-major)."""
    out, acc = [], 1
    for k in reversed(dims):
        out.append(acc)
        acc *= int(sizes[k])
    return out[::-1]


class _Reshape:
    """The substitution of one reshape: placeholders of the input dims → the output
    index, run by run."""

    def __init__(self, in_sizes, out_sizes, runs):
        self.runs = [(gi, gj, _place_values(gi, in_sizes), _place_values(gj, out_sizes))
                     for gi, gj in runs]

    def merges(self, a: Affine) -> bool:
        """Are the run's dims the digits of one number in ``a``?"""
        for gi, _, places, _ in self.runs:
            last = a.coef(f"{_PLACEHOLDER}{gi[-1]}")
            if any(a.coef(f"{_PLACEHOLDER}{k}") != last * p for k, p in zip(gi, places)):
                return False
        return True

    def apply(self, a: Affine, idx: list) -> Affine:
        out = Affine(tuple((v, c) for v, c in a.terms if not v.startswith(_PLACEHOLDER)),
                     a.const)
        for gi, gj, _, out_places in self.runs:
            last = a.coef(f"{_PLACEHOLDER}{gi[-1]}")
            if last:
                for j, p in zip(gj, out_places):
                    out = out + idx[j] * (last * p)
        return out


def _probe(x: Lazy) -> ir.Expr:
    """``x`` at placeholder variables (size-1 dims at 0); None when it holds an
    expression kind this module does not know."""
    e = x.load([Affine.c(0) if int(s) == 1 else Affine.var(f"{_PLACEHOLDER}{k}")
                for k, s in enumerate(x.sizes)])
    if not all(isinstance(y, (Load, Index, Op, ir.Const)) for y in ir.walk(e)):
        return None
    return e


@dataclass
class Reshaped(Lazy):
    """A lazy value reshaped by substitution. Where it must be stored after all, it is
    stored in its shape before the reshape and viewed (``GraphLowering.realize``):
    its kernel then runs the loop nest of its neighbours, which the scheduler fuses."""
    source: Lazy | None = None

    def view_of(self, v: View) -> View:
        """The stored source ``v`` seen in this value's shape."""
        base = torch.empty_strided(v.sizes, v.strides, dtype=v.dtype, device="meta")
        return View(v.buf, self.sizes, tuple(base.view(self.sizes).stride()), v.offset,
                    v.dtype)


def reshape_lazy(x: Lazy, out_sizes) -> Lazy | None:
    """``x`` reshaped to ``out_sizes`` as a lazy value re-indexed by substitution, or
    None when some read's index would need a division (the caller stores ``x``)."""
    runs = reshape_runs(x.sizes, out_sizes)
    probe = _probe(x) if runs is not None else None
    if probe is None:
        return None
    sub = _Reshape(x.sizes, out_sizes, runs)
    if not all(sub.merges(e.index) for e in ir.walk(probe) if isinstance(e, (Load, Index))):
        return None
    return Reshaped(tuple(int(s) for s in out_sizes), x.dtype,
                    lambda idx: ir.map_affines(probe, lambda a: sub.apply(a, list(idx))), source=x)


def gather_lazy(x: Lazy, d: int, within_mask):
    """``x`` read along dim ``d`` at a computed position (``gather``), without storing
    it: ``read(idx, e)`` is ``x`` at ``idx`` with ``idx[d]`` replaced by the integer
    expression ``e``; every load whose index moves with dim ``d`` takes ``e`` as a
    gather term, masked by ``within_mask(e)``. None when ``x`` uses its index along
    ``d`` as a value (``Index``: an ``arange``, a ``cat``'s bounds) — the caller stores
    ``x`` and gathers from the buffer."""
    probe = _probe(x)
    pd = f"{_PLACEHOLDER}{d}"
    if probe is None or any(isinstance(e, Index) and e.index.coef(pd)
                            for e in ir.walk(probe)):
        return None

    def read(idx, e):
        mask_e = within_mask(e)

        def fn(a):
            out = Affine(tuple((v, c) for v, c in a.terms if not v.startswith(_PLACEHOLDER)),
                         a.const)
            for k, i in enumerate(idx):
                c = a.coef(f"{_PLACEHOLDER}{k}")
                if c and k != d:
                    out = out + i * c
            return out

        def on_load(x, mask, gather):
            c = x.index.coef(pd)
            if not c:
                return Load(x.buf, fn(x.index), x.dtype, mask, gather)
            mask = mask_e if mask is None else op("and", mask, mask_e)
            return Load(x.buf, fn(x.index), x.dtype, mask, gather + ((e, c),))
        return ir.map_affines(probe, fn, on_load)
    return read
