"""NumPy in a trace: what the rule families share (operands as arrays, constants,
NumPy's own result dtypes, axes) and ndarray indexing. The tables of rules, one per
NumPy callable and ndarray method, are ``numpy_calls``; the rules live by family —
``numpy_ufuncs``, ``numpy_reductions``, ``numpy_shapes`` (shapes, products, creation),
``numpy_linalg`` (linalg, fft), ``numpy_random``. Result dtypes are NumPy's own: a rule
asks NumPy for the dtype its function returns on one-element samples of the operands'
dtypes and ranks (``sample_dtype``), then computes in that dtype.
"""
from __future__ import annotations

import functools
import operator

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.numpy_ufuncs import cast
from kiln.capture.numpy_values import (NdarrayValue, check_writable, np_module, numpy_device, torch_dtype,
                                       view)

_MAX_CONSTANT_ELEMENTS = 1 << 14  # larger constant arrays are not spelled into a graph


def k(v):
    """The constant behind a rule argument (a Value, or a Python default)."""
    if isinstance(v, V.Value):
        if isinstance(v, NdarrayValue):
            raise Unsupported("K0301", "an ndarray where NumPy takes a constant")
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


C = V.C


# --- arrays from constants and sequences ------------------------------------------------
@V.rule
def constant_array(tx, arr) -> NdarrayValue:
    np = np_module()
    arr = np.asarray(arr)
    if arr.size > _MAX_CONSTANT_ELEMENTS:
        raise Unsupported("K0302", f"a constant array of {arr.size} elements")
    t = op(tx, torch.tensor, C(arr.tolist()), dtype=torch_dtype(arr.dtype), device=numpy_device())
    return NdarrayValue(t)


def _is_const_tree(v) -> bool:
    if isinstance(v, (V.ListValue, V.TupleValue)):
        return all(_is_const_tree(i) for i in v.items)
    return not isinstance(v, NdarrayValue) and v.is_const()


def _const_tree(v):
    if isinstance(v, (V.ListValue, V.TupleValue)):
        return [_const_tree(i) for i in v.items]
    return v.const()


@V.rule
def array_from_sequence(tx, seq, dtype) -> NdarrayValue:
    np = np_module()
    if _is_const_tree(seq):
        try:
            return constant_array(tx, np.array(_const_tree(seq), dtype=dtype))
        except (TypeError, ValueError) as e:
            raise Unsupported("K0304", f"np.array of these constants: {e}")
    items = [as_array(tx, i) for i in seq.items]
    if len({i.shape for i in items}) != 1:
        raise Unsupported("K0301", "np.array of ragged items")
    dt = np.dtype(dtype) if dtype is not None else np.result_type(*[i.dtype for i in items])
    parts = [cast(tx, i, dt).tensor for i in items]
    return NdarrayValue(op(tx, torch.stack, V.ListValue(parts)))


def as_array(tx, v, dtype=None) -> NdarrayValue:
    """An array_like argument as an ndarray (``np.asarray``)."""
    np = np_module()
    if isinstance(v, NdarrayValue):
        return v if dtype is None else cast(tx, v, dtype)
    if isinstance(v, V.TensorValue):
        raise Unsupported("K0306", "a torch.Tensor passed to a NumPy function")
    if isinstance(v, (V.ListValue, V.TupleValue)):
        return array_from_sequence(tx, v, dtype)
    if v.is_const():
        c = v.const()
        if type(c) in (bool, int, float, complex) or isinstance(c, (np.generic, np.ndarray)):
            return constant_array(tx, np.asarray(c, dtype=dtype))
    raise Unsupported("K0301", f"{v} as an array")


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
        raise Unsupported("K0304", f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}")


def _py(c):
    np = np_module()
    return c.item() if isinstance(c, np.generic) else c


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    out = []
    for a in axis:
        if not -ndim <= a < max(ndim, 1):
            raise Unsupported("K0304", f"axis {a} out of bounds for {ndim}-d array (NumPy raises)")
        out.append(a % ndim if ndim else 0)
    return tuple(out)


def _no_out(out, where=None):
    if k(out) is not None:
        raise Unsupported("K0301", "a NumPy reduction with out=")
    if where is not None and k(where) is not True:
        raise Unsupported("K0301", "a NumPy reduction with where=")


# --- indexing ------------------------------------------------------------------------------
def _index_part(tx, v):
    if isinstance(v, NdarrayValue):
        if v.dtype.kind not in "iub":
            raise Unsupported("K0301", "indexing with a non-integer array")
        return v.tensor
    if isinstance(v, (V.ListValue,)):
        return V.ListValue([_index_part(tx, i) for i in v.items])
    c = v.const()
    np = np_module()
    if isinstance(c, slice) and c.step is not None and c.step < 0:
        raise Unsupported("K0303", "a slice with a negative step (torch has none)")
    if isinstance(c, np.integer):
        c = int(c)
    return C(c)


def _index_key(tx, key):
    parts = key.items if isinstance(key, V.TupleValue) else [key]
    conv = [_index_part(tx, p) for p in parts]
    return conv, parts


@V.rule
def ndarray_getitem(tx, a, key):
    if a.scalar:
        raise Unsupported("K0301", "indexing a NumPy scalar")
    conv, parts = _index_key(tx, key)
    k_arg = V.TupleValue(conv) if isinstance(key, V.TupleValue) else conv[0]
    t = tx.output.op("call_function", operator.getitem, [a.tensor, k_arg], {})
    all_ints = all(isinstance(p, V.ConstantValue) and type(p.value) is int for p in conv)
    if all_ints and len(conv) == a.ndim:
        return NdarrayValue(t, scalar=True)
    return view(a, t)


@V.rule
def ndarray_setitem(tx, a, key, value):
    check_writable(tx, a)
    conv, _ = _index_key(tx, key)
    k_arg = V.TupleValue(conv) if isinstance(key, V.TupleValue) else conv[0]
    if isinstance(value, NdarrayValue) or isinstance(value, (V.ListValue, V.TupleValue)):
        v = cast(tx, as_array(tx, value), a.dtype).tensor
    else:
        c = _py(k(value))
        if type(c) not in (bool, int, float) or (type(c) is float and a.dtype.kind in "iub"):
            raise Unsupported("K0301", "assigning this value into an ndarray")
        v = C(c)
    tx.output.op("call_function", operator.setitem, [a.tensor, k_arg, v], {})
