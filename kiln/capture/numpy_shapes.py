"""NumPy shape functions (reshape, transpose, concatenate...), products (matmul, dot,
einsum) and array creation (zeros, full, arange...) as torch ops. Views stay views where
NumPy's are; ``flatten``, ``copy`` and ``astype`` copy; creation functions of constants
are computed by NumPy and held by the graph as constants."""
from __future__ import annotations

import functools

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.numpy_rules import (C, _axes, _no_out, _py, as_array, constant_array, k,
                                      method, op, sample_dtype)
from kiln.capture.numpy_ufuncs import apply_ufunc, cast
from kiln.capture.numpy_values import NdarrayValue, np_module, numpy_device, torch_dtype, view


# --- shapes -------------------------------------------------------------------------------
def _shape_arg(s):
    s = k(s)
    return (s,) if isinstance(s, int) else tuple(s)


def np_reshape(tx, a, shape=None, order="C", *, newshape=None, copy=None):
    if k(order) != "C" or k(copy) is not None:
        raise Unsupported("K0301", "np.reshape with order= other than 'C' or copy=")
    a = as_array(tx, a)
    return view(a, method(tx, "reshape", a.tensor, _shape_arg(shape if shape is not None else newshape)))


def np_transpose(tx, a, axes=None):
    a = as_array(tx, a)
    ax = k(axes)
    perm = tuple(reversed(range(a.ndim))) if ax is None else _axes(ax, a.ndim)
    return view(a, method(tx, "permute", a.tensor, perm))


def np_swapaxes(tx, a, axis1, axis2):
    a = as_array(tx, a)
    return view(a, method(tx, "transpose", a.tensor, k(axis1), k(axis2)))


def np_moveaxis(tx, a, source, destination):
    a = as_array(tx, a)
    return view(a, op(tx, torch.movedim, a.tensor, k(source), k(destination)))


def np_expand_dims(tx, a, axis):
    a = as_array(tx, a)
    ax = k(axis)
    axes = sorted(_axes(ax, a.ndim + (1 if isinstance(ax, int) else len(ax))))
    t = a.tensor
    for d in axes:
        t = method(tx, "unsqueeze", t, d)
    return view(a, t)


def np_squeeze(tx, a, axis=None):
    a = as_array(tx, a)
    ax = k(axis)
    if ax is None:
        return view(a, method(tx, "squeeze", a.tensor))
    dims = _axes(ax, a.ndim)
    if any(a.shape[d] != 1 for d in dims):
        raise Unsupported("K0304", "np.squeeze of an axis whose size is not 1 (NumPy raises)")
    return view(a, method(tx, "squeeze", a.tensor, dims))


def np_ravel(tx, a, order="C"):
    if k(order) != "C":
        raise Unsupported("K0301", "ravel with order= other than 'C'")
    a = as_array(tx, a)
    return view(a, method(tx, "reshape", a.tensor, -1))


def np_flatten(tx, a, order="C"):
    r = np_ravel(tx, a, order)
    return NdarrayValue(method(tx, "clone", r.tensor))


def _seq_arrays(tx, arrays):
    if not isinstance(arrays, (V.ListValue, V.TupleValue)):
        raise Unsupported("K0301", "a sequence of arrays that is not a list or tuple")
    items = [as_array(tx, i) for i in arrays.items]
    np = np_module()
    dt = np.result_type(*[i.dtype for i in items])
    return [cast(tx, i, dt).tensor for i in items]


