"""NumPy arrays during a trace: an ndarray is a tensor with NumPy's semantics.

An ``NdarrayValue`` holds the ``TensorValue`` computing its data; everything done to it
(operators, indexing, ``np.*`` calls, methods) follows NumPy's rules and is recorded as
torch ops on that tensor (``numpy_ufuncs.py``, ``numpy_rules.py``). At the boundary an
ndarray argument is read through ``torch.from_numpy`` (the graph input shares its
memory, so in-place writes reach the caller's array) and a result is handed back with
``Tensor.numpy`` (a NumPy scalar where NumPy returns one: ufunc and reduction results
that are 0-d). ``Tensor.numpy()`` and ``torch.from_numpy`` inside the trace change the
value's kind, not its data.

``maybe_wrap`` is the builder's door: it turns NumPy objects (arrays, scalars, dtypes,
NumPy callables) into Values, or answers None for anything else.
"""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import torch

from kiln import config
from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.sources import Source

_NP_TO_TORCH_NAMES = {
    "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "float16": torch.float16,
    "float32": torch.float32, "float64": torch.float64, "complex64": torch.complex64,
    "complex128": torch.complex128,
}
_TORCH_TO_NP_NAMES = {t: n for n, t in _NP_TO_TORCH_NAMES.items()}


def np_module():
    import numpy

    return numpy


def torch_dtype(np_dtype) -> torch.dtype:
    """The torch dtype holding NumPy's ``np_dtype`` (native byte order only)."""
    np = np_module()
    d = np.dtype(np_dtype)
    t = _NP_TO_TORCH_NAMES.get(d.name) if d.isnative else None
    if t is None:
        raise Unsupported("K0302", f"NumPy dtype {d} has no torch counterpart kiln traces")
    return t


def numpy_dtype(t: torch.dtype):
    name = _TORCH_TO_NP_NAMES.get(t)
    if name is None:
        raise Unsupported("K0306", f"a tensor of {t} has no NumPy dtype")
    return np_module().dtype(name)


def numpy_device() -> torch.device:
    """Where a trace keeps NumPy's arrays: the CPU, or CUDA inside a
    ``torch.device("cuda")`` block (the FAQ's way to run NumPy code on the GPU: inputs
    are moved there in the graph, results come back to the CPU). Other default devices
    (``meta``) do not apply to NumPy. The block is part of the guarded global state."""
    d = torch.get_default_device()
    return d if d.type == "cuda" else torch.device("cpu")


@V.kind
class NdarrayValue(V.Value):
    """An ndarray (``scalar``: a NumPy scalar, NumPy's answer for a 0-d ufunc or
    reduction result) computed by ``tensor``. Under ``kiln.wrap_numpy`` the same values
    come from and go back to tensors."""

    readonly = False  # NumPy refuses writes into it (and into its views)

    def __init__(self, tensor: V.TensorValue, scalar: bool = False, source=None):
        self.tensor = tensor
        self.scalar = bool(scalar) and tensor.fake.dim() == 0
        self.source = source

    @property
    def dtype(self):
        return numpy_dtype(self.tensor.fake.dtype)

    @property
    def shape(self) -> tuple:
        return tuple(int(s) for s in self.tensor.fake.shape)   # a symbolic size: fixed, guarded

    @property
    def ndim(self) -> int:
        return self.tensor.fake.dim()

    def python_type(self):
        return self.dtype.type if self.scalar else np_module().ndarray

    def getattr(self, tx, name):
        return V.rules.ndarray_attribute(tx, self, name)

    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)

    def getitem(self, tx, key):
        return V.rules.ndarray_getitem(tx, self, key)

    def setitem(self, tx, key, value):
        if self.scalar:
            raise Unsupported("K0304", "item assignment on a NumPy scalar")
        V.rules.ndarray_setitem(tx, self, key, value)

    def contains(self, tx, item):
        raise Unsupported("K0006", "`in` on an ndarray (data-dependent)")

    def truth(self, tx):
        raise Unsupported("K0006", "truth value of an ndarray (data-dependent control flow)")

    def len_value(self, tx):
        if self.ndim == 0:
            from kiln.capture.errors import UserException

            raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue("len() of unsized object")]))
        return V.ConstantValue(self.shape[0])

    def unpack(self, tx):
        if self.ndim == 0:
            raise Unsupported("K0304", "iterating over a 0-d array")
        parts = tx.output.op("call_method", "unbind", [self.tensor], {}).unpack(tx)
        return [NdarrayValue(p, scalar=self.ndim == 1) for p in parts]

    # --- the boundary (codegen) ---------------------------------------------------------
    def referenced(self):
        return [self.tensor]

    def rebuild(self, cg):
        if self.source is not None:
            return cg.read(self.source)
        t = cg.expr(self.tensor)
        if getattr(self, "as_tensor", False):
            return t
        return f"{t}.numpy(force=True)" + ("[()]" if self.scalar else "")

    def __repr__(self):
        kind = "NumpyScalar" if self.scalar else "Ndarray"
        return f"{kind}({self.tensor.node.name}, {self.shape}, {self.dtype})"


