"""NumPy functions and ndarray methods, attributes and indexing, as torch ops.

One rule per NumPy callable (``FUNCTIONS``, built on first use: NumPy is imported
only by programs that use it); ndarray methods map to the same rules with the array
first (``METHODS``). Result dtypes are NumPy's own: a rule asks NumPy for the dtype
its function returns on a one-element sample of the operands' dtypes and ranks
(``sample_dtype``), then computes in that dtype. Anything without a rule, or with
arguments a rule does not model, is Unsupported (a graph break that runs NumPy).
"""
from __future__ import annotations

import functools
import operator

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.numpy_ufuncs import apply_ufunc, cast, is_ufunc, write_into
from kiln.capture.numpy_values import NdarrayValue, np_module, numpy_dtype, torch_dtype

_MAX_CONSTANT_ELEMENTS = 1 << 14  # larger constant arrays are not spelled into a graph


def k(v):
    """The constant behind a rule argument (a Value, or a Python default)."""
    if isinstance(v, V.Value):
        if isinstance(v, NdarrayValue):
            raise Unsupported("an ndarray where NumPy takes a constant")
        return v.const()
    return v


def _v(a):
    return a if isinstance(a, V.Value) else V.ConstantValue(a)


def op(tx, fn, *args, **kwargs):
    return tx.output.op("call_function", fn, [_v(a) for a in args],
                        {n: a if isinstance(a, V.Value) else V.ConstantValue(a) for n, a in kwargs.items()})


def method(tx, name, t, *args, **kwargs):
    return tx.output.op("call_method", name, [t] + [a if isinstance(a, V.Value) else V.ConstantValue(a) for a in args],
                        {n: a if isinstance(a, V.Value) else V.ConstantValue(a) for n, a in kwargs.items()})


def C(x):
    return V.ConstantValue(x)


# --- arrays from constants and sequences ------------------------------------------------
def constant_array(tx, arr) -> NdarrayValue:
    np = np_module()
    arr = np.asarray(arr)
    if arr.size > _MAX_CONSTANT_ELEMENTS:
        raise Unsupported(f"a constant array of {arr.size} elements")
    t = op(tx, torch.tensor, C(arr.tolist()), dtype=torch_dtype(arr.dtype))
    return NdarrayValue(t)


def _is_const_tree(v) -> bool:
    if isinstance(v, (V.ListValue, V.TupleValue)):
        return all(_is_const_tree(i) for i in v.items)
    return not isinstance(v, NdarrayValue) and v.is_const()


def _const_tree(v):
    if isinstance(v, (V.ListValue, V.TupleValue)):
        return [_const_tree(i) for i in v.items]
    return v.const()


def array_from_sequence(tx, seq, dtype) -> NdarrayValue:
    np = np_module()
    if _is_const_tree(seq):
        try:
            return constant_array(tx, np.array(_const_tree(seq), dtype=dtype))
        except (TypeError, ValueError) as e:
            raise Unsupported(f"np.array of these constants: {e}")
    items = [as_array(tx, i) for i in seq.items]
    if len({i.shape for i in items}) != 1:
        raise Unsupported("np.array of ragged items")
    dt = np.dtype(dtype) if dtype is not None else np.result_type(*[i.dtype for i in items])
    parts = [cast(tx, i, dt).tensor for i in items]
    return NdarrayValue(op(tx, torch.stack, V.ListValue(parts)))


def as_array(tx, v, dtype=None) -> NdarrayValue:
    """An array_like argument as an ndarray (``np.asarray``)."""
    np = np_module()
    if isinstance(v, NdarrayValue):
        return v if dtype is None else cast(tx, v, dtype)
    if isinstance(v, V.TensorValue):
        raise Unsupported("a torch.Tensor passed to a NumPy function")
    if isinstance(v, (V.ListValue, V.TupleValue)):
        return array_from_sequence(tx, v, dtype)
    if v.is_const():
        c = v.const()
        if type(c) in (bool, int, float, complex) or isinstance(c, (np.generic, np.ndarray)):
            return constant_array(tx, np.asarray(c, dtype=dtype))
    raise Unsupported(f"{v} as an array")


# --- NumPy's dtypes from samples ---------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _sample_dtype_cached(fn, sig, kwargs):
    np = np_module()
    args = [np.ones((1,) * nd, dtype=dt) if dt is not None else nd for dt, nd in sig]
    with np.errstate(all="ignore"):
        r = fn(*args, **dict(kwargs))
    return np.asarray(r).dtype


