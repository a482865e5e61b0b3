"""Which PyTorch callables go into the graph, and how tensor attributes and methods
behave during a trace. One table per question.
"""
from __future__ import annotations

import math
import types

import torch

from kiln.capture import numpy_values
from kiln.capture import scalar_tensor_args
from kiln.capture import torch_helpers
from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.rule_tables import BUILTINS, CONST_FOLD

_GRAPH_MODULES = (
    "torch", "torch.functional", "torch.nn.functional", "torch._C._nn",
    "torch._C._fft", "torch._C._linalg", "torch._C._special", "torch._C._VariableFunctions",
    "torch.fft", "torch.linalg", "torch.special", "torch._tensor", "torch.nn.init",
    "torch._refs", "torch._C._TensorBase", "torch.overrides",
)

# Functions that change global state or need data: never traced into a graph.
_NEVER_IN_GRAPH_PREFIXES = ("set_", "manual_seed", "seed", "initial_seed", "save", "load",
                            "use_deterministic", "get_rng_state", "set_rng_state",
                            "_set_", "from_numpy", "as_tensor_from_numpy")


def _name(fn):
    return getattr(fn, "__name__", "") or ""


@V.rule
def is_torch_callable(obj) -> bool:
    """A callable defined by PyTorch that computes on tensors (not a class)."""
    if isinstance(obj, type) or not callable(obj):
        return False
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    mod = getattr(obj, "__module__", None)
    if mod is None and isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        self_ = getattr(obj, "__self__", None)
        mod = getattr(self_, "__name__", None) if isinstance(self_, types.ModuleType) else None
    if isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(obj, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor)
    if isinstance(obj, types.FunctionType) and obj.__qualname__.startswith("Tensor."):
        return True
    return isinstance(mod, str) and mod in _GRAPH_MODULES


def _const(value):
    return V.ConstantValue(value)


def _first(args, kwargs, *names):
    """The first argument, given by position or by one of its keyword ``names``
    (``torch.numel(input=x)``); a call missing it runs as Python (its TypeError)."""
    if args:
        return args[0]
    for n in names:
        if n in kwargs:
            return kwargs[n]
    raise Unsupported("K0042", f"a call without its {names[0]!r} argument")


def _fake_of(args, kwargs):
    v = _first(args, kwargs, "input")
    if not isinstance(v, V.TensorValue):
        raise Unsupported("K0042", f"a tensor query on {v}")
    return v.fake


def _is_tensor(tx, args, kwargs):
    return _const(isinstance(_first(args, kwargs), V.TensorValue))


def _grad_enabled(tx, args, kwargs):
    return _const(tx.output.grad_enabled)


def _set_grad_enabled(tx, args, kwargs):
    mode = _first(args, kwargs, "mode", "enabled").const()
    prev = tx.output.grad_enabled
    tx.output.set_grad_enabled(mode)
    return V.GradModeValue(mode, applied_from=prev)


def _numel(tx, args, kwargs):
    v = _first(args, kwargs, "input")
    if isinstance(v, V.TensorValue):
        sym = V.rules.symbolic_meta(tx, v, "numel", [], {})
        if sym is not None:
            return sym
    return _const(_fake_of(args, kwargs).numel())


# Evaluated at trace time to a Python constant (answers that a trace may assume).
CONST_FOLD.update({
    torch.is_tensor: _is_tensor,
    torch.is_grad_enabled: _grad_enabled,
    torch.numel: _numel,
    torch.is_floating_point: lambda tx, a, k: _const(_fake_of(a, k).is_floating_point()),
    torch.is_complex: lambda tx, a, k: _const(_fake_of(a, k).is_complex()),
    torch.get_default_dtype: lambda tx, a, k: _const(torch.get_default_dtype()),
    torch._C._get_tracing_state: lambda tx, a, k: _const(None),
    # library code asks whether TorchScript is scripting/tracing it: names read only to
    # answer False, for compatibility (DESIGN.md allows reading names); torch.jit is not used
    torch.jit.is_scripting: lambda tx, a, k: _const(False),
    torch.jit.is_tracing: lambda tx, a, k: _const(False),
    torch._C._is_tracing: lambda tx, a, k: _const(False),
    torch.set_grad_enabled: _set_grad_enabled,
    torch._C._set_grad_enabled: _set_grad_enabled,
    torch.is_inference_mode_enabled: lambda tx, a, k: _const(torch.is_inference_mode_enabled()),
    torch._C._log_api_usage_once: lambda tx, a, k: _const(None),
    # traced values are plain tensors: no __torch_function__ overrides to honour
    torch._C._has_torch_function: lambda tx, a, k: _const(False),
    torch._C._has_torch_function_unary: lambda tx, a, k: _const(False),
    torch._C._has_torch_function_variadic: lambda tx, a, k: _const(False),
    torch.overrides.has_torch_function: lambda tx, a, k: _const(False),
    # no dispatch mode surrounds the user's code while kiln traces it
    torch._C._len_torch_dispatch_stack: lambda tx, a, k: _const(0),
    torch.overrides.has_torch_function_unary: lambda tx, a, k: _const(False),
    torch.overrides.has_torch_function_variadic: lambda tx, a, k: _const(False),
    torch.cuda.is_available: lambda tx, a, k: _const(torch.cuda.is_available()),
    torch.are_deterministic_algorithms_enabled: lambda tx, a, k: _const(torch.are_deterministic_algorithms_enabled()),
})
CONST_FOLD.update(torch_helpers.QUERY_RULES)
# Library code asks these to pick compile-friendly paths: they read True while kiln
# traces (reading the names only, as DESIGN.md allows).
for _mod, _attr in ((torch.compiler, "is_compiling"), (torch.compiler, "is_dynamo_compiling")):
    if hasattr(_mod, _attr):
        CONST_FOLD[getattr(_mod, _attr)] = lambda tx, a, k: _const(True)