def np_concatenate(tx, arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    _no_out(out)
    if k(dtype) is not None:
        raise Unsupported("K0301", "np.concatenate with dtype=")
    ts = _seq_arrays(tx, arrays)
    ax = k(axis)
    if ax is None:
        ts = [method(tx, "reshape", t, -1) for t in ts]
        ax = 0
    return NdarrayValue(op(tx, torch.cat, V.ListValue(ts), ax))


def np_stack(tx, arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    _no_out(out)
    if k(dtype) is not None:
        raise Unsupported("K0301", "np.stack with dtype=")
    return NdarrayValue(op(tx, torch.stack, V.ListValue(_seq_arrays(tx, arrays)), k(axis)))


def np_vstack(tx, tup, *, dtype=None, casting="same_kind"):
    ts = [t if t.fake.dim() >= 2 else method(tx, "reshape", t, (1, -1)) for t in _seq_arrays(tx, tup)]
    return NdarrayValue(op(tx, torch.cat, V.ListValue(ts), 0))


def np_hstack(tx, tup, *, dtype=None, casting="same_kind"):
    ts = [t if t.fake.dim() >= 1 else method(tx, "reshape", t, (1,)) for t in _seq_arrays(tx, tup)]
    return NdarrayValue(op(tx, torch.cat, V.ListValue(ts), 0 if ts[0].fake.dim() == 1 else 1))


def np_flip(tx, m, axis=None):
    """NumPy's flip is a view with negative strides, which torch has not: a copy would
    not see later writes through either alias."""
    raise Unsupported("K0303", "np.flip (a negative-stride view; torch tensors have none)")


def np_broadcast_to(tx, array, shape, subok=False):
    a = as_array(tx, array)
    v = view(a, method(tx, "expand", a.tensor, _shape_arg(shape)))
    v.readonly = True  # NumPy's broadcast views refuse writes
    return v


def np_tile(tx, A, reps):
    a = as_array(tx, A)
    return NdarrayValue(op(tx, torch.tile, a.tensor, _shape_arg(reps)))


def np_repeat(tx, a, repeats, axis=None):
    a = as_array(tx, a)
    ax, r = k(axis), k(repeats)
    if not isinstance(r, int):
        raise Unsupported("K0301", "np.repeat with per-item repeats")
    t = a.tensor
    if ax is None:
        t, ax = method(tx, "reshape", t, -1), 0
    return NdarrayValue(op(tx, torch.repeat_interleave, t, r, dim=ax))


def np_tri(name):
    def rule(tx, m, k_=0, **kw):
        a = as_array(tx, m)
        return NdarrayValue(op(tx, getattr(torch, name), a.tensor, k(kw.get("k", k_))))
    return rule


def np_where(tx, condition, x=None, y=None):
    if x is None or y is None:
        raise Unsupported("K0301", "np.where with one argument (data-dependent shape)")
    np = np_module()
    c = as_array(tx, condition, np.dtype(bool))
    ops = [v if isinstance(v, NdarrayValue) else _weak_or_array(tx, v) for v in (x, y)]
    r = sample_dtype(np.where, c, *[o if isinstance(o, NdarrayValue) else o.const() for o in ops])
    args = [cast(tx, o, r).tensor if isinstance(o, NdarrayValue) else C(_py(o.const())) for o in ops]
    res = op(tx, torch.where, c.tensor, *args)
    if res.fake.dtype != torch_dtype(r):
        res = method(tx, "to", res, torch_dtype(r))
    return NdarrayValue(res, scalar=True)


def _weak_or_array(tx, v):
    if v.is_const() and type(v.const()) in (bool, int, float, complex):
        return v
    return as_array(tx, v)


def np_clip(tx, a, a_min=None, a_max=None, out=None, **kw):
    _no_out(out)
    np = np_module()
    lo, hi = kw.get("min", a_min), kw.get("max", a_max)
    r = a
    if lo is not None and not (isinstance(lo, V.Value) and lo.is_const() and lo.const() is None):
        r = apply_ufunc(tx, np.maximum, [r, lo], {})
    if hi is not None and not (isinstance(hi, V.Value) and hi.is_const() and hi.const() is None):
        r = apply_ufunc(tx, np.minimum, [r, hi], {})
    return r


def np_round(tx, a, decimals=0, out=None):
    _no_out(out)
    a = as_array(tx, a)
    d = k(decimals)
    if a.dtype.kind not in "f":
        raise Unsupported("K0301", "np.round of non-float arrays")
    t = method(tx, "round", a.tensor, decimals=d) if d else method(tx, "round", a.tensor)
    return NdarrayValue(t, scalar=True)


# --- products --------------------------------------------------------------------------------
@V.rule(name="numpy_matmul")
def matmul(tx, a, b):
    np = np_module()
    a, b = as_array(tx, a), as_array(tx, b)
    if a.ndim == 0 or b.ndim == 0:
        raise Unsupported("K0304", "matmul of a 0-d array (NumPy raises)")
    r = np.result_type(a.dtype, b.dtype)
    if r.kind == "b":
        raise Unsupported("K0301", "matmul of bool arrays")
    t = op(tx, torch.matmul, cast(tx, a, r).tensor, cast(tx, b, r).tensor)
    return NdarrayValue(t, scalar=True)


def np_matmul(tx, x1, x2, out=None, **kw):
    _no_out(out)
    if kw:
        raise Unsupported("K0301", f"np.matmul with {sorted(kw)}")
    return matmul(tx, x1, x2)


def np_dot(tx, a, b, out=None):
    _no_out(out)
    np = np_module()
    a, b = as_array(tx, a), as_array(tx, b)
    if a.ndim == 0 or b.ndim == 0:
        return apply_ufunc(tx, np.multiply, [a, b], {})
    if a.ndim > 2 or b.ndim > 2:
        raise Unsupported("K0301", "np.dot of arrays of more than 2 dims")
    return matmul(tx, a, b)


def np_outer(tx, a, b, out=None):
    _no_out(out)
    np = np_module()
    a, b = as_array(tx, a), as_array(tx, b)
    r = np.result_type(a.dtype, b.dtype)
    ta = method(tx, "reshape", cast(tx, a, r).tensor, (-1, 1))
    tb = method(tx, "reshape", cast(tx, b, r).tensor, (1, -1))
    return NdarrayValue(op(tx, torch.mul, ta, tb))


def np_einsum(tx, subscripts, *operands, out=None, optimize=False, **kw):
    _no_out(out)
    if kw:
        raise Unsupported("K0301", f"np.einsum with {sorted(kw)}")
    np = np_module()
    arrs = [as_array(tx, o) for o in operands]
    r = np.result_type(*[a.dtype for a in arrs])
    ts = [cast(tx, a, r).tensor for a in arrs]
    return NdarrayValue(op(tx, torch.einsum, C(k(subscripts)), *ts), scalar=True)


def np_trace(tx, a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
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


def np_factory(fn, default="float64"):
    def rule(tx, shape, dtype=None, order="C", *, device=None, like=None):
        if k(order) != "C" or k(like) is not None or k(device) not in (None, "cpu"):
            raise Unsupported("K0301", "a NumPy factory with order=, like= or device=")
        dt = torch_dtype(_dtype_or(dtype, default))
        return NdarrayValue(op(tx, fn, C(_shape_arg(shape)), dtype=dt, device=numpy_device()))
    return rule


def np_full(tx, shape, fill_value, dtype=None, order="C", *, device=None, like=None):
    np = np_module()
    fv = k(fill_value)
    dt = np.dtype(k(dtype)) if k(dtype) is not None else np.asarray(fv).dtype
    return NdarrayValue(op(tx, torch.full, C(_shape_arg(shape)), C(_py(fv)), dtype=torch_dtype(dt), device=numpy_device()))


def np_like(fn):
    def rule(tx, a, dtype=None, order="K", subok=True, shape=None, *, device=None):
        a = as_array(tx, a)
        dt = torch_dtype(_dtype_or(dtype, a.dtype))
        s = a.shape if k(shape) is None else _shape_arg(shape)
        return NdarrayValue(op(tx, fn, C(s), dtype=dt, device=a.tensor.fake.device))
    return rule


def np_full_like(tx, a, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None):
    a = as_array(tx, a)
    dt = torch_dtype(_dtype_or(dtype, a.dtype))
    s = a.shape if k(shape) is None else _shape_arg(shape)
    return NdarrayValue(op(tx, torch.full, C(s), C(_py(k(fill_value))), dtype=dt, device=a.tensor.fake.device))


def np_folded(np_name):
    """A creation function of constants: NumPy computes it, the graph holds the values."""
    def rule(tx, *args, **kwargs):
        np = np_module()
        fn = functools.reduce(getattr, np_name.split("."), np)
        res = fn(*[k(a) for a in args], **{n: k(v) for n, v in kwargs.items()})
        if isinstance(res, tuple):
            return V.TupleValue([constant_array(tx, r) for r in res])
        return constant_array(tx, res)
    return rule


def np_array(tx, obj, dtype=None, *, copy=True, order="K", subok=False, ndmin=0, like=None):
    if k(ndmin) or k(like) is not None or k(order) not in ("K", "A", "C"):
        raise Unsupported("K0301", "np.array with ndmin=, like= or order=")
    d = k(dtype)
    np = np_module()
    if isinstance(obj, NdarrayValue):
        if k(copy) is False and (d is None or np.dtype(d) == obj.dtype):
            return obj
        return NdarrayValue(cast(tx, obj, obj.dtype if d is None else np.dtype(d), copy=True).tensor)
    return as_array(tx, obj, None if d is None else np.dtype(d))


def np_asarray(tx, a, dtype=None, order=None, *, device=None, copy=None, like=None):
    d = k(dtype)
    if isinstance(a, NdarrayValue):
        r = a if d is None else cast(tx, a, np_module().dtype(d))
        return NdarrayValue(r.tensor) if r.scalar else r
    return as_array(tx, a, None if d is None else np_module().dtype(d))


def np_astype(tx, a, dtype, order="K", casting="unsafe", subok=True, copy=True):
    if k(casting) != "unsafe":
        raise Unsupported("K0301", "astype with casting=")
    np = np_module()
    return NdarrayValue(cast(tx, a, np.dtype(k(dtype)), copy=bool(k(copy))).tensor)


def np_copy(tx, a, order="K", subok=False):
    a = as_array(tx, a)
    return NdarrayValue(method(tx, "clone", a.tensor))


def np_meshgrid(tx, *xi, copy=True, sparse=False, indexing="xy"):
    if k(sparse) or not k(copy):
        raise Unsupported("K0301", "np.meshgrid with sparse=True or copy=False")
    arrs = [as_array(tx, x) for x in xi]
    ts = [method(tx, "reshape", a.tensor, -1) for a in arrs]
    grids = op(tx, torch.meshgrid, *ts, indexing=k(indexing)).unpack(tx)
    return V.TupleValue([NdarrayValue(method(tx, "contiguous", g)) for g in grids])


def _scalar_type(tx, cls, args, kwargs):
    """``np.float32(x)``: a constant folds; an array is cast (a scalar when 0-d)."""
    np = np_module()
    if kwargs or len(args) > 1:
        raise Unsupported("K0301", f"np.{cls.__name__} with these arguments")
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
