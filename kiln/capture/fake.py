"""Fake tensors of our own: metadata-only stand-ins that keep the real device.

Capture runs user code on these instead of real data: every op runs on the ``meta``
device (shapes, dtypes, strides, aliasing; no compute, no memory), while a wrapper
subclass carries the device the real tensor would have, so a CUDA program can be traced
on a machine without a GPU. ``FakeMode`` catches factory ops (``torch.zeros(...,
device="cuda")``) that have no fake argument to dispatch on. Ops whose result depends on
data (``.item()``, ``nonzero``) raise ``DataDependent``; capture turns that into a graph
break.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_META = torch.device("meta")
_CPU = torch.device("cpu")


class DataDependent(RuntimeError):
    """The op needs tensor values, which a fake tensor does not have."""


class NoMetaKernel(RuntimeError):
    """PyTorch has no meta implementation for this op."""


def _ops(*names):
    out = set()
    for n in names:
        packet, _, overload = n.partition(".")
        op = getattr(aten, packet, None)
        if op is not None and hasattr(op, overload):
            out.add(getattr(op, overload))
    return out


_DATA_DEPENDENT = _ops(
    "_local_scalar_dense.default", "nonzero.default", "masked_select.default",
    "_unique2.default", "unique_consecutive.default", "equal.default",
    "is_nonzero.default", "allclose.default", "repeat_interleave.Tensor",
    "unique_dim.default",
)


class FakeTensor(torch.Tensor):
    """A meta tensor that reports ``fake_device`` as its device."""

    _elem: torch.Tensor
    fake_device: torch.device

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=device,
            requires_grad=elem.requires_grad,
        )
        r._elem = elem
        r.fake_device = device
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"FakeTensor(size={tuple(self.shape)}, dtype={self.dtype}, device={self.fake_device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return fake_dispatch(func, args, kwargs or {})


def _pick_device(args, kwargs) -> torch.device:
    """The device of an op's result: an explicit ``device=``, else the fake inputs'
    common device (a non-CPU device wins over CPU 0-d tensors, as in eager)."""
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    found = None
    for a in _flat(args) + _flat(list(kwargs.values())):
        if isinstance(a, FakeTensor):
            if found is None or (found.type == "cpu" and a.fake_device.type != "cpu"):
                found = a.fake_device
    return found if found is not None else _CPU


def _flat(xs):
    out = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(_flat(x))
        else:
            out.append(x)
    return out


def fake_dispatch(func, args, kwargs):
    if func in _DATA_DEPENDENT:
        raise DataDependent(f"{func} needs the tensor's values")
    device = _pick_device(args, kwargs)
    if "device" in kwargs:
        kwargs = dict(kwargs, device=_META)

    def unwrap(x):
        if isinstance(x, FakeTensor):
            return x._elem
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            # a real tensor reached a traced op (a constant): use its metadata
            return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=_META)
        return x

    u_args = tree_map(unwrap, args)
    u_kwargs = tree_map(unwrap, kwargs)
    try:
        out = func(*u_args, **u_kwargs)
    except NotImplementedError as e:
        raise NoMetaKernel(f"{func} has no meta kernel ({e})") from None
    except RuntimeError as e:
        msg = str(e)
        if "meta" in msg and ("not implemented" in msg.lower() or "Could not run" in msg):
            raise NoMetaKernel(f"{func} has no meta kernel") from None
        if "data-dependent" in msg or "Cannot copy out of meta" in msg:
            raise DataDependent(f"{func}: {msg}") from None
        raise

    # In-place and out= ops return (one of) their inputs: hand back the same wrapper.
    in_by_id = {}
    for a in _flat(list(args)) + _flat(list(kwargs.values())):
        if isinstance(a, FakeTensor):
            in_by_id[id(a._elem)] = a

    def wrap(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            same = in_by_id.get(id(x))
            if same is not None:
                return same
            return FakeTensor(x, device)
        return x

    return tree_map(wrap, out)


class FakeMode(TorchDispatchMode):
    """Routes every op, factories included, through ``fake_dispatch``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return fake_dispatch(func, args, kwargs or {})


def to_fake(t: torch.Tensor) -> FakeTensor:
    """A fake with the same size, strides, dtype, device and requires_grad as ``t``."""
    if isinstance(t, FakeTensor):
        return t
    elem = torch.empty_strided(
        t.size(), t.stride(), dtype=t.dtype, device=_META
    )
    f = FakeTensor(elem, t.device)
    if t.requires_grad:
        f.requires_grad_(True)
    return f
