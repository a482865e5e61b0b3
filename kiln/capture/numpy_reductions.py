"""NumPy reductions (sum, mean, var, max, argmax, cumsum, median, sort) as torch
reductions, in the dtype NumPy returns (``sample_dtype``): ``np.sum`` of int32 is int64,
``np.mean`` of ints float64; ``axis=()`` reduces nothing; a 0-d result is a NumPy scalar."""
from __future__ import annotations

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.numpy_rules import C, _axes, _no_out, as_array, k, method, op, sample_dtype
from kiln.capture.numpy_ufuncs import cast
from kiln.capture.numpy_values import NdarrayValue, check_writable, np_module, torch_dtype


# --- reductions ----------------------------------------------------------------------------
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


def np_sum(tx, a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _no_out(out, where)
    if k(initial) is not None:
        raise Unsupported("K0301", "np.sum with initial=")
    np = np_module()
    return _reduce(tx, np.sum, a, axis, keepdims, lambda t, d, kd, r: method(
        tx, "sum", t, list(d), keepdim=kd, dtype=r) if d else method(tx, "sum", t, dtype=r), dtype)


def np_prod(tx, a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _no_out(out, where)
    if k(initial) is not None:
        raise Unsupported("K0301", "np.prod with initial=")
    np = np_module()
    return _reduce(tx, np.prod, a, axis, keepdims,
                   lambda t, d, kd, r: _per_dim(tx, "prod", method(tx, "to", t, r), d, kd), dtype)


def np_mean(tx, a, axis=None, dtype=None, out=None, keepdims=False, where=None):
    _no_out(out, where)
    np = np_module()
    return _reduce(tx, np.mean, a, axis, keepdims, lambda t, d, kd, r: method(
        tx, "mean", method(tx, "to", t, r), list(d), keepdim=kd), dtype)


def np_var_like(name, np_name):
    def rule(tx, a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None, mean=None,
             correction=None):
        _no_out(out, where)
        if k(mean) is not None or k(correction) is not None:
            raise Unsupported("K0301", f"np.{np_name} with mean= or correction=")
        np = np_module()
        dd = k(ddof)
        return _reduce(tx, getattr(np, np_name), a, axis, keepdims, lambda t, d, kd, r: method(
            tx, name, method(tx, "to", t, r), list(d), correction=dd, keepdim=kd), dtype, ddof=dd)
    return rule


def np_minmax(name, np_name):
    def rule(tx, a, axis=None, out=None, keepdims=False, initial=None, where=None):
        _no_out(out, where)
        if k(initial) is not None:
            raise Unsupported("K0301", f"np.{np_name} with initial=")
        np = np_module()
        aa = as_array(tx, a)
        if 0 in aa.shape:
            raise Unsupported("K0304", f"np.{np_name} of an empty array (NumPy raises)")
        return _reduce(tx, getattr(np, np_name), aa, axis, keepdims,
                       lambda t, d, kd, r: method(tx, name, t, list(d), keepdim=kd))
    return rule


def np_allany(name):
    def rule(tx, a, axis=None, out=None, keepdims=False, where=None):
        _no_out(out, where)
        np = np_module()
        return _reduce(tx, getattr(np, name), a, axis, keepdims,
                       lambda t, d, kd, r: method(tx, name, t, d, keepdim=kd))
    return rule


def np_arg(name):
    def rule(tx, a, axis=None, out=None, keepdims=False):
        _no_out(out)
        np = np_module()
        a = as_array(tx, a)
        ax, kd = k(axis), bool(k(keepdims))
        if 0 in a.shape:
            raise Unsupported("K0304", f"np.{name} of an empty array (NumPy raises)")
        if ax is None:
            t = method(tx, name, method(tx, "reshape", a.tensor, -1), 0)
            if kd:
                t = method(tx, "reshape", t, (1,) * a.ndim)
        else:
            t = method(tx, name, a.tensor, _axes(ax, a.ndim)[0], keepdim=kd)
        del np
        return NdarrayValue(t, scalar=True)
    return rule


def np_cum(name):
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


def np_median(tx, a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """The middle of the sorted values (the mean of the two middle ones for an even
    count), NaN where the values hold one, as NumPy's median."""
    _no_out(out)
    np = np_module()
    a = as_array(tx, a)
    ax, kd = k(axis), bool(k(keepdims))
    if a.dtype.kind != "f" or not (ax is None or isinstance(ax, int)) or 0 in a.shape:
        raise Unsupported("K0301", "np.median other than of floats along one axis or all")
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


def np_sort(tx, a, axis=-1, kind=None, order=None, *, stable=None):
    """Sorted values (which sort NumPy uses does not change them; NaN last in both)."""
    if k(order) is not None:
        raise Unsupported("K0301", "np.sort with order=")
    a = as_array(tx, a)
    ax = k(axis)
    if a.dtype.kind == "c":
        raise Unsupported("K0301", "sorting complex values")
    t, ax = (method(tx, "reshape", a.tensor, -1), 0) if ax is None else (a.tensor, ax)
    return NdarrayValue(op(tx, torch.sort, t, dim=ax, stable=True).unpack(tx)[0])


def np_argsort(tx, a, axis=-1, kind=None, order=None, *, stable=None):
    """Only a stable argsort: NumPy's default quicksort orders ties its own way."""
    if k(kind) != "stable" and k(stable) is not True:
        raise Unsupported("K0301", "np.argsort other than kind='stable' (ties would differ)")
    a = as_array(tx, a)
    if a.dtype.kind == "c" or k(order) is not None:
        raise Unsupported("K0301", "argsort of complex values or with order=")
    ax = k(axis)
    t, ax = (method(tx, "reshape", a.tensor, -1), 0) if ax is None else (a.tensor, ax)
    return NdarrayValue(op(tx, torch.argsort, t, dim=ax, stable=True))


def np_m_sort(tx, a, axis=-1, kind=None, order=None, *, stable=None):
    check_writable(tx, a)
    s = np_sort(tx, a, axis, kind, order)
    method(tx, "copy_", a.tensor, s.tensor)
    return V.ConstantValue(None)
