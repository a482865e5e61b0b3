"""What every lowering shares: the boxes (``View``, ``Lazy``), the table
(``LOWERINGS``, ``register``), ``Unsupported``, and the helpers op families build on
(``pointwise``, ``reduce``, ``squeeze``, masks, layouts, a box's expression at an index).

The engine and every op family import this module; no family imports another's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...debug.breaks import split_id
from .. import ir
from ..ir import Affine, Load, linear_index, loop_vars
from ..ops import cast, const, op
from ..reductions import KINDS


aten = torch.ops.aten


class Unsupported(Exception):
    """Raised by a lowering that cannot handle these arguments: the node falls back
    (runs as the aten op). ``Unsupported("K0205", "why")``: the first argument is the
    reason's ID in kiln/debug/breaks.py (``break_id``)."""

    def __init__(self, *args):
        self.break_id, (msg,) = split_id(args)
        super().__init__(msg)
        self.reason = msg


def returns_a_view(op) -> bool:
    """Whether an aten op's result may share memory with an argument (``Tensor(a)`` in
    its schema: as_strided, alias, unfold, ...)."""
    schema = getattr(op, "_schema", None)
    return schema is not None and any(r.alias_info is not None and not r.alias_info.is_write
                                      for r in schema.returns)


#: storage, not only on its values: they get it in eager's exact layout.
STORAGE_OPS = {aten.as_strided.default, aten.as_strided_scatter.default}


# --- boxes --------------------------------------------------------------------------
@dataclass
class View:
    buf: str
    sizes: tuple
    strides: tuple
    offset: int
    dtype: torch.dtype

    def load(self, idx: list) -> ir.Expr:
        return Load(self.buf, linear_index(idx, self.strides) + self.offset, self.dtype)


@dataclass
class Lazy:
    sizes: tuple
    dtype: torch.dtype
    fn: Callable
    #: strides to store it with when realized (None: contiguous); pointwise results
    #: follow a channels-last operand so that convolution chains stay channels-last
    layout: tuple | None = None

    def load(self, idx: list) -> ir.Expr:
        """``fn(idx)``, made once per index: expressions are immutable and ``fn`` a pure
        function of the index, so every reader of one index (the engine's inlining
        probe, ``realize``, each consumer) gets the same expression object — built once,
        its hash and op count cached once — instead of a fresh copy of the whole lazy
        chain behind it (quadratic in a chain's length)."""
        try:
            key = tuple(idx)
            memo = self.__dict__.get("_memo")
            if memo is None:
                memo = self.__dict__["_memo"] = {}
            e = memo.get(key)
        except TypeError:              # an index that does not hash: built every time
            return self.fn(idx)
        if e is None:
            e = memo[key] = self.fn(list(idx))
        return e


Box = (View, Lazy)


def is_box(x) -> bool:
    return isinstance(x, Box)


def add_mask(e: ir.Expr, mask: ir.Expr, keep=frozenset()) -> ir.Expr:
    """The same expression with every load guarded by ``mask`` (for cat and pad), but
    for the loads in ``keep`` (known to be in bounds wherever ``e`` is evaluated)."""
    memo = {}

    def go(x):
        if x in memo:
            return memo[x]
        if x in keep:
            r = x
        elif isinstance(x, Load):
            m = mask if x.mask is None else op("and", x.mask, mask)
            r = Load(x.buf, x.index, x.dtype, m, x.gather)
        elif isinstance(x, ir.Op):
            r = ir.Op(x.name, tuple(go(a) for a in x.args), x.dtype)
        else:
            r = x
        memo[x] = r
        return r
    return go(e)


# --- the lowering table ---------------------------------------------------------------
LOWERINGS: dict = {}


def register(*targets):
    def deco(fn):
        for t in targets:
            LOWERINGS[t] = fn
        return fn
    return deco


#: ops whose list results stay lazy element by element: each element's ``getitem``
#: decides, as a single op's result would, whether it is stored (``GraphLowering``)
LAZY_LISTS: set = set()


