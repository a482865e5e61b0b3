"""NumPy ufuncs and Python operators on ndarrays, as torch ops with NumPy's dtypes.

NumPy decides a ufunc's loop (the dtype each operand is cast to, and the result's)
from the operands' dtypes, with Python scalars weak (NEP 50): ``ufunc.resolve_dtypes``
answers exactly that, so kiln asks NumPy itself. The operands are cast to the loop's
input dtypes, the torch op runs, and its result is cast to the loop's output dtype
where torch's own promotion differs (``int / int`` is float32 in torch). A ufunc whose
result is 0-d gives a NumPy scalar, as in NumPy.
"""
from __future__ import annotations

import operator

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.numpy_values import NdarrayValue, check_writable, np_module, torch_dtype


def _table():
    np = np_module()
    unary = {
        np.negative: torch.neg, np.positive: torch.positive, np.absolute: torch.abs,
        np.fabs: torch.abs, np.sign: torch.sgn, np.sqrt: torch.sqrt, np.square: torch.square,
        np.exp: torch.exp, np.exp2: torch.exp2, np.expm1: torch.expm1, np.log: torch.log,
        np.log2: torch.log2, np.log10: torch.log10, np.log1p: torch.log1p,
        np.sin: torch.sin, np.cos: torch.cos, np.tan: torch.tan, np.arcsin: torch.asin,
        np.arccos: torch.acos, np.arctan: torch.atan, np.sinh: torch.sinh,
        np.cosh: torch.cosh, np.tanh: torch.tanh, np.arcsinh: torch.asinh,
        np.arccosh: torch.acosh, np.arctanh: torch.atanh, np.floor: torch.floor,
        np.ceil: torch.ceil, np.trunc: torch.trunc, np.rint: torch.round,
        np.reciprocal: torch.reciprocal, np.isnan: torch.isnan, np.isinf: torch.isinf,
        np.isfinite: torch.isfinite, np.logical_not: torch.logical_not,
        np.invert: torch.bitwise_not, np.signbit: torch.signbit, np.deg2rad: torch.deg2rad,
        np.rad2deg: torch.rad2deg, np.degrees: torch.rad2deg, np.radians: torch.deg2rad,
        np.conjugate: torch.conj_physical,
    }
    binary = {
        np.add: torch.add, np.subtract: torch.sub, np.multiply: torch.mul,
        np.true_divide: torch.div, np.floor_divide: torch.floor_divide,
        np.remainder: torch.remainder, np.fmod: torch.fmod, np.power: torch.pow,
        np.maximum: torch.maximum, np.minimum: torch.minimum, np.fmax: torch.fmax,
        np.fmin: torch.fmin, np.arctan2: torch.atan2, np.hypot: torch.hypot,
        np.logaddexp: torch.logaddexp, np.logaddexp2: torch.logaddexp2,
        np.copysign: torch.copysign, np.bitwise_and: torch.bitwise_and,
        np.bitwise_or: torch.bitwise_or, np.bitwise_xor: torch.bitwise_xor,
        np.left_shift: torch.bitwise_left_shift, np.right_shift: torch.bitwise_right_shift,
        np.logical_and: torch.logical_and, np.logical_or: torch.logical_or,
        np.logical_xor: torch.logical_xor, np.equal: torch.eq, np.not_equal: torch.ne,
        np.less: torch.lt, np.less_equal: torch.le, np.greater: torch.gt,
        np.greater_equal: torch.ge,
    }
    return unary, binary


_TABLES = None


def tables():
    global _TABLES
    if _TABLES is None:
        _TABLES = _table()
    return _TABLES


# torch functions that take a Python number for their second operand
_TAKES_SCALARS = {torch.add, torch.sub, torch.mul, torch.div, torch.floor_divide, torch.remainder,
                  torch.fmod, torch.pow, torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge,
                  torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor}


def is_ufunc(fn) -> bool:
    unary, binary = tables()
    return fn in unary or fn in binary


