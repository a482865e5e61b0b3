"""NumPy calls in a trace: the rule tables, ndarray attributes, methods and indexing.

One rule per NumPy callable (``functions()``, built on first use: NumPy is imported
only by programs that use it); the rules live by family — ``numpy_ufuncs``,
``numpy_reductions``, ``numpy_shapes`` (shapes, products, creation), ``numpy_linalg``
(linalg, fft), ``numpy_random`` — and ndarray methods map to the same rules with the
array first (``methods()``). Result dtypes are NumPy's own: a rule asks NumPy for the
dtype its function returns on one-element samples of the operands' dtypes and ranks
(``sample_dtype``), then computes in that dtype. Anything without a rule, or with
arguments a rule does not model, is Unsupported (a graph break that runs NumPy).
"""
from __future__ import annotations

import functools
import operator

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.numpy_ufuncs import apply_ufunc, cast, is_ufunc
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


def C(x):
    return V.ConstantValue(x)


# --- arrays from constants and sequences ------------------------------------------------
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


class _TypeInfo(V.Value):
    """``np.finfo(...)`` / ``np.iinfo(...)``: constants read from the real object (its
    cached properties computed there: they depend on the dtype alone)."""

    def __init__(self, info):
        self.info = info

    def python_type(self):
        return type(self.info)

    def getattr(self, tx, name):
        from kiln.capture.builder import wrap_static
        from kiln.capture.operators import fold

        return wrap_static(fold(getattr, self.info, name))

    def rebuild(self, cg):
        return cg.ref(self.info, "info")


def _families():
    from kiln.capture import numpy_reductions, numpy_shapes

    return numpy_reductions, numpy_shapes


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


# --- attributes and methods ----------------------------------------------------------------
def ndarray_attribute(tx, a, name):
    R, S = _families()
    from kiln.capture.numpy_values import NdarrayValue as _N

    simple = {"shape": lambda: a.shape, "ndim": lambda: a.ndim, "dtype": lambda: a.dtype,
              "size": lambda: int(torch.Size(a.shape).numel()), "itemsize": lambda: a.dtype.itemsize,
              "nbytes": lambda: int(torch.Size(a.shape).numel()) * a.dtype.itemsize}
    if name in simple:
        return V.ConstantValue(simple[name]())
    if name == "T":
        return S.np_transpose(tx, a)
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
        raise Unsupported("K0301", f"ndarray attribute {name!r} is not traced")
    return _BoundRule(rule, a)


class _BoundRule(V.Value):
    def __init__(self, rule, a):
        self.rule = rule
        self.a = a

    def call(self, tx, args, kwargs):
        return self.rule(tx, self.a, *args, **kwargs)


def _m_reshape(tx, a, *shape, order="C", copy=None):
    R, S = _families()
    s = shape[0] if len(shape) == 1 else V.TupleValue(list(shape))
    return S.np_reshape(tx, a, s, order, copy=copy)


def _m_transpose(tx, a, *axes):
    R, S = _families()
    if not axes:
        return S.np_transpose(tx, a)
    return S.np_transpose(tx, a, axes[0] if len(axes) == 1 else V.TupleValue(list(axes)))


def _m_fill(tx, a, value):
    check_writable(tx, a)
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


def _not_traced(break_id, why):
    def rule(tx, *args, **kwargs):
        raise Unsupported(break_id, why)
    return rule