if hasattr(torch, "_utils") and hasattr(torch._utils, "is_compiling"):
    CONST_FOLD[torch._utils.is_compiling] = lambda tx, a, k: _const(True)


@V.rule
def call_torch_function(tx, fn, args, kwargs):
    if fn in numpy_values.TORCH_BRIDGE:  # from_numpy, Tensor.numpy: a change of kind
        bridged = numpy_values.torch_bridge(tx, fn, args, kwargs)
        if bridged is not None:
            return bridged
    rule = CONST_FOLD.get(fn)
    if rule is not None:
        return rule(tx, args, kwargs)
    name = _name(fn)
    if name.startswith(_NEVER_IN_GRAPH_PREFIXES) and not name.startswith("set_grad"):
        raise Unsupported("K0040", f"torch.{name} changes global state or needs data")
    if fn is torch.Tensor.item or name in _DATA_METHODS:
        raise Unsupported("K0007", f"Tensor.{name}() needs the tensor's data")
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)) or (
        isinstance(fn, types.FunctionType) and fn.__qualname__.startswith("Tensor.")
    ):
        # an unbound Tensor method called as a function: torch.Tensor.add(x, y)
        if args and isinstance(args[0], V.TensorValue):
            return tensor_method(tx, args[0], name, list(args[1:]), kwargs)
    return tx.output.op("call_function", fn, args, kwargs)


# --- tensor attributes and methods --------------------------------------------------

_DATA_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                 "backward", "register_hook", "data_ptr", "storage", "untyped_storage",
                 "__array__", "retain_grad", "__reduce_ex__", "__deepcopy__",
                 "_version", "cpu_", "record_stream", "share_memory_", "pin_memory"}

# Methods whose result is metadata: computed on the fake, no graph node.
_META_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "stride",
                 "is_contiguous", "element_size", "is_floating_point", "is_complex",
                 "get_device", "is_signed", "has_names",
                 "is_inference", "is_set_to", "__len__"}


@V.rule
def tensor_attribute(tx, tv, name):
    f = tv.fake
    if name in ("shape",):
        sym = V.rules.symbolic_meta(tx, tv, name, [], {})
        return sym if sym is not None else V.ConstantValue(torch.Size(f.shape))
    if name in ("requires_grad", "is_leaf", "grad_fn") and getattr(tx.output, "in_transform", False):
        raise Unsupported("K0036", f"Tensor.{name} inside a torch.func transform (it reports the transform's own tracking)")
    if name in ("dtype", "ndim", "requires_grad", "is_cuda", "is_sparse", "is_quantized",
                "is_meta", "is_leaf", "layout", "is_mkldnn", "is_nested", "itemsize", "nbytes",
                "is_cpu", "is_mps", "is_xpu"):
        if name == "is_meta":
            return V.ConstantValue(False)
        return V.ConstantValue(getattr(f, name))
    if name == "device":
        return V.ConstantValue(f.device)
    if name == "T":
        return tx.output.op("call_method", "permute", [tv, V.ConstantValue(tuple(reversed(range(f.dim()))))], {})
    if name == "mT":
        return tx.output.op("call_method", "transpose", [tv, V.ConstantValue(-2), V.ConstantValue(-1)], {})
    if name == "data":
        return tx.output.op("call_method", "detach", [tv], {})
    if name in ("real", "imag"):
        return tx.output.op("call_function", getattr(torch, name), [tv], {})
    if name == "grad_fn":
        if not f.requires_grad:
            return V.ConstantValue(None)
        raise Unsupported("K0039", "reading Tensor.grad_fn")
    if name == "grad":
        from kiln.capture.tensor_grads import read_grad

        return read_grad(tx, tv)
    if name == "__class__":
        return V.ClassValue(tv.python_type())
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        from kiln.capture.values import ExceptionValue, ConstantValue
        from kiln.capture.errors import UserException

        raise UserException(ExceptionValue(AttributeError, [ConstantValue(
            f"'Tensor' object has no attribute {name!r}")]))
    if callable(attr):
        return V.MethodValue(V.TorchFunctionValue(attr), tv)
    raise Unsupported("K0009", f"tensor attribute {name!r}")


