"""NumPy calls in a trace: the rule tables and ndarray attributes and methods.

One rule per NumPy callable (``functions()``, built on first use: NumPy is imported
only by programs that use it), taken from the families (``numpy_ufuncs``,
``numpy_reductions``, ``numpy_shapes``, ``numpy_linalg``, ``numpy_random``); ndarray
methods map to the same rules with the array first (``methods()``). Anything without a
rule, or with arguments a rule does not model, is Unsupported (a graph break that runs
NumPy). The top of the NumPy rules: it imports the families, none imports it.
"""
from __future__ import annotations

import functools

import torch

from kiln.capture import numpy_reductions, numpy_shapes
from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.numpy_rules import C, _const_tree, _py, as_array, k, method, op
from kiln.capture.numpy_ufuncs import apply_ufunc, is_ufunc
from kiln.capture.numpy_values import check_writable, np_module


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
    return numpy_reductions, numpy_shapes



# --- attributes and methods ----------------------------------------------------------------
@V.rule
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


@V.rule
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