# Python operators -> the ufunc NumPy's ndarray dunders call
def operator_ufuncs():
    np = np_module()
    return {
        operator.add: np.add, operator.sub: np.subtract, operator.mul: np.multiply,
        operator.truediv: np.true_divide, operator.floordiv: np.floor_divide,
        operator.mod: np.remainder, operator.pow: np.power, operator.and_: np.bitwise_and,
        operator.or_: np.bitwise_or, operator.xor: np.bitwise_xor,
        operator.lshift: np.left_shift, operator.rshift: np.right_shift,
        operator.lt: np.less, operator.le: np.less_equal, operator.eq: np.equal,
        operator.ne: np.not_equal, operator.gt: np.greater, operator.ge: np.greater_equal,
        operator.neg: np.negative, operator.pos: np.positive, operator.invert: np.invert,
        operator.abs: np.absolute,
    }


def operand(tx, v):
    """An ufunc operand: an NdarrayValue, or a constant (Python or NumPy scalar, or a
    constant array made from a list)."""
    if isinstance(v, NdarrayValue):
        return v
    if isinstance(v, V.TensorValue):
        raise Unsupported("K0306", "a NumPy operation mixing an ndarray and a torch.Tensor")
    if isinstance(v, (V.ListValue, V.TupleValue)):
        return V.rules.array_from_sequence(tx, v, None)
    if v.is_const():
        c = v.const()
        np = np_module()
        if type(c) in (bool, int, float, complex) or isinstance(c, np.generic):
            return v
        if isinstance(c, np.ndarray):
            return V.rules.constant_array(tx, c)
    raise Unsupported("K0301", f"{v} as an operand of a NumPy operation")


def _loop_key(v):
    np = np_module()
    if isinstance(v, NdarrayValue):
        return v.dtype
    c = v.const()
    if isinstance(c, np.generic):
        return c.dtype
    if type(c) is bool:
        return np.dtype(bool)
    return type(c)


def _torch_arg(v, dtype, np):
    """``v`` as the torch op takes it, cast to the loop dtype ``dtype``."""
    if isinstance(v, NdarrayValue):
        return v
    c = v.const()
    if isinstance(c, np.generic):
        c = c.item()
    if dtype.kind in "iu" and type(c) is int:
        info = np.iinfo(dtype)
        if not info.min <= c <= info.max:
            raise Unsupported("K0304", f"Python int {c} out of bounds for {dtype} (NumPy raises)")
    return V.ConstantValue(c)


def apply_ufunc(tx, uf, args, kwargs):
    np = np_module()
    unary, binary = tables()
    torch_fn = unary.get(uf) or binary.get(uf)
    if torch_fn is None:
        raise Unsupported("K0301", f"NumPy ufunc {uf.__name__} is not traced")
    extra = {k: v for k, v in kwargs.items() if not (k == "out" and v.is_const() and v.const() is None)}
    if extra:
        raise Unsupported("K0301", f"np.{uf.__name__} with {sorted(extra)}")
    if len(args) != uf.nin:
        raise Unsupported("K0301", f"np.{uf.__name__} with {len(args)} operands")
    ops = [operand(tx, a) for a in args]
    if not any(isinstance(o, NdarrayValue) for o in ops):
        from kiln.capture.operators import fold
        from kiln.capture.builder import wrap_static

        return wrap_static(fold(uf, *[o.const() for o in ops]))
    try:
        loop = uf.resolve_dtypes(tuple(_loop_key(o) for o in ops) + (None,))
    except Exception as e:  # noqa: BLE001 -- no loop for these dtypes: NumPy raises
        raise Unsupported("K0304", f"np.{uf.__name__}: {e}")
    ins, out_dt = loop[:uf.nin], loop[-1]
    targs = []
    for i, (o, dt) in enumerate(zip(ops, ins)):
        a = _torch_arg(o, dt, np)
        if isinstance(a, NdarrayValue):
            a = cast(tx, a, dt).tensor
        elif i == 0 or torch_fn not in _TAKES_SCALARS:  # a 0-d tensor of the loop dtype
            dev = next(o.tensor.fake.device for o in ops if isinstance(o, NdarrayValue))
            a = tx.output.op("call_function", torch.scalar_tensor, [a], {"dtype": V.ConstantValue(torch_dtype(dt)),
                                                                       "device": V.ConstantValue(dev)})
        targs.append(a)
    if uf is np.sign and ins[0].kind == "c":
        raise Unsupported("K0301", "np.sign of complex values")
    if uf is np.power and ins[0].kind in "iu" and not _nonnegative_constant(ops[1]):
        raise Unsupported("K0304", "an integer power whose exponent may be negative (NumPy raises)")
    if uf in (np.floor_divide, np.remainder, np.fmod) and ins[1].kind in "iub":
        return NdarrayValue(_int_division(tx, torch_fn, targs, torch_dtype(out_dt)), scalar=True)
    res = tx.output.op("call_function", torch_fn, targs, {})
    if uf is np.sign and ins[0].kind == "f":  # NumPy's sign(nan) is nan, torch's 0
        nan = tx.output.op("call_function", torch.isnan, [targs[0]], {})
        res = tx.output.op("call_function", torch.where, [nan, targs[0], res], {})
    res = _to_dtype(tx, res, torch_dtype(out_dt))
    return NdarrayValue(res, scalar=True)


