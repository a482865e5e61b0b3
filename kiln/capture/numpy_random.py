"""``np.random.*`` (NumPy's global generator) in a trace: the same draws as eager.

No torch op reproduces NumPy's random streams, so kiln does not compute the draws: a
call with constant arguments is made by the entry code itself, as an input of the
graph (``RandomCallSource``), and the graph inputs are read in the order the program
made them — the generator advances exactly as in eager. ``np.random.seed`` and
``set_state`` are such calls too (their input is an empty tensor the graph ignores).
The trace learns the result's shape and dtype from a private ``RandomState`` (the
global one is not touched while tracing). A draw without ``size`` (a Python number),
arguments that are arrays, or ``Generator`` objects are Unsupported.

The draw happens before the graph runs: a graph that raises after it (an integer
division by zero on the CPU) leaves the generator advanced by all of the trace's draws.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kiln.capture.errors import Unsupported
from kiln.capture import values as V
from kiln.capture.numpy_values import NdarrayValue, as_tensor, np_module, numpy_device, torch_dtype
from kiln.capture.sources import Source

_EMPTY = torch.empty(0)


@dataclass(frozen=True)
class RandomCallSource(Source):
    """A call of the real generator, made when the graph's inputs are gathered."""

    call: str  # name of the bound call in the entry namespace
    label: str

    def expr(self):
        return f"{self.call}()"

    def pretty(self):
        return self.label


def _draw(fn, args, kwargs):
    out = fn(*args, **kwargs)
    return _EMPTY if out is None else as_tensor(out)


def random_rule(fn):
    np = np_module()
    if fn is np.random.seed or getattr(fn, "__self__", None) is np.random.mtrand._rand:
        return functools.partial(_random_call, fn)
    return None


def _random_call(fn, tx, *args, **kwargs):
    from kiln.capture.numpy_rules import k

    np = np_module()
    name = fn.__name__
    try:
        cargs = [k(a) for a in args]
        ckw = {n: k(v) for n, v in kwargs.items()}
    except Unsupported:
        raise Unsupported("K0305", f"np.random.{name} with non-constant arguments")
    try:
        sample = getattr(np.random.RandomState(0), name)(*cargs, **ckw)
    except Exception as e:  # noqa: BLE001 -- NumPy refuses: eager raises it
        raise Unsupported("K0304", f"np.random.{name}: {e}")
    if sample is not None and not isinstance(sample, np.ndarray):
        raise Unsupported("K0305", f"np.random.{name} returning {type(sample).__name__} (no size=)")
    if sample is not None:
        torch_dtype(sample.dtype)
    g = tx.output.guards
    call = g.const(functools.partial(_draw, fn, tuple(cargs), ckw), "rnd")
    label = f"np.random.{name}({', '.join([repr(a) for a in cargs] + [f'{n}={v!r}' for n, v in ckw.items()])})"
    first = len(g.guards)
    tv = tx.output.input_tensor(_EMPTY.clone() if sample is None else as_tensor(sample.copy()),
                                RandomCallSource(call, label))
    g.drop_since(first)  # its metadata is the call's own: nothing to check
    if sample is None:
        tx.output.op("call_method", "clone", [tv], {})  # so that a graph (and its call) exists
        return V.ConstantValue(None)
    # a copy: returned as is, the input would be rebuilt by calling the generator again
    dev = numpy_device()
    if dev.type != "cpu":
        return NdarrayValue(tx.output.op("call_method", "to", [tv, V.ConstantValue(dev)], {}))
    return NdarrayValue(tx.output.op("call_method", "clone", [tv], {}))