@V.rule
def tensor_method(tx, tv, name, args, kwargs):
    if name == "__len__" and not args and not kwargs:  # as len(x): the first size
        return BUILTINS[len](tx, tv)
    if name in _DATA_METHODS:
        raise Unsupported("K0007", f"Tensor.{name}() needs the tensor's data")
    if name == "storage_offset":    # fakes do not carry it, and guards do not check it
        raise Unsupported("K0007", "Tensor.storage_offset() is read from the real tensor")
    if name in _META_METHODS:
        sym = V.rules.symbolic_meta(tx, tv, name, args, kwargs)
        if sym is not None:
            return sym
        try:
            fake_args = [a.const() for a in args]
            fake_kwargs = {k: v.const() for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported("K0011", f"Tensor.{name} with non-constant arguments")
        return V.ConstantValue(V.rules.concrete(getattr(tv.fake, name)(*fake_args, **fake_kwargs)))
    if name == "type":
        return _tensor_type(tx, tv, args, kwargs)
    if name in ("requires_grad_",):
        if _requires_grad_unchanged(tv, args, kwargs):
            return tv
        raise Unsupported("K0039", "Tensor.requires_grad_ inside a compiled region")
    if name == "__getattribute__":
        return tensor_attribute(tx, tv, args[0].const())
    rewritten = scalar_tensor_args.rewrite(tx, tv, name, args, kwargs)
    if rewritten is not None:
        return rewritten
    return tx.output.op("call_method", name, [tv] + list(args), kwargs)


def _requires_grad_unchanged(tv, args, kwargs) -> bool:
    """``x.requires_grad_(flag)`` where ``x`` already has it (``zero_grad`` does this
    to every gradient): nothing changes."""
    flag = args[0] if args else kwargs.get("requires_grad", V.ConstantValue(True))
    return isinstance(flag, V.ConstantValue) and len(args) + len(kwargs) <= 1 \
        and bool(flag.value) == tv.fake.requires_grad


def _type_string(f):
    """``x.type()``: what eager answers for a tensor of this dtype and device."""
    base = torch.empty(0, dtype=f.dtype).type()  # "torch.FloatTensor"
    if f.device.type == "cpu":
        return base
    if f.device.type == "cuda":
        return base.replace("torch.", "torch.cuda.", 1)
    raise Unsupported("K0041", f"Tensor.type() of a {f.device.type} tensor")


def _tensor_type(tx, tv, args, kwargs):
    """``x.type()`` is a string; ``x.type(t)`` casts to a dtype, a tensor type
    (``torch.HalfTensor``, ``torch.cuda.FloatTensor``) or its name: the same as ``.to``
    with that dtype and device, which returns ``x`` itself when nothing changes."""
    kwargs = dict(kwargs)
    target = args[0] if args else kwargs.pop("dtype", V.ConstantValue(None))
    non_blocking = args[1] if len(args) > 1 else kwargs.pop("non_blocking", V.ConstantValue(False))
    if kwargs or len(args) > 2:
        raise Unsupported("K0041", "Tensor.type() with extra arguments")
    t = target.const()
    if t is None:
        return V.ConstantValue(_type_string(tv.fake))
    if isinstance(t, str):
        mod, _, cls = t.rpartition(".")
        t = getattr({"torch": torch, "torch.cuda": torch.cuda}.get(mod), cls, None)
        if t is None:
            raise Unsupported("K0041", f"Tensor.type({target.const()!r})")
    if isinstance(t, torch.dtype):
        to = {"dtype": V.ConstantValue(t)}
    elif type(t).__name__ == "tensortype" and not t.is_sparse:
        device = torch.device("cuda") if t.is_cuda else torch.device("cpu")
        if tv.fake.device.type == device.type:
            device = tv.fake.device  # the same device (a CUDA tensor keeps its index)
        to = {"device": V.ConstantValue(device), "dtype": V.ConstantValue(t.dtype)}
    else:
        raise Unsupported("K0041", f"Tensor.type({t!r})")
    return tx.output.op("call_method", "to", [tv], {**to, "non_blocking": non_blocking})


del math