def view(a: NdarrayValue, tv: V.TensorValue) -> NdarrayValue:
    """An ndarray viewing ``a``'s data: read-only where ``a`` is."""
    v = NdarrayValue(tv)
    v.readonly = a.readonly
    return v


def check_writable(tx, a: NdarrayValue):
    """NumPy raises for writes into a read-only array or a view of one (a read-only
    argument's views are found through their fake's ``_base``)."""
    fake = a.tensor.fake
    roots = getattr(tx.output, "numpy_readonly_roots", ())
    if a.readonly or a.scalar or id(fake) in roots or id(getattr(fake, "_base", None)) in roots:
        raise Unsupported("K0304", "writing into a read-only ndarray or a NumPy scalar (NumPy raises)")


def from_tensor(tv: V.TensorValue, scalar=False) -> NdarrayValue:
    numpy_dtype(tv.fake.dtype)  # a dtype NumPy has
    return NdarrayValue(tv, scalar)


def _from_numpy(tx, args, kwargs):
    if len(args) != 1 or kwargs or not isinstance(args[0], NdarrayValue) or args[0].scalar:
        raise Unsupported("K0306", "torch.from_numpy of something other than an ndarray")
    if args[0].tensor.fake.device.type != "cpu":  # eager's is the CPU array's memory
        raise Unsupported("K0306", "torch.from_numpy of an array kept on the GPU (a torch.device block)")
    return args[0].tensor


def _as_tensor(tx, args, kwargs):
    if len(args) != 1 or kwargs or not isinstance(args[0], NdarrayValue):
        return None
    if args[0].tensor.fake.device.type != "cpu":
        raise Unsupported("K0306", "torch.as_tensor of an array kept on the GPU (a torch.device block)")
    return args[0].tensor


def _tensor_copy(tx, args, kwargs):
    """``torch.tensor(array)``: a copy of the array's data (its dtype, the CPU)."""
    if len(args) != 1 or kwargs or not isinstance(args[0], NdarrayValue):
        return None
    if args[0].tensor.fake.device.type != "cpu":
        raise Unsupported("K0306", "torch.tensor of an array kept on the GPU (a torch.device block)")
    return tx.output.op("call_method", "clone", [args[0].tensor], {})


def _tensor_numpy(tx, args, kwargs):
    if len(args) != 1 or kwargs or not isinstance(args[0], V.TensorValue):
        raise Unsupported("K0306", "Tensor.numpy with force= (or not on a tensor)")
    f = args[0].fake
    if f.requires_grad or f.device.type != "cpu" or getattr(args[0], "cls", torch.Tensor) is not torch.Tensor:
        raise Unsupported("K0306", "Tensor.numpy() of a tensor that requires grad, is not on the CPU or is a subclass (eager raises)")
    return from_tensor(args[0])


# torch callables that take or make ndarrays: a change of kind, no graph node
TORCH_BRIDGE = {torch.from_numpy: _from_numpy, torch.as_tensor: _as_tensor, torch.tensor: _tensor_copy,
                torch.Tensor.numpy: _tensor_numpy}


def torch_bridge(tx, fn, args, kwargs):
    """``fn(*args)`` for a bridge callable, or None where the torch rule applies."""
    rule = TORCH_BRIDGE.get(fn)
    return rule(tx, args, kwargs) if rule is not None else None


class NumpyCallableValue(V.Value):
    """A NumPy function, ufunc, scalar type or ``np.random`` method: called through
    ``numpy_rules.call_numpy``; as an argument (a dtype) it is the constant itself."""

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def is_const(self):
        return True

    def const(self):
        return self.fn

    def call(self, tx, args, kwargs):
        return V.rules.call_numpy(tx, self.fn, args, kwargs)

    def getattr(self, tx, name):
        from kiln.capture.builder import wrap_static

        if name in ("__name__", "__qualname__", "__module__"):
            return V.ConstantValue(getattr(self.fn, name, None))
        try:
            return wrap_static(getattr(self.fn, name))
        except AttributeError:
            raise Unsupported("K0301", f"attribute {name!r} of {self.fn!r}")

    def __repr__(self):
        return f"Numpy({getattr(self.fn, '__name__', self.fn)})"


@dataclass(frozen=True)
class NumpyTensorSource(Source):
    """The tensor view of an ndarray argument: ``from_numpy`` (shared memory)."""

    base: Source
    fn: str  # the name of ``as_tensor`` in the entry namespace

    def expr(self):
        return f"{self.fn}({self.base.expr()})"

    def pretty(self):
        return f"from_numpy({self.base.pretty()})"


def as_tensor(a):
    """``torch.from_numpy`` without its warning for read-only arrays (the guards took
    ``writeable`` into account: the graph never writes one)."""
    if not a.flags.writeable:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.from_numpy(a)
    return torch.from_numpy(a)