def register_list(*targets):
    """``register`` for an op returning a list of independent values (``_foreach_*``)."""
    LAZY_LISTS.update(targets)
    return register(*targets)


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: its strides are a permutation of contiguous ones."""
    if t.numel() == 0:
        return False
    dims = sorted([(st, s) for s, st in zip(t.shape, t.stride()) if s != 1])
    expect = 1
    for st, s in dims:
        if st != expect:
            return False
        expect *= s
    return True


# --- generic helpers -------------------------------------------------------------------
def as_expr(x, idx, out_sizes, dtype):
    """Load a broadcast operand (box or python scalar) at the output index, cast to dtype."""
    if is_box(x):
        nd = len(x.sizes)
        off = len(out_sizes) - nd
        sub = [Affine.c(0) if int(x.sizes[i]) == 1 else idx[off + i] for i in range(nd)]
        e = x.load(sub)
    else:
        if isinstance(x, torch.Tensor):
            raise Unsupported("K0205", "tensor constant")
        return const(x, dtype)
    return cast(e, dtype) if dtype is not None else e


def _meta_of(x):
    if is_box(x):
        return torch.empty(x.sizes, dtype=x.dtype, device="meta")
    return x


def promote(a, b) -> torch.dtype:
    """The dtype two operands are compared in (torch's type promotion, scalars included)."""
    return torch.result_type(_meta_of(a), _meta_of(b))


def pointwise(lo, node, inputs, fn, compute_dtype=None) -> Lazy:
    """A lazy pointwise value over the broadcast of ``inputs``; ``fn(*exprs)`` builds the
    scalar expression from the operands cast to ``compute_dtype`` (default: output dtype)."""
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    cdt = compute_dtype or dtype

    def body(idx):
        e = fn(*[as_expr(x, idx, sizes, cdt) for x in inputs])
        return cast(e, dtype)
    return Lazy(sizes, dtype, body, layout_hint(inputs, sizes))


def channels_last_strides(sizes) -> tuple:
    n, c, h, w = (int(s) for s in sizes)
    return (h * w * c, 1, w * c, c)


def is_dense_channels_last(sizes, strides) -> bool:
    """Does ATen see this 4-d layout as channels-last contiguous (dims of size 1 have any
    stride)? A contiguous 1x1 or depthwise convolution weight is too."""
    want = channels_last_strides(sizes)
    return all(int(s) == 1 or int(a) == int(b) for s, a, b in zip(sizes, strides, want))


def is_channels_last(sizes, strides) -> bool:
    """A dense 4-d layout with channels innermost (and not also contiguous)."""
    if len(sizes) != 4 or int(sizes[1]) == 1:
        return False
    return is_dense_channels_last(sizes, strides) and \
        tuple(strides) != ir.contiguous_strides(sizes)


def layout_hint(inputs, sizes):
    """Channels-last strides for a result over ``sizes`` when an operand of the same
    sizes is channels-last (stored or itself hinted), else None."""
    if len(sizes) != 4:
        return None
    for x in inputs:
        if not is_box(x) or tuple(x.sizes) != tuple(sizes):
            continue
        if isinstance(x, View) and is_channels_last(x.sizes, x.strides):
            return channels_last_strides(sizes)
        if isinstance(x, Lazy) and x.layout is not None:
            return x.layout
    return None


def window_layout(x, sizes):
    """Channels-last strides for a window op's result over ``sizes`` (a pool: the same
    batch and channels, other spatial sizes) when its input ``x`` is channels-last,
    else None. Stored in its index order instead, the result would be written across
    channels while its input is read along them: a strided read per tap (resnet18's
    stem pool at batch 64 took 780 us, 417 us stored channels-last), and the next convolution would
    need the input made channels-last again."""
    if len(sizes) != 4 or not is_box(x) or len(x.sizes) != 4 or \
            tuple(x.sizes[:2]) != tuple(sizes[:2]):
        return None
    if (isinstance(x, View) and is_channels_last(x.sizes, x.strides)) or \
            (isinstance(x, Lazy) and x.layout is not None
             and is_channels_last(x.sizes, x.layout)):
        return channels_last_strides(sizes)
    return None


def affine_view(box, sizes, remap) -> object:
    """A view given by an affine map from the new index to the old one."""
    sizes = tuple(int(s) for s in sizes)
    if isinstance(box, Lazy):
        return Lazy(sizes, box.dtype, lambda idx: box.load(remap(list(idx))))
    probe = [Affine.var(f"y{j}") for j in range(len(sizes))]
    lin = linear_index(remap(probe), box.strides) + box.offset
    strides = tuple(lin.coef(f"y{j}") for j in range(len(sizes)))
    return View(box.buf, sizes, strides, lin.const, box.dtype)


def norm_dim(d, n):
    return d + n if d < 0 else d


# --- pointwise lowerings -----------------------------------------------------------------


def squeeze(lo, node, x, dims=None):
    n = len(x.sizes)
    if dims is None:
        dims = list(range(n))
    elif isinstance(dims, int):
        dims = [dims]
    dims = {norm_dim(d, n) for d in dims if n and x.sizes[norm_dim(d, n)] == 1}
    keep = [i for i in range(n) if i not in dims]

    def remap(idx):
        out, j = [], 0
        for i in range(n):
            if i in dims:
                out.append(Affine.c(0))
            else:
                out.append(idx[j])
                j += 1
        return out
    return affine_view(x, [x.sizes[i] for i in keep], remap)


def reduce(lo, node, x, dims, keepdim, red_type, dtype, pre=None) -> View:
    """Store a reduction of ``x`` over ``dims``; kept dims come first in the loop nest."""
    n = len(x.sizes)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    dims = sorted({norm_dim(d, max(n, 1)) for d in dims}) if n else []
    kept = [i for i in range(n) if i not in dims]
    ksizes = tuple(x.sizes[i] for i in kept)
    rsizes = tuple(x.sizes[i] for i in dims)
    if any(s == 0 for s in rsizes) and not KINDS[red_type].has_identity_for_empty:
        raise Unsupported("K0206", "empty max/min reduction")
    vars_ = loop_vars(ksizes + rsizes)
    idx = [None] * n
    for j, i in enumerate(kept):
        idx[i] = vars_[j]
    for j, i in enumerate(dims):
        idx[i] = vars_[len(kept) + j]
    e = x.load(idx)
    if pre is not None:
        e = pre(e)
    if not KINDS[red_type].is_arg:
        e = cast(e, dtype)
    b = lo.add(ir.Reduction(lo.new_name(), ksizes, ir.contiguous_strides(ksizes), dtype,
                            red_sizes=rsizes, red_type=red_type, body=e, origin=node.name))
    v = View(b.name, ksizes, b.strides, 0, dtype)
    if keepdim:
        full = [1 if i in dims else x.sizes[i] for i in range(n)]
        v = affine_view(v, full, lambda ix: [ix[i] for i in kept])
    return v
