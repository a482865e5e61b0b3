"""The loop-level IR: affine indices, scalar expressions, and buffers that compute them.

One aten graph becomes a list of *buffers*, each either

* ``Pointwise``  — ``out[x0..xn] = expr(x0..xn)`` over the buffer's sizes,
* ``Reduction``  — ``out[x0..xk] = reduce_{xk+1..} expr(x0..)`` (kept dims first, then
  reduced dims; keepdim is a view on top),
* ``Extern``     — a library call (mm, convolution, any aten op we do not lower), or
* ``Input``      — a graph input.

Every index is *affine* in the loop variables (views become strides, never div/mod),
which keeps codegen simple and lets the C++ compiler vectorise. Conditional reads (cat,
pad) carry a ``mask`` on the ``Load`` so that Triton can mask them and C++ can guard
them. ``format_program`` prints the IR; ``verify`` checks it (run by every test).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .reductions import KINDS


# --- affine index expressions -----------------------------------------------------
@dataclass(frozen=True)
class Affine:
    """``const + sum(coef * var)``; vars are loop-variable names like ``x0``."""
    terms: tuple = ()          # ((var, coef), ...) sorted by var, no zero coefs
    const: int = 0

    @staticmethod
    def var(name: str) -> "Affine":
        return Affine(((name, 1),), 0)

    @staticmethod
    def c(v: int) -> "Affine":
        return Affine((), int(v))

    def __add__(self, other) -> "Affine":
        if isinstance(other, int):
            return Affine(self.terms, self.const + other)
        d = dict(self.terms)
        for v, k in other.terms:
            d[v] = d.get(v, 0) + k
        return Affine(tuple(sorted((v, k) for v, k in d.items() if k != 0)),
                      self.const + other.const)

    def __mul__(self, k: int) -> "Affine":
        k = int(k)
        if k == 0:
            return Affine()
        return Affine(tuple((v, c * k) for v, c in self.terms), self.const * k)

    def vars(self) -> set:
        return {v for v, _ in self.terms}

    def coef(self, var: str) -> int:
        return dict(self.terms).get(var, 0)

    def __str__(self) -> str:
        parts = [(v if k == 1 else f"{k}*{v}") for v, k in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def linear_index(idx: list, strides) -> Affine:
    """``sum(idx[d] * strides[d])``, summed in one pass (an ``Affine`` made per term
    was the lowering's busiest function: every load of every size variant)."""
    coefs, const = {}, 0
    for i, s in zip(idx, strides):
        s = int(s)
        if s == 0:
            continue
        const += i.const * s
        for v, k in i.terms:
            coefs[v] = coefs.get(v, 0) + k * s
    return Affine(tuple(sorted((v, k) for v, k in coefs.items() if k != 0)), const)


def numel_of(sizes) -> int:
    """Elements of a tensor of these sizes."""
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def span(sizes, strides) -> int:
    """Elements a strided view reaches, first to last (0 when it is empty)."""
    if any(int(s) == 0 for s in sizes):
        return 0
    return 1 + sum((int(s) - 1) * int(st) for s, st in zip(sizes, strides))


def contiguous_strides(sizes) -> tuple:
    strides, acc = [], 1
    for s in reversed(list(sizes)):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def loop_vars(sizes, start: int = 0) -> list:
    """Index variables for a loop nest; size-1 dims get the constant 0 (simpler indices)."""
    return [Affine.c(0) if int(s) == 1 else Affine.var(f"x{start + i}")
            for i, s in enumerate(sizes)]


# --- scalar expressions -------------------------------------------------------------
_FIELD_NAMES: dict = {}


def _field_names(cls) -> tuple:
    """``dataclasses.fields(cls)``'s names, looked up once per class (hashing and
    comparing expressions asks for them on every node)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


class Expr:
    """A scalar expression. Expressions are immutable and shared: a pooling window's
    running max is reused by every later tap, so an expression is a DAG whose tree form
    is exponential in its depth. Hashes are therefore cached per node (a generated
    dataclass hash would walk the whole tree every time)."""
    dtype: torch.dtype

    def children(self) -> tuple:
        return ()

    def __hash__(self):
        try:
            return self._h
        except AttributeError:
            h = hash((type(self).__name__,)
                     + tuple(getattr(self, f) for f in _field_names(type(self))))
            object.__setattr__(self, "_h", h)
            return h

    def __eq__(self, other):
        if self is other:
            return True
        if type(self) is not type(other) or hash(self) != hash(other):
            return False
        return all(getattr(self, f) == getattr(other, f) for f in _field_names(type(self)))

    def __getstate__(self):
        # string hashes differ between processes: never pickle the cached one (nor the
        # cached reads, ``loaded_buffers``)
        return {k: v for k, v in self.__dict__.items() if k not in _CACHED}


@dataclass(frozen=True)
class Load(Expr):
    __hash__ = Expr.__hash__
    __eq__ = Expr.__eq__
    buf: str
    index: Affine
    dtype: torch.dtype
    mask: Any = None          # an Expr of dtype bool, or None: read only where it holds
    #: indirect terms ((integer Expr, stride), ...) added to ``index``: a gather
    #: (embedding, index, gather) reads ``buf[index + sum(value * stride)]``
    gather: tuple = ()

    def children(self):
        own = (self.mask,) if self.mask is not None else ()
        return own + tuple(e for e, _ in self.gather)


@dataclass(frozen=True)
class Const(Expr):
    """A constant. Equal constants are equal in every bit: -0.0 is not 0.0 (Python's
    ``-0.0 == 0.0`` would let a shared expression print one for the other), and NaN is
    NaN."""
    value: Any
    dtype: torch.dtype

    def _key(self):
        v = self.value
        return (repr(v) if isinstance(v, float) else v, type(v).__name__, self.dtype)

    def __hash__(self):
        try:
            return self._h
        except AttributeError:
            h = hash(("Const",) + self._key())
            object.__setattr__(self, "_h", h)
            return h

    def __eq__(self, other):
        return self is other or (type(other) is Const and self._key() == other._key())


@dataclass(frozen=True)
class Index(Expr):
    """The integer value of an affine index (arange, argmax positions, cat bounds)."""
    __hash__ = Expr.__hash__
    __eq__ = Expr.__eq__
    index: Affine
    dtype: torch.dtype = torch.int64


@dataclass(frozen=True)
class Op(Expr):
    __hash__ = Expr.__hash__
    __eq__ = Expr.__eq__
    name: str
    args: tuple
    dtype: torch.dtype

    def children(self):
        return self.args


def walk(e: Expr):
    """Every sub-expression, each once, children before parents."""
    seen, order = set(), []

    def go(x):
        n = len(seen)
        seen.add(x)                   # one hash where ``in`` then ``add`` made two
        if len(seen) == n:
            return
        for c in x.children():
            go(c)
        order.append(x)
    go(e)
    return order


def map_affines(e: Expr, fn, on_load=None) -> Expr:
    """``e`` with every affine index ``a`` replaced by ``fn(a)`` and every load
    rebuilt by ``on_load(load, rebuilt mask, rebuilt gather terms)`` when given (shared
    parts stay shared)."""
    memo: dict = {}

    def go(x):
        r = memo.get(id(x))
        if r is not None:
            return r
        if isinstance(x, Load):
            mask = None if x.mask is None else go(x.mask)
            gather = tuple((go(v), st) for v, st in x.gather)
            r = on_load(x, mask, gather) if on_load is not None else \
                Load(x.buf, fn(x.index), x.dtype, mask, gather)
        elif isinstance(x, Index):
            r = Index(fn(x.index), x.dtype)
        elif isinstance(x, Op):
            r = Op(x.name, tuple(go(c) for c in x.args), x.dtype)
        else:
            r = x
        memo[id(x)] = r
        return r
    return go(e)


def format_expr(e: Expr) -> str:
    """``e`` as text; sub-expressions used more than once are named once
    (``let %0 = ...; in ...``), so a shared DAG prints in linear size."""
    uses: dict = {}
    for x in walk(e):
        for c in x.children():
            uses[c] = uses.get(c, 0) + 1
    names: dict = {}
    lets: list = []

    def text(x):
        if x in names:
            return names[x]
        if isinstance(x, Load):
            m = f" if {text(x.mask)}" if x.mask is not None else ""
            g = "".join(f" + {text(v)}*{st}" for v, st in x.gather)
            r = f"{x.buf}[{x.index}{g}{m}]"
        elif isinstance(x, Const):
            r = repr(x.value)
        elif isinstance(x, Index):
            r = f"index({x.index})"
        else:
            r = f"{x.name}({', '.join(text(a) for a in x.args)})"
        if isinstance(x, Op) and uses.get(x, 0) > 1:
            names[x] = f"%{len(lets)}"
            lets.append(f"{names[x]} = {r}")
            return names[x]
        return r
    body = text(e)
    return body if not lets else f"let {'; '.join(lets)}; in {body}"


def op_count(e: Expr, limit: int | None = None) -> int:
    """The distinct operations in ``e``; with ``limit``, counting stops at ``limit + 1``
    (all a threshold needs to know, without walking the rest of a large DAG). Cached on
    ``e`` (expressions are immutable): the exact count, or the least limit it was seen
    to pass."""
    d = e.__dict__
    exact = d.get("_ops")
    if exact is not None:
        return exact if limit is None or exact <= limit else limit + 1
    over = d.get("_ops_over")
    if over is not None and limit is not None and limit <= over:
        return limit + 1
    seen, todo, n = set(), [e], 0
    while todo:
        x = todo.pop()
        k = len(seen)
        seen.add(x)                   # one hash where ``in`` then ``add`` made two
        if len(seen) == k:
            continue
        if isinstance(x, Op):
            n += 1
            if limit is not None and n > limit:
                object.__setattr__(e, "_ops_over", limit if over is None else max(over, limit))
                return n
        todo.extend(x.children())
    object.__setattr__(e, "_ops", n)
    return n


def ops_exceed(e: Expr, limit: int) -> tuple:
    """(more than ``limit`` operations in ``e``, any at all): the two questions the
    lowering asks of every lazy value's expression (inline it or store it), answered
    from a bound cached bottom-up where it settles them — an expression extends the one
    before it by an operation or two, and walking each one whole made the lowering
    quadratic in a fused chain's length. ``op_count`` where the bound does not."""
    b = _op_bound(e)
    if b <= limit:
        return False, b > 0
    n = op_count(e, limit)
    return n > limit, n > 0


def _op_bound(e: Expr) -> int:
    """The operations of ``e`` counted with repetition (as a tree): 0 exactly when it
    has none, and never fewer than ``op_count``. Cached on each sub-expression, made
    children first for those not cached yet."""
    try:
        return e._opb
    except AttributeError:
        pass
    stack = [(e, False)]
    while stack:
        x, ready = stack.pop()
        if "_opb" in x.__dict__:
            continue
        kids = x.children()
        if ready:
            object.__setattr__(x, "_opb", (1 if isinstance(x, Op) else 0)
                               + sum(c._opb for c in kids))
        else:
            stack.append((x, True))
            stack.extend((c, False) for c in kids if "_opb" not in c.__dict__)
    return e._opb


#: what an expression caches on itself (never pickled)
_CACHED = ("_h", "_reads", "_ops", "_ops_over", "_opb")


def loaded_buffers(e: Expr) -> frozenset:
    """The names of the buffers ``e`` loads from. Cached on ``e`` (expressions are
    immutable): the scheduler and the code generators ask each kernel body many times."""
    r = e.__dict__.get("_reads")
    if r is None:
        r = frozenset(x.buf for x in walk(e) if isinstance(x, Load))
        object.__setattr__(e, "_reads", r)
    return r


# --- buffers --------------------------------------------------------------------------
@dataclass
class Buffer:
    name: str
    sizes: tuple
    strides: tuple
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return numel_of(self.sizes)

    def reads(self) -> set:
        return set()

    def store_index(self, idx: list) -> Affine:
        return linear_index(idx, self.strides)


@dataclass
class Input(Buffer):
    position: int = 0


@dataclass
class Pointwise(Buffer):
    body: Expr = None          # over x0..x{ndim-1}
    origin: str = ""           # the fx node(s) it came from, for comments

    def reads(self):
        return set(loaded_buffers(self.body))


REDUCTIONS = tuple(KINDS)           # the kinds of reductions.py's table


@dataclass
class Reduction(Buffer):
    red_sizes: tuple = ()
    red_type: str = "sum"
    body: Expr = None          # over x0..x{k-1} (kept) and x{k}..x{k+m-1} (reduced)
    origin: str = ""

    def reads(self):
        return set(loaded_buffers(self.body))


@dataclass
class Scatter(Buffer):
    """A write by computed positions (``index_put``): the buffer is first ``init`` (over
    x0..x{n-1}, its own index); then, for every index x0..x{m-1} of ``iter_sizes``, in
    order, ``value`` is stored at ``dest`` — or added there when ``accumulate``, so
    repeated positions sum as eager's serial loop sums them. ``dest`` is a ``Load`` of
    this buffer used as the address: its affine part and gather terms (the index
    tensors' values) give the position, its mask skips positions out of range."""
    init: Expr = None
    iter_sizes: tuple = ()
    dest: Load = None
    value: Expr = None
    accumulate: bool = False
    #: dims of ``iter_sizes`` whose index is one output coordinate (no two of their
    #: values write the same element): the C++ loop runs them in parallel, outermost,
    #: and each element still receives its writes in index order
    parallel_dims: tuple = ()
    origin: str = ""

    def exprs(self):
        """The expressions this buffer evaluates (its own address aside)."""
        out = [self.init, self.value]
        out += [v for v, _ in self.dest.gather]
        if self.dest.mask is not None:
            out.append(self.dest.mask)
        return out

    def reads(self):
        return {b for e in self.exprs() for b in loaded_buffers(e)}


SCANS = ("sum",)


@dataclass
class Scan(Buffer):
    """Inclusive prefix sums along ``dim`` (``cumsum``): element j of that dim is the
    sum of ``body`` (over x0..x{n-1}, this buffer's own index) at positions 0..j, the
    other dims fixed — accumulated in ``acc_dtype`` and rounded at each position, as
    eager's CPU kernel does (float32 sums in double; Triton sums in the compute dtype,
    as eager's CUDA kernel does)."""
    dim: int = 0
    scan_type: str = "sum"
    acc_dtype: torch.dtype = None
    body: Expr = None
    origin: str = ""

    def reads(self):
        return set(loaded_buffers(self.body))


@dataclass
class Extern(Buffer):
    """A library call: ``op(*args, **kwargs)`` where tensor arguments are ``ExternArg``."""
    op: Any = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    outputs: list = field(default_factory=list)   # names of MultiOutput buffers, if a tuple
    origin: str = ""

    def reads(self):
        out = set()

        def visit(a):
            if isinstance(a, ExternArg):
                out.add(a.buf)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
        visit(self.args)
        visit(tuple(self.kwargs.values()))
        return out


@dataclass
class MultiOutput(Buffer):
    """Element ``path`` of an extern's tuple result."""
    source: str = ""
    path: tuple = ()

    def reads(self):
        return {self.source}


@dataclass(frozen=True)
class ExternArg:
    """A tensor argument of an extern: a strided view of a buffer."""
    buf: str
    sizes: tuple
    strides: tuple
    offset: int


# --- printing and verification ------------------------------------------------------
def format_buffer(b: Buffer) -> str:
    head = f"{b.name}: {str(b.dtype).replace('torch.', '')}{list(b.sizes)} strides={list(b.strides)}"
    if isinstance(b, Input):
        return f"{head} = input {b.position}"
    if isinstance(b, Pointwise):
        return f"{head} = pointwise {format_expr(b.body)}    # {b.origin}"
    if isinstance(b, Reduction):
        return (f"{head} = {b.red_type} over {list(b.red_sizes)} of "
                f"{format_expr(b.body)}    # {b.origin}")
    if isinstance(b, Scatter):
        terms = " + ".join(f"{format_expr(v)}*{st}" for v, st in b.dest.gather)
        return (f"{head} = {format_expr(b.init)}, then over {list(b.iter_sizes)} "
                f"{'add' if b.accumulate else 'store'} {format_expr(b.value)} at "
                f"[{b.dest.index} + {terms}]    # {b.origin}")
    if isinstance(b, Scan):
        return (f"{head} = {b.scan_type} scan along dim {b.dim} of "
                f"{format_expr(b.body)}    # {b.origin}")
    if isinstance(b, Extern):
        return f"{head} = extern {b.op}    # {b.origin}"
    if isinstance(b, MultiOutput):
        return f"{head} = {b.source}{list(b.path)}"
    return head


def format_program(buffers: list) -> str:
    return "\n".join(format_buffer(b) for b in buffers)


class IRError(Exception):
    pass


def verify(buffers: list) -> None:
    """Definition before use, index variables in range, dtypes consistent."""
    defined: dict[str, Buffer] = {}
    for b in buffers:
        if b.name in defined:
            raise IRError(f"{b.name} defined twice")
        if len(b.sizes) != len(b.strides):
            raise IRError(f"{b.name}: sizes and strides differ in rank")
        for r in b.reads():
            if r not in defined:
                raise IRError(f"{b.name} reads {r} before it is defined")
        if isinstance(b, Scan) and (b.scan_type not in SCANS or b.body.dtype != b.dtype
                                    or not 0 <= b.dim < len(b.sizes)):
            raise IRError(f"{b.name}: scan type, dim or body dtype inconsistent")
        if isinstance(b, Scatter):
            if b.dest.buf != b.name or b.init.dtype != b.dtype or b.value.dtype != b.dtype:
                raise IRError(f"{b.name}: scatter address or dtypes inconsistent")
        if isinstance(b, (Pointwise, Reduction)):
            nvars = len(b.sizes) + (len(b.red_sizes) if isinstance(b, Reduction) else 0)
            allowed = {f"x{i}" for i in range(nvars)}
            for e in walk(b.body):
                idx = e.index if isinstance(e, (Load, Index)) else None
                if idx is not None and not idx.vars() <= allowed:
                    raise IRError(f"{b.name}: index {idx} uses unknown variables")
                if isinstance(e, Load):
                    src = defined[e.buf]
                    if e.dtype != src.dtype:
                        raise IRError(f"{b.name}: load of {e.buf} as {e.dtype}, stored {src.dtype}")
                    if e.mask is not None and e.mask.dtype != torch.bool:
                        raise IRError(f"{b.name}: mask of non-bool dtype")
            if isinstance(b, Reduction):
                if b.red_type not in REDUCTIONS:
                    raise IRError(f"{b.name}: unknown reduction {b.red_type}")
            elif b.body.dtype != b.dtype:
                raise IRError(f"{b.name}: body dtype {b.body.dtype} != buffer dtype {b.dtype}")
        defined[b.name] = b