def sample_dtype(fn, *arrays, **kwargs):
    """The dtype ``fn`` returns on one-element arrays of the operands' dtypes and ranks
    (constants are passed as they are)."""
    sig = tuple((a.dtype, a.ndim) if isinstance(a, NdarrayValue) else (None, a) for a in arrays)
    try:
        return _sample_dtype_cached(fn, sig, tuple(sorted(kwargs.items())))
    except Exception as e:  # noqa: BLE001 -- NumPy refuses these arguments
        raise Unsupported(f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}")


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    out = []
    for a in axis:
        if not -ndim <= a < max(ndim, 1):
            raise Unsupported(f"axis {a} out of bounds for {ndim}-d array (NumPy raises)")
        out.append(a % ndim if ndim else 0)
    return tuple(out)


# --- reductions ----------------------------------------------------------------------------
def _no_out(out, where=None):
    if k(out) is not None:
        raise Unsupported("a NumPy reduction with out=")
    if where is not None and k(where) is not True:
        raise Unsupported("a NumPy reduction with where=")


def _reduce(tx, np_fn, a, axis, keepdims, build, dtype=None, **extra):
    a = as_array(tx, a)
    axis, keepdims = k(axis), bool(k(keepdims))
    kw = dict(axis=axis, keepdims=keepdims, **extra)
    if dtype is not None and k(dtype) is not None:
        kw["dtype"] = np_module().dtype(k(dtype))
    r = sample_dtype(np_fn, a, **kw)
    dims = _axes(axis, a.ndim)
    if not dims and axis is not None:  # axis=(): nothing reduced, a new array
        return NdarrayValue(cast(tx, a, r, copy=True).tensor, scalar=True)
    t = build(a.tensor, dims, keepdims, torch_dtype(r))
    if t.fake.dtype != torch_dtype(r):
        t = method(tx, "to", t, torch_dtype(r))
    return NdarrayValue(t, scalar=True)


def _per_dim(tx, name, t, dims, keepdims, **kw):
    """A torch reduction taking one dim at a time (prod), over several dims."""
    if not dims:
        return method(tx, name, t, **kw)
    for d in sorted(dims, reverse=True):
        t = method(tx, name, t, d, keepdim=keepdims, **kw)
    return t