def _nonnegative_constant(v) -> bool:
    return not isinstance(v, NdarrayValue) and v.is_const() and v.const() >= 0


def _int_division(tx, torch_fn, targs, dt):
    """Integer ``//``, ``%`` and ``fmod``: NumPy gives 0 for a zero divisor (with a
    warning) where torch raises; a zero divisor is replaced by 1 and its result by 0."""
    a, b = targs
    if isinstance(b, V.ConstantValue):
        if b.value == 0:
            raise Unsupported("K0304", "integer division by a constant zero")
        return _to_dtype(tx, tx.output.op("call_function", torch_fn, [a, b], {}), dt)
    zero = tx.output.op("call_function", torch.eq, [b, V.ConstantValue(0)], {})
    safe = tx.output.op("call_function", torch.where, [zero, V.ConstantValue(1), b], {})
    q = tx.output.op("call_function", torch_fn, [a, safe], {})
    q = tx.output.op("call_function", torch.where, [zero, V.ConstantValue(0), q], {})
    return _to_dtype(tx, q, dt)


def _to_dtype(tx, tv, dt):
    if tv.fake.dtype == dt:
        return tv
    return tx.output.op("call_method", "to", [tv, V.ConstantValue(dt)], {})


def cast(tx, a: NdarrayValue, np_dtype, copy=False) -> NdarrayValue:
    dt = torch_dtype(np_dtype)
    if a.tensor.fake.dtype == dt and not copy:
        return a
    t = tx.output.op("call_method", "to", [a.tensor, V.ConstantValue(dt)],
                     {"copy": V.ConstantValue(True)} if copy else {})
    return NdarrayValue(t, a.scalar)


@V.rule(name="numpy_binary")
def binary(tx, fn, a, b, inplace):
    """``a <op> b`` (``a <op>= b``) with an ndarray on either side."""
    uf = operator_ufuncs().get(fn)
    if fn is operator.matmul:
        res = V.rules.numpy_matmul(tx, a, b)
    elif uf is None:
        raise Unsupported("K0301", f"operator {fn.__name__} on an ndarray")
    else:
        res = apply_ufunc(tx, uf, [a, b], {})
    if inplace and isinstance(a, NdarrayValue) and not a.scalar:
        return write_into(tx, a, res)
    return res


def write_into(tx, a: NdarrayValue, res: NdarrayValue) -> NdarrayValue:
    """``a[...] = res`` for an in-place operator, with NumPy's ``same_kind`` check."""
    np = np_module()
    if not np.can_cast(res.dtype, a.dtype, casting="same_kind"):
        raise Unsupported("K0304", f"in-place operator casting {res.dtype} to {a.dtype} (NumPy raises)")
    check_writable(tx, a)
    if tuple(res.shape) != tuple(a.shape):
        raise Unsupported("K0301", "an in-place operator whose result broadcasts to a new shape")
    tx.output.op("call_method", "copy_", [a.tensor, res.tensor], {})
    return a


@V.rule(name="numpy_compare")
def compare(tx, fn, a, b):
    return apply_ufunc(tx, operator_ufuncs()[fn], [a, b], {})


@V.rule(name="numpy_unary")
def unary(tx, fn, v):
    if fn is operator.not_:
        raise Unsupported("K0006", "`not` on an ndarray (data-dependent)")
    return apply_ufunc(tx, operator_ufuncs()[fn], [v], {})