@functools.lru_cache(maxsize=1)
def functions():
    np = np_module()
    R, S = _families()
    table = {
        np.sum: R.np_sum, np.prod: R.np_prod, np.mean: R.np_mean, np.var: R.np_var_like("var", "var"),
        np.std: R.np_var_like("std", "std"), np.max: R.np_minmax("amax", "max"),
        np.amax: R.np_minmax("amax", "amax"), np.min: R.np_minmax("amin", "min"),
        np.amin: R.np_minmax("amin", "amin"), np.all: R.np_allany("all"), np.any: R.np_allany("any"),
        np.argmax: R.np_arg("argmax"), np.argmin: R.np_arg("argmin"), np.cumsum: R.np_cum("cumsum"),
        np.cumprod: R.np_cum("cumprod"), np.median: R.np_median,
        np.reshape: S.np_reshape, np.transpose: S.np_transpose, np.swapaxes: S.np_swapaxes,
        np.moveaxis: S.np_moveaxis, np.expand_dims: S.np_expand_dims, np.squeeze: S.np_squeeze,
        np.ravel: S.np_ravel, np.concatenate: S.np_concatenate, np.stack: S.np_stack, np.vstack: S.np_vstack,
        np.hstack: S.np_hstack, np.flip: S.np_flip, np.broadcast_to: S.np_broadcast_to, np.tile: S.np_tile,
        np.repeat: S.np_repeat, np.tril: S.np_tri("tril"), np.triu: S.np_tri("triu"), np.where: S.np_where,
        np.clip: S.np_clip, np.round: S.np_round, np.around: S.np_round, np.matmul: S.np_matmul, np.dot: S.np_dot,
        np.outer: S.np_outer, np.einsum: S.np_einsum, np.trace: S.np_trace, np.sort: R.np_sort,
        np.argsort: R.np_argsort, np.shape: _metadata("shape"), np.ndim: _metadata("ndim"),
        np.size: _metadata("size"),
        np.zeros: S.np_factory(torch.zeros), np.ones: S.np_factory(torch.ones),
        np.empty: S.np_factory(torch.empty), np.full: S.np_full,
        np.zeros_like: S.np_like(torch.zeros), np.ones_like: S.np_like(torch.ones),
        np.empty_like: S.np_like(torch.empty), np.full_like: S.np_full_like,
        np.arange: S.np_folded("arange"), np.linspace: S.np_folded("linspace"), np.eye: S.np_folded("eye"),
        np.identity: S.np_folded("identity"), np.logspace: S.np_folded("logspace"),
        np.array: S.np_array, np.asarray: S.np_asarray, np.copy: S.np_copy, np.meshgrid: S.np_meshgrid,
        np.fft.fftfreq: S.np_folded("fft.fftfreq"), np.fft.rfftfreq: S.np_folded("fft.rfftfreq"),
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
    R, S = _families()
    f = functions()
    table = {name: f[getattr(np, fn)] for name, fn in {
        "sum": "sum", "prod": "prod", "mean": "mean", "var": "var", "std": "std", "max": "max",
        "min": "min", "all": "all", "any": "any", "argmax": "argmax", "argmin": "argmin",
        "cumsum": "cumsum", "cumprod": "cumprod", "swapaxes": "swapaxes", "squeeze": "squeeze",
        "ravel": "ravel", "repeat": "repeat", "clip": "clip", "round": "round", "dot": "dot",
        "trace": "trace", "copy": "copy"}.items()}
    table.update({
        "reshape": _m_reshape, "transpose": _m_transpose, "astype": S.np_astype,
        "flatten": S.np_flatten, "fill": _m_fill, "sort": R.np_m_sort, "argsort": R.np_argsort,
        "conj": lambda tx, a: apply_ufunc(tx, np.conjugate, [a], {}),
        "conjugate": lambda tx, a: apply_ufunc(tx, np.conjugate, [a], {}),
        "__len__": lambda tx, a: a.len_value(tx),
        "item": _not_traced("K0007", "ndarray.item() needs the array's data"),
        "tolist": _not_traced("K0007", "ndarray.tolist() needs the array's data"),
        "nonzero": _not_traced("K0301", "ndarray.nonzero() has a data-dependent shape"),
    })
    return table


def call_numpy(tx, fn, args, kwargs):
    np = np_module()
    if is_ufunc(fn):
        return apply_ufunc(tx, fn, args, kwargs)
    if isinstance(fn, type):
        if issubclass(fn, np.generic):
            return _families()[1]._scalar_type(tx, fn, args, kwargs)
        if fn in (np.finfo, np.iinfo, np.dtype):
            from kiln.capture.operators import fold

            made = fold(fn, *[k(a) for a in args], **{n: k(v) for n, v in kwargs.items()})
            return V.ConstantValue(made) if fn is np.dtype else _TypeInfo(made)
    if any(isinstance(a, V.TensorValue) for a in list(args) + list(kwargs.values())):
        raise Unsupported("K0306", f"np.{getattr(fn, '__name__', fn)} called on a torch.Tensor")
    rule = functions().get(fn)
    if rule is None:
        from kiln.capture.numpy_random import random_rule

        rule = random_rule(fn)
    if rule is None:
        raise Unsupported("K0301", f"NumPy function {getattr(fn, '__module__', '')}.{getattr(fn, '__name__', fn)} is not traced")
    try:
        return rule(tx, *args, **kwargs)
    except TypeError as e:  # the rule's signature refused the call
        raise Unsupported("K0301", f"np.{getattr(fn, '__name__', fn)} with these arguments: {e}")