def _sum(tx, a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _no_out(out, where)
    if k(initial) is not None:
        raise Unsupported("np.sum with initial=")
    np = np_module()
    return _reduce(tx, np.sum, a, axis, keepdims, lambda t, d, kd, r: method(
        tx, "sum", t, list(d), keepdim=kd, dtype=r) if d else method(tx, "sum", t, dtype=r), dtype)


def _prod(tx, a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _no_out(out, where)
    if k(initial) is not None:
        raise Unsupported("np.prod with initial=")
    np = np_module()
    return _reduce(tx, np.prod, a, axis, keepdims,
                   lambda t, d, kd, r: _per_dim(tx, "prod", method(tx, "to", t, r), d, kd), dtype)


def _mean(tx, a, axis=None, dtype=None, out=None, keepdims=False, where=None):
    _no_out(out, where)
    np = np_module()
    return _reduce(tx, np.mean, a, axis, keepdims, lambda t, d, kd, r: method(
        tx, "mean", method(tx, "to", t, r), list(d), keepdim=kd), dtype)


def _var_like(name, np_name):
    def rule(tx, a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None, mean=None,
             correction=None):
        _no_out(out, where)
        if k(mean) is not None or k(correction) is not None:
            raise Unsupported(f"np.{np_name} with mean= or correction=")
        np = np_module()
        dd = k(ddof)
        return _reduce(tx, getattr(np, np_name), a, axis, keepdims, lambda t, d, kd, r: method(
            tx, name, method(tx, "to", t, r), list(d), correction=dd, keepdim=kd), dtype, ddof=dd)
    return rule


def _minmax(name, np_name):
    def rule(tx, a, axis=None, out=None, keepdims=False, initial=None, where=None):
        _no_out(out, where)
        if k(initial) is not None:
            raise Unsupported(f"np.{np_name} with initial=")
        np = np_module()
        aa = as_array(tx, a)
        if 0 in aa.shape:
            raise Unsupported(f"np.{np_name} of an empty array (NumPy raises)")
        return _reduce(tx, getattr(np, np_name), aa, axis, keepdims,
                       lambda t, d, kd, r: method(tx, name, t, list(d), keepdim=kd))
    return rule


def _allany(name):
    def rule(tx, a, axis=None, out=None, keepdims=False, where=None):
        _no_out(out, where)
        np = np_module()
        return _reduce(tx, getattr(np, name), a, axis, keepdims,
                       lambda t, d, kd, r: method(tx, name, t, d, keepdim=kd))
    return rule


def _arg(name):
    def rule(tx, a, axis=None, out=None, keepdims=False):
        _no_out(out)
        np = np_module()
        a = as_array(tx, a)
        ax, kd = k(axis), bool(k(keepdims))
        if 0 in a.shape:
            raise Unsupported(f"np.{name} of an empty array (NumPy raises)")
        if ax is None:
            t = method(tx, name, method(tx, "reshape", a.tensor, -1), 0)
            if kd:
                t = method(tx, "reshape", t, (1,) * a.ndim)
        else:
            t = method(tx, name, a.tensor, _axes(ax, a.ndim)[0], keepdim=kd)
        del np
        return NdarrayValue(t, scalar=True)
    return rule


def _cum(name):
    def rule(tx, a, axis=None, dtype=None, out=None):
        _no_out(out)
        np = np_module()
        a = as_array(tx, a)
        kw = {"axis": k(axis)}
        if k(dtype) is not None:
            kw["dtype"] = np.dtype(k(dtype))
        r = torch_dtype(sample_dtype(getattr(np, name), a, **kw))
        t = a.tensor
        ax = k(axis)
        if ax is None:
            t, ax = method(tx, "reshape", t, -1), 0
        return NdarrayValue(method(tx, name, t, ax, dtype=r))
    return rule


def _median(tx, a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """The middle of the sorted values (the mean of the two middle ones for an even
    count), NaN where the values hold one, as NumPy's median."""
    _no_out(out)
    np = np_module()
    a = as_array(tx, a)
    ax, kd = k(axis), bool(k(keepdims))
    if a.dtype.kind != "f" or not (ax is None or isinstance(ax, int)) or 0 in a.shape:
        raise Unsupported("np.median other than of floats along one axis or all")
    r = sample_dtype(np.median, a, axis=ax, keepdims=kd)
    t, d = (method(tx, "reshape", a.tensor, -1), 0) if ax is None else (a.tensor, _axes(ax, a.ndim)[0])
    n = t.fake.shape[d]
    s = op(tx, torch.sort, t, d).unpack(tx)[0]
    mid = method(tx, "narrow", s, d, (n - 1) // 2, 2 - n % 2)
    med = method(tx, "mean", mid, d, keepdim=True)
    nan = method(tx, "any", op(tx, torch.isnan, t), d, keepdim=True)
    med = op(tx, torch.where, nan, C(float("nan")), med)
    if ax is None:
        med = method(tx, "reshape", med, (1,) * a.ndim if kd else ())
    elif not kd:
        med = method(tx, "squeeze", med, d)
    return NdarrayValue(cast(tx, NdarrayValue(med), r).tensor, scalar=True)


def _sort(tx, a, axis=-1, kind=None, order=None, *, stable=None):
    """Sorted values (which sort NumPy uses does not change them; NaN last in both)."""
    if k(order) is not None:
        raise Unsupported("np.sort with order=")
    a = as_array(tx, a)
    ax = k(axis)
    if a.dtype.kind == "c":
        raise Unsupported("sorting complex values")
    t, ax = (method(tx, "reshape", a.tensor, -1), 0) if ax is None else (a.tensor, ax)
    return NdarrayValue(op(tx, torch.sort, t, dim=ax, stable=True).unpack(tx)[0])


def _argsort(tx, a, axis=-1, kind=None, order=None, *, stable=None):
    """Only a stable argsort: NumPy's default quicksort orders ties its own way."""
    if k(kind) != "stable" and k(stable) is not True:
        raise Unsupported("np.argsort other than kind='stable' (ties would differ)")
    a = as_array(tx, a)
    if a.dtype.kind == "c" or k(order) is not None:
        raise Unsupported("argsort of complex values or with order=")
    ax = k(axis)
    t, ax = (method(tx, "reshape", a.tensor, -1), 0) if ax is None else (a.tensor, ax)
    return NdarrayValue(op(tx, torch.argsort, t, dim=ax, stable=True))


def _m_sort(tx, a, axis=-1, kind=None, order=None, *, stable=None):
    if getattr(a, "readonly", False) or a.scalar:
        raise Unsupported("sorting a read-only array in place")
    s = _sort(tx, a, axis, kind, order)
    method(tx, "copy_", a.tensor, s.tensor)
    return V.ConstantValue(None)


# --- shapes -------------------------------------------------------------------------------
def _shape_arg(s):
    s = k(s)
    return (s,) if isinstance(s, int) else tuple(s)


def _reshape(tx, a, shape=None, order="C", *, newshape=None, copy=None):
    if k(order) != "C" or k(copy) is not None:
        raise Unsupported("np.reshape with order= other than 'C' or copy=")
    a = as_array(tx, a)
    return NdarrayValue(method(tx, "reshape", a.tensor, _shape_arg(shape if shape is not None else newshape)))


def _transpose(tx, a, axes=None):
    a = as_array(tx, a)
    ax = k(axes)
    perm = tuple(reversed(range(a.ndim))) if ax is None else _axes(ax, a.ndim)
    return NdarrayValue(method(tx, "permute", a.tensor, perm))


def _swapaxes(tx, a, axis1, axis2):
    a = as_array(tx, a)
    return NdarrayValue(method(tx, "transpose", a.tensor, k(axis1), k(axis2)))


def _moveaxis(tx, a, source, destination):
    a = as_array(tx, a)
    return NdarrayValue(op(tx, torch.movedim, a.tensor, k(source), k(destination)))


def _expand_dims(tx, a, axis):
    a = as_array(tx, a)
    ax = k(axis)
    axes = sorted(_axes(ax, a.ndim + (1 if isinstance(ax, int) else len(ax))))
    t = a.tensor
    for d in axes:
        t = method(tx, "unsqueeze", t, d)
    return NdarrayValue(t)


def _squeeze(tx, a, axis=None):
    a = as_array(tx, a)
    ax = k(axis)
    if ax is None:
        return NdarrayValue(method(tx, "squeeze", a.tensor))
    dims = _axes(ax, a.ndim)
    if any(a.shape[d] != 1 for d in dims):
        raise Unsupported("np.squeeze of an axis whose size is not 1 (NumPy raises)")
    return NdarrayValue(method(tx, "squeeze", a.tensor, dims))


def _ravel(tx, a, order="C"):
    if k(order) != "C":
        raise Unsupported("ravel with order= other than 'C'")
    a = as_array(tx, a)
    return NdarrayValue(method(tx, "reshape", a.tensor, -1))


def _flatten(tx, a, order="C"):
    r = _ravel(tx, a, order)
    return NdarrayValue(method(tx, "clone", r.tensor))


def _seq_arrays(tx, arrays):
    if not isinstance(arrays, (V.ListValue, V.TupleValue)):
        raise Unsupported("a sequence of arrays that is not a list or tuple")
    items = [as_array(tx, i) for i in arrays.items]
    np = np_module()
    dt = np.result_type(*[i.dtype for i in items])
    return [cast(tx, i, dt).tensor for i in items]


def _concatenate(tx, arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    _no_out(out)
    if k(dtype) is not None:
        raise Unsupported("np.concatenate with dtype=")
    ts = _seq_arrays(tx, arrays)
    ax = k(axis)
    if ax is None:
        ts = [method(tx, "reshape", t, -1) for t in ts]
        ax = 0
    return NdarrayValue(op(tx, torch.cat, V.ListValue(ts), ax))


def _stack(tx, arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    _no_out(out)
    if k(dtype) is not None:
        raise Unsupported("np.stack with dtype=")
    return NdarrayValue(op(tx, torch.stack, V.ListValue(_seq_arrays(tx, arrays)), k(axis)))


def _vstack(tx, tup, *, dtype=None, casting="same_kind"):
    ts = [t if t.fake.dim() >= 2 else method(tx, "reshape", t, (1, -1)) for t in _seq_arrays(tx, tup)]
    return NdarrayValue(op(tx, torch.cat, V.ListValue(ts), 0))


def _hstack(tx, tup, *, dtype=None, casting="same_kind"):
    ts = [t if t.fake.dim() >= 1 else method(tx, "reshape", t, (1,)) for t in _seq_arrays(tx, tup)]
    return NdarrayValue(op(tx, torch.cat, V.ListValue(ts), 0 if ts[0].fake.dim() == 1 else 1))


def _flip(tx, m, axis=None):
    a = as_array(tx, m)
    return NdarrayValue(op(tx, torch.flip, a.tensor, _axes(k(axis), a.ndim)))


def _broadcast_to(tx, array, shape, subok=False):
    a = as_array(tx, array)
    return NdarrayValue(method(tx, "expand", a.tensor, _shape_arg(shape)))


def _tile(tx, A, reps):
    a = as_array(tx, A)
    return NdarrayValue(op(tx, torch.tile, a.tensor, _shape_arg(reps)))


def _repeat(tx, a, repeats, axis=None):
    a = as_array(tx, a)
    ax, r = k(axis), k(repeats)
    if not isinstance(r, int):
        raise Unsupported("np.repeat with per-item repeats")
    t = a.tensor
    if ax is None:
        t, ax = method(tx, "reshape", t, -1), 0
    return NdarrayValue(op(tx, torch.repeat_interleave, t, r, dim=ax))


def _tri(name):
    def rule(tx, m, k_=0, **kw):
        a = as_array(tx, m)
        return NdarrayValue(op(tx, getattr(torch, name), a.tensor, k(kw.get("k", k_))))
    return rule


def _where(tx, condition, x=None, y=None):
    if x is None or y is None:
        raise Unsupported("np.where with one argument (data-dependent shape)")
    np = np_module()
    c = as_array(tx, condition, np.dtype(bool))
    ops = [v if isinstance(v, NdarrayValue) else _weak_or_array(tx, v) for v in (x, y)]
    r = sample_dtype(np.where, c, *[o if isinstance(o, NdarrayValue) else o.const() for o in ops])
    args = [cast(tx, o, r).tensor if isinstance(o, NdarrayValue) else C(_py(o.const())) for o in ops]
    res = op(tx, torch.where, c.tensor, *args)
    if res.fake.dtype != torch_dtype(r):
        res = method(tx, "to", res, torch_dtype(r))
    return NdarrayValue(res, scalar=True)


def _py(c):
    np = np_module()
    return c.item() if isinstance(c, np.generic) else c


def _weak_or_array(tx, v):
    if v.is_const() and type(v.const()) in (bool, int, float, complex):
        return v
    return as_array(tx, v)


def _clip(tx, a, a_min=None, a_max=None, out=None, **kw):
    _no_out(out)
    np = np_module()
    lo, hi = kw.get("min", a_min), kw.get("max", a_max)
    r = a
    if lo is not None and not (isinstance(lo, V.Value) and lo.is_const() and lo.const() is None):
        r = apply_ufunc(tx, np.maximum, [r, lo], {})
    if hi is not None and not (isinstance(hi, V.Value) and hi.is_const() and hi.const() is None):
        r = apply_ufunc(tx, np.minimum, [r, hi], {})
    return r


def _round(tx, a, decimals=0, out=None):
    _no_out(out)
    a = as_array(tx, a)
    d = k(decimals)
    if a.dtype.kind not in "f":
        raise Unsupported("np.round of non-float arrays")
    t = method(tx, "round", a.tensor, decimals=d) if d else method(tx, "round", a.tensor)
    return NdarrayValue(t, scalar=True)


# --- products --------------------------------------------------------------------------------
def matmul(tx, a, b):
    np = np_module()
    a, b = as_array(tx, a), as_array(tx, b)
    if a.ndim == 0 or b.ndim == 0:
        raise Unsupported("matmul of a 0-d array (NumPy raises)")
    r = np.result_type(a.dtype, b.dtype)
    if r.kind == "b":
        raise Unsupported("matmul of bool arrays")
    t = op(tx, torch.matmul, cast(tx, a, r).tensor, cast(tx, b, r).tensor)
    return NdarrayValue(t, scalar=True)


def _matmul(tx, x1, x2, out=None, **kw):
    _no_out(out)
    if kw:
        raise Unsupported(f"np.matmul with {sorted(kw)}")
    return matmul(tx, x1, x2)


def _dot(tx, a, b, out=None):
    _no_out(out)
    np = np_module()
    a, b = as_array(tx, a), as_array(tx, b)
    if a.ndim == 0 or b.ndim == 0:
        return apply_ufunc(tx, np.multiply, [a, b], {})
    if a.ndim > 2 or b.ndim > 2:
        raise Unsupported("np.dot of arrays of more than 2 dims")
    return matmul(tx, a, b)


def _outer(tx, a, b, out=None):
    _no_out(out)
    np = np_module()
    a, b = as_array(tx, a), as_array(tx, b)
    r = np.result_type(a.dtype, b.dtype)
    ta = method(tx, "reshape", cast(tx, a, r).tensor, (-1, 1))
    tb = method(tx, "reshape", cast(tx, b, r).tensor, (1, -1))
    return NdarrayValue(op(tx, torch.mul, ta, tb))


def _einsum(tx, subscripts, *operands, out=None, optimize=False, **kw):
    _no_out(out)
    if kw:
        raise Unsupported(f"np.einsum with {sorted(kw)}")
    np = np_module()
    arrs = [as_array(tx, o) for o in operands]
    r = np.result_type(*[a.dtype for a in arrs])
    ts = [cast(tx, a, r).tensor for a in arrs]
    return NdarrayValue(op(tx, torch.einsum, C(k(subscripts)), *ts), scalar=True)


def _trace(tx, a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    _no_out(out)
    np = np_module()
    a = as_array(tx, a)
    kw = {"offset": k(offset), "axis1": k(axis1), "axis2": k(axis2)}
    if k(dtype) is not None:
        kw["dtype"] = np.dtype(k(dtype))
    r = torch_dtype(sample_dtype(np.trace, a, **kw))
    d = op(tx, torch.diagonal, a.tensor, kw["offset"], kw["axis1"], kw["axis2"])
    return NdarrayValue(method(tx, "sum", d, -1, dtype=r), scalar=True)


# --- creation --------------------------------------------------------------------------------
def _dtype_or(dtype, default):
    d = k(dtype)
    return np_module().dtype(default if d is None else d)


def _factory(fn, default="float64"):
    def rule(tx, shape, dtype=None, order="C", *, device=None, like=None):
        if k(order) != "C" or k(like) is not None or k(device) not in (None, "cpu"):
            raise Unsupported("a NumPy factory with order=, like= or device=")
        dt = torch_dtype(_dtype_or(dtype, default))
        return NdarrayValue(op(tx, fn, C(_shape_arg(shape)), dtype=dt))
    return rule


def _full(tx, shape, fill_value, dtype=None, order="C", *, device=None, like=None):
    np = np_module()
    fv = k(fill_value)
    dt = np.dtype(k(dtype)) if k(dtype) is not None else np.asarray(fv).dtype
    return NdarrayValue(op(tx, torch.full, C(_shape_arg(shape)), C(_py(fv)), dtype=torch_dtype(dt)))


def _like(fn):
    def rule(tx, a, dtype=None, order="K", subok=True, shape=None, *, device=None):
        a = as_array(tx, a)
        dt = torch_dtype(_dtype_or(dtype, a.dtype))
        s = a.shape if k(shape) is None else _shape_arg(shape)
        return NdarrayValue(op(tx, fn, C(s), dtype=dt))
    return rule


def _full_like(tx, a, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None):
    a = as_array(tx, a)
    dt = torch_dtype(_dtype_or(dtype, a.dtype))
    s = a.shape if k(shape) is None else _shape_arg(shape)
    return NdarrayValue(op(tx, torch.full, C(s), C(_py(k(fill_value))), dtype=dt))


def _folded(np_name):
    """A creation function of constants: NumPy computes it, the graph holds the values."""
    def rule(tx, *args, **kwargs):
        np = np_module()
        fn = functools.reduce(getattr, np_name.split("."), np)
        res = fn(*[k(a) for a in args], **{n: k(v) for n, v in kwargs.items()})
        if isinstance(res, tuple):
            return V.TupleValue([constant_array(tx, r) for r in res])
        return constant_array(tx, res)
    return rule


def _array(tx, obj, dtype=None, *, copy=True, order="K", subok=False, ndmin=0, like=None):
    if k(ndmin) or k(like) is not None or k(order) not in ("K", "A", "C"):
        raise Unsupported("np.array with ndmin=, like= or order=")
    d = k(dtype)
    np = np_module()
    if isinstance(obj, NdarrayValue):
        if k(copy) is False and (d is None or np.dtype(d) == obj.dtype):
            return obj
        return NdarrayValue(cast(tx, obj, obj.dtype if d is None else np.dtype(d), copy=True).tensor)
    return as_array(tx, obj, None if d is None else np.dtype(d))


def _asarray(tx, a, dtype=None, order=None, *, device=None, copy=None, like=None):
    d = k(dtype)
    if isinstance(a, NdarrayValue):
        r = a if d is None else cast(tx, a, np_module().dtype(d))
        return NdarrayValue(r.tensor) if r.scalar else r
    return as_array(tx, a, None if d is None else np_module().dtype(d))


def _astype(tx, a, dtype, order="K", casting="unsafe", subok=True, copy=True):
    if k(casting) != "unsafe":
        raise Unsupported("astype with casting=")
    np = np_module()
    return NdarrayValue(cast(tx, a, np.dtype(k(dtype)), copy=bool(k(copy))).tensor)


def _copy(tx, a, order="K", subok=False):
    a = as_array(tx, a)
    return NdarrayValue(method(tx, "clone", a.tensor))


def _meshgrid(tx, *xi, copy=True, sparse=False, indexing="xy"):
    if k(sparse) or not k(copy):
        raise Unsupported("np.meshgrid with sparse=True or copy=False")
    arrs = [as_array(tx, x) for x in xi]
    ts = [method(tx, "reshape", a.tensor, -1) for a in arrs]
    grids = op(tx, torch.meshgrid, *ts, indexing=k(indexing)).unpack(tx)
    return V.TupleValue([NdarrayValue(method(tx, "contiguous", g)) for g in grids])


def _scalar_type(tx, cls, args, kwargs):
    """``np.float32(x)``: a constant folds; an array is cast (a scalar when 0-d)."""
    np = np_module()
    if kwargs or len(args) > 1:
        raise Unsupported(f"np.{cls.__name__} with these arguments")
    if not args:
        return V.ConstantValue(cls())
    a = args[0]
    if isinstance(a, NdarrayValue):
        return NdarrayValue(cast(tx, a, np.dtype(cls), copy=True).tensor, scalar=True)
    from kiln.capture.operators import fold

    r = fold(cls, k(a))
    if isinstance(r, np.ndarray):
        return constant_array(tx, r)
    return V.ConstantValue(r)


def _fold_info(tx, *args, **kwargs):
    raise AssertionError("replaced in FUNCTIONS")


# --- indexing ------------------------------------------------------------------------------
def _index_part(tx, v):
    if isinstance(v, NdarrayValue):
        if v.dtype.kind not in "iub":
            raise Unsupported("indexing with a non-integer array")
        return v.tensor
    if isinstance(v, (V.ListValue,)):
        return V.ListValue([_index_part(tx, i) for i in v.items])
    c = v.const()
    np = np_module()
    if isinstance(c, slice) and c.step is not None and c.step < 0:
        raise Unsupported("a slice with a negative step (torch has none)")
    if isinstance(c, np.integer):
        c = int(c)
    return C(c)


def _index_key(tx, key):
    parts = key.items if isinstance(key, V.TupleValue) else [key]
    conv = [_index_part(tx, p) for p in parts]
    return conv, parts


def ndarray_getitem(tx, a, key):
    if a.scalar:
        raise Unsupported("indexing a NumPy scalar")
    conv, parts = _index_key(tx, key)
    k_arg = V.TupleValue(conv) if isinstance(key, V.TupleValue) else conv[0]
    t = tx.output.op("call_function", operator.getitem, [a.tensor, k_arg], {})
    all_ints = all(isinstance(p, V.ConstantValue) and type(p.value) is int for p in conv)
    return NdarrayValue(t, scalar=all_ints and len(conv) == a.ndim)


def ndarray_setitem(tx, a, key, value):
    if getattr(a, "readonly", False):
        raise Unsupported("writing into a read-only ndarray (NumPy raises)")
    conv, _ = _index_key(tx, key)
    k_arg = V.TupleValue(conv) if isinstance(key, V.TupleValue) else conv[0]
    if isinstance(value, NdarrayValue) or isinstance(value, (V.ListValue, V.TupleValue)):
        v = cast(tx, as_array(tx, value), a.dtype).tensor
    else:
        c = _py(k(value))
        if type(c) not in (bool, int, float) or (type(c) is float and a.dtype.kind in "iub"):
            raise Unsupported("assigning this value into an ndarray")
        v = C(c)
    tx.output.op("call_function", operator.setitem, [a.tensor, k_arg, v], {})


# --- attributes and methods ----------------------------------------------------------------
def ndarray_attribute(tx, a, name):
    from kiln.capture.numpy_values import NdarrayValue as _N

    simple = {"shape": lambda: a.shape, "ndim": lambda: a.ndim, "dtype": lambda: a.dtype,
              "size": lambda: int(torch.Size(a.shape).numel()), "itemsize": lambda: a.dtype.itemsize,
              "nbytes": lambda: int(torch.Size(a.shape).numel()) * a.dtype.itemsize}
    if name in simple:
        return V.ConstantValue(simple[name]())
    if name == "T":
        return _transpose(tx, a)
    if name in ("real", "imag"):
        if a.dtype.kind != "c":
            if name == "real":
                return a
            return _N(op(tx, torch.zeros_like, a.tensor))
        return _N(op(tx, getattr(torch, name), a.tensor), scalar=a.scalar)
    if name == "__class__":
        return V.ClassValue(a.python_type())
    rule = methods().get(name)
    if rule is None:
        raise Unsupported(f"ndarray attribute {name!r} is not traced")
    return _BoundRule(rule, a)


class _BoundRule(V.Value):
    def __init__(self, rule, a):
        self.rule = rule
        self.a = a

    def call(self, tx, args, kwargs):
        return self.rule(tx, self.a, *args, **kwargs)


def _m_reshape(tx, a, *shape, order="C", copy=None):
    s = shape[0] if len(shape) == 1 else V.TupleValue(list(shape))
    return _reshape(tx, a, s, order, copy=copy)


def _m_transpose(tx, a, *axes):
    if not axes:
        return _transpose(tx, a)
    return _transpose(tx, a, axes[0] if len(axes) == 1 else V.TupleValue(list(axes)))


def _m_fill(tx, a, value):
    if getattr(a, "readonly", False) or a.scalar:
        raise Unsupported("fill on a read-only array or a scalar")
    method(tx, "fill_", a.tensor, C(_py(k(value))))
    return V.ConstantValue(None)


def _fold_pure(name):
    """A NumPy function of constants only (dtypes, shapes): computed at trace time."""
    def rule(tx, *args, **kwargs):
        from kiln.capture.builder import wrap_static
        from kiln.capture.operators import fold

        fn = getattr(np_module(), name)
        return wrap_static(fold(fn, *[_const_tree(a) for a in args],
                                **{n: _const_tree(v) for n, v in kwargs.items()}))
    return rule


def _metadata(name):
    def rule(tx, a, *args):
        a = as_array(tx, a)
        if name == "size" and args:
            return V.ConstantValue(a.shape[k(args[0])])
        return V.ConstantValue({"shape": a.shape, "ndim": a.ndim,
                                "size": int(torch.Size(a.shape).numel())}[name])
    return rule


def _not_traced(why):
    def rule(tx, *args, **kwargs):
        raise Unsupported(why)
    return rule


@functools.lru_cache(maxsize=1)
def functions():
    np = np_module()
    table = {
        np.sum: _sum, np.prod: _prod, np.mean: _mean, np.var: _var_like("var", "var"),
        np.std: _var_like("std", "std"), np.max: _minmax("amax", "max"),
        np.amax: _minmax("amax", "amax"), np.min: _minmax("amin", "min"),
        np.amin: _minmax("amin", "amin"), np.all: _allany("all"), np.any: _allany("any"),
        np.argmax: _arg("argmax"), np.argmin: _arg("argmin"), np.cumsum: _cum("cumsum"),
        np.cumprod: _cum("cumprod"), np.median: _median,
        np.reshape: _reshape, np.transpose: _transpose, np.swapaxes: _swapaxes,
        np.moveaxis: _moveaxis, np.expand_dims: _expand_dims, np.squeeze: _squeeze,
        np.ravel: _ravel, np.concatenate: _concatenate, np.stack: _stack, np.vstack: _vstack,
        np.hstack: _hstack, np.flip: _flip, np.broadcast_to: _broadcast_to, np.tile: _tile,
        np.repeat: _repeat, np.tril: _tri("tril"), np.triu: _tri("triu"), np.where: _where,
        np.clip: _clip, np.round: _round, np.around: _round, np.matmul: _matmul, np.dot: _dot,
        np.outer: _outer, np.einsum: _einsum, np.trace: _trace, np.sort: _sort,
        np.argsort: _argsort, np.shape: _metadata("shape"), np.ndim: _metadata("ndim"),
        np.size: _metadata("size"),
        np.zeros: _factory(torch.zeros), np.ones: _factory(torch.ones),
        np.empty: _factory(torch.empty), np.full: _full,
        np.zeros_like: _like(torch.zeros), np.ones_like: _like(torch.ones),
        np.empty_like: _like(torch.empty), np.full_like: _full_like,
        np.arange: _folded("arange"), np.linspace: _folded("linspace"), np.eye: _folded("eye"),
        np.identity: _folded("identity"), np.logspace: _folded("logspace"),
        np.array: _array, np.asarray: _asarray, np.copy: _copy, np.meshgrid: _meshgrid,
        np.fft.fftfreq: _folded("fft.fftfreq"), np.fft.rfftfreq: _folded("fft.rfftfreq"),
    }
    for name in ("issubdtype", "result_type", "promote_types", "can_cast", "isscalar",
                 "broadcast_shapes", "iscomplexobj", "isrealobj"):
        table[getattr(np, name)] = _fold_pure(name)
    from kiln.capture.numpy_linalg import linalg_fft_rules

    table.update(linalg_fft_rules(np))
    return table


@functools.lru_cache(maxsize=1)
def methods():
    np = np_module()
    f = functions()
    table = {name: f[getattr(np, fn)] for name, fn in {
        "sum": "sum", "prod": "prod", "mean": "mean", "var": "var", "std": "std", "max": "max",
        "min": "min", "all": "all", "any": "any", "argmax": "argmax", "argmin": "argmin",
        "cumsum": "cumsum", "cumprod": "cumprod", "swapaxes": "swapaxes", "squeeze": "squeeze",
        "ravel": "ravel", "repeat": "repeat", "clip": "clip", "round": "round", "dot": "dot",
        "trace": "trace", "copy": "copy"}.items()}
    table.update({
        "reshape": _m_reshape, "transpose": _m_transpose, "astype": _astype,
        "flatten": _flatten, "fill": _m_fill, "sort": _m_sort, "argsort": _argsort,
        "conj": lambda tx, a: apply_ufunc(tx, np.conjugate, [a], {}),
        "conjugate": lambda tx, a: apply_ufunc(tx, np.conjugate, [a], {}),
        "__len__": lambda tx, a: a.len_value(tx),
        "item": _not_traced("ndarray.item() needs the array's data"),
        "tolist": _not_traced("ndarray.tolist() needs the array's data"),
        "nonzero": _not_traced("ndarray.nonzero() has a data-dependent shape"),
    })
    return table


def call_numpy(tx, fn, args, kwargs):
    np = np_module()
    if is_ufunc(fn):
        return apply_ufunc(tx, fn, args, kwargs)
    if isinstance(fn, type):
        if issubclass(fn, np.generic):
            return _scalar_type(tx, fn, args, kwargs)
        if fn in (np.finfo, np.iinfo, np.dtype):
            from kiln.capture.operators import fold
            from kiln.capture.builder import wrap_static

            return wrap_static(fold(fn, *[k(a) for a in args], **{n: k(v) for n, v in kwargs.items()}))
    if any(isinstance(a, V.TensorValue) for a in list(args) + list(kwargs.values())):
        raise Unsupported(f"np.{getattr(fn, '__name__', fn)} called on a torch.Tensor")
    rule = functions().get(fn)
    if rule is None:
        from kiln.capture.numpy_random import random_rule

        rule = random_rule(fn)
    if rule is None:
        raise Unsupported(f"NumPy function {getattr(fn, '__module__', '')}.{getattr(fn, '__name__', fn)} is not traced")
    try:
        return rule(tx, *args, **kwargs)
    except TypeError as e:  # the rule's signature refused the call
        raise Unsupported(f"np.{getattr(fn, '__name__', fn)} with these arguments: {e}")


del numpy_dtype, write_into