def array_traceable(a) -> bool:
    """``a`` is a plain ndarray that ``from_numpy`` takes (no negative or misaligned
    strides)."""
    if type(a) is not np_module().ndarray:
        return False
    size = a.dtype.itemsize
    return all(s >= 0 and s % size == 0 for s in a.strides)


def array_matches(a, ndarray, dtype, shape, strides, writeable) -> bool:
    """The one guard of an ndarray argument: what the trace assumed of it (strides as
    traced are non-negative and aligned, so ``from_numpy`` takes it)."""
    return (type(a) is ndarray and a.dtype == dtype and a.shape == shape and a.strides == strides
            and a.flags.writeable is writeable)


def _wrap_array(tx, arr, source):
    if source is None:
        raise Unsupported("K0302", "an ndarray kiln cannot re-read at run time (no source)")
    if type(arr) is not np_module().ndarray:
        raise Unsupported("K0302", f"an ndarray subclass ({type(arr).__qualname__})")
    known = tx.output.known_value(arr, source)
    if known is not None:
        return known
    torch_dtype(arr.dtype)  # object, string, datetime, uint16… dtypes: Unsupported
    if not array_traceable(arr):
        raise Unsupported("K0302", "an ndarray with negative or misaligned strides")
    g = tx.output.guards
    e = source.expr()
    w = bool(arr.flags.writeable)
    tsrc = NumpyTensorSource(source, g.const(as_tensor, "np_tensor"))
    first = len(g.guards)
    tv = tx.output.input_tensor(as_tensor(arr), tsrc)
    g.drop_since(first)  # the tensor's own guards: implied by the array's one
    dev = numpy_device()
    if dev.type != "cpu":
        tv = tx.output.op("call_method", "to", [tv, V.ConstantValue(dev)], {})
    g.add(f"{g.const(array_matches, 'npok')}({e}, {g.const(type(arr), 'T')}, {g.const(arr.dtype, 'npdt')}, "
          f"{arr.shape!r}, {arr.strides!r}, {w})",
          f"{source.pretty()} is an ndarray of {arr.dtype}, shape {arr.shape}, strides {arr.strides}"
          f"{'' if w else ', read-only'}", f"type({e})")
    v = NdarrayValue(tv, source=source)
    if not arr.flags.writeable or dev.type != "cpu":  # (writes into a GPU copy would not reach it)
        v.readonly = True
        tx.output.__dict__.setdefault("numpy_readonly_roots", set()).add(id(tv.fake))
    return tx.output.remember(arr, v)


@V.rule(name="numpy_maybe_wrap")
def maybe_wrap(tx, obj, source):
    """The Value of a NumPy object, or None when ``obj`` is not one."""
    if "numpy" not in sys.modules or not config.trace_numpy:
        return None
    if type(obj) is types.FunctionType:
        found = V.rules.wrap_numpy_special_value(obj)
        if found is not None:
            return found
    t = type(obj)
    mod = getattr(t, "__module__", None) or ""
    if isinstance(obj, type):
        np = np_module()
        if issubclass(obj, np.generic) and obj.__module__ == "numpy" or obj in (np.finfo, np.iinfo, np.dtype):
            return NumpyCallableValue(obj, source)
        return None
    if not (mod.startswith("numpy") or callable(obj) and _is_numpy_callable(obj)):
        return None
    np = np_module()
    if t is np.ndarray or isinstance(obj, np.ndarray):
        if tx is None:
            raise Unsupported("K0302", "an ndarray kiln cannot re-read at run time (no source)")
        return _wrap_array(tx, obj, source)
    if isinstance(obj, (np.generic, np.dtype)):
        if isinstance(obj, np.generic) and obj.dtype.name not in _NP_TO_TORCH_NAMES:
            return None
        if tx is not None and source is not None:
            tx.output.guards.type_is(source, t)
            tx.output.guards.equal(source, obj)
        return V.ConstantValue(obj, source)
    if callable(obj) and _is_numpy_callable(obj):
        if tx is not None and source is not None and not _module_member_source(source):
            tx.output.guards.identity(source, obj)
        return NumpyCallableValue(obj, source)
    return None


def _module_member_source(source) -> bool:
    from kiln.capture.sources import AttrSource

    return isinstance(source, AttrSource)


_PLAIN_CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _is_numpy_callable(obj) -> bool:
    """A NumPy function, ufunc or ``np.random`` method; decided by the object's type
    first, so that no user ``__getattr__`` runs."""
    np = np_module()
    t = type(obj)
    if isinstance(obj, np.ufunc) or t.__name__ == "_ArrayFunctionDispatcher" and t.__module__ == "numpy":
        return True
    if isinstance(obj, _PLAIN_CALLABLES) or t.__name__ == "cython_function_or_method":
        mod = getattr(obj, "__module__", None)
        return isinstance(mod, str) and mod.split(".")[0] == "numpy"
    return False
