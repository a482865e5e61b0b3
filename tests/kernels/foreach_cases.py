"""A kernel case calling every lowered ``_foreach_*`` overload (``foreach.PER_TENSOR``)
on lists of three tensors of different geometry: non-contiguous 2-d, 1-d and 0-d; a
``Tensor scalars`` argument (``host_scalars.TENSOR_SCALARS``) is a value per tensor.

The graph is built from the table and each overload's schema, so an overload added to
the table is exercised (and compared with eager) without another line here.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from kiln.kernels.lowering.foreach import PER_TENSOR
from kiln.kernels.lowering.host_scalars import TENSOR_SCALARS

aten = torch.ops.aten

#: per-tensor ops defined only on part of the line: their tensors are in (0.1, 0.9)
_DOMAIN = {"log", "log1p", "log2", "log10", "sqrt", "rsqrt", "asin", "acos", "pow",
           "reciprocal", "div"}
SHAPES = [(4, 5), (7,), ()]


def _scalars(name, ov):
    if name == "lerp":
        return [0.3, 0.7, -0.2] if ov == "ScalarList" else None
    if name == "pow":
        return [2.0, 0.5, -1.0]
    return [0.5, -1.5, 3.0]


def _scalar(name, ov):
    return {"lerp": 0.3, "pow": 2.5}.get(name, 0.7)


def foreach_graph():
    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(3)]      # signed values
    ps = [g.placeholder(f"p{i}") for i in range(3)]      # in (0.1, 0.9)
    ws = [g.placeholder(f"w{i}") for i in range(3)]      # lerp weights around 0.5
    s = g.placeholder("s")                               # a 0-d tensor
    ss = g.placeholder("ss")                             # a value per element (3,)
    outs = []

    def call(op, args, kwargs=None):
        r = g.call_function(op, tuple(args), kwargs or {})
        outs.extend(g.call_function(operator.getitem, (r, i)) for i in range(3))

    for op in PER_TENSOR:
        name = op._schema.name.split("::")[1][len("_foreach_"):]
        ov = op._overloadname
        lists = iter([ps, xs] if name in _DOMAIN else [xs, ps, ws])
        if name in ("addcdiv",):
            lists = iter([xs, ps, ps])
        if name == "lerp":
            lists = iter([xs, ps, ws])
        args = []
        for a in op._schema.arguments:
            t = str(a.type)
            if a.kwarg_only:
                continue
            if t == "List[Tensor]":
                args.append(next(lists))
            elif t == "List[number]":
                args.append(_scalars(name, ov))
            elif t == "Tensor":
                args.append(ss if op in TENSOR_SCALARS else s)
            elif t == "number":
                args.append(1.5 if ov == "ScalarAndTensor" else _scalar(name, ov))
            elif a.has_default_value():
                continue
            else:
                raise AssertionError(f"{op}: argument {a.name} of type {t}")
        call(op, args)
        if name in ("add", "sub") and ov == "List":
            call(op, args, {"alpha": 2})
        if name in ("lerp", "addcdiv", "addcmul") and ov == "Scalar":
            call(op, args[:-1] + [0.7 if name == "lerp" else -0.5])
    g.output(tuple(outs))
    return fx.GraphModule({}, g)


def foreach_inputs(device=None):
    """The lists and the 0-d ``s`` on ``device`` (None: where made, the CPU); ``ss``,
    the ``.Tensor`` overloads' scalars, on the CPU, as optimizers pass them and as
    eager requires ("Expected scalars to be on CPU")."""
    def nc(*shape):
        return torch.randn(*reversed(shape)).permute(*reversed(range(len(shape))))

    xs = [nc(4, 5), torch.randn(7), torch.randn(())]
    ps = [torch.rand(s) * 0.8 + 0.1 for s in SHAPES]
    ws = [torch.rand(s) * 1.4 - 0.2 for s in SHAPES]
    on = [t if device is None else t.to(device) for t in xs + ps + ws + [torch.tensor(0.4)]]
    return on + [torch.tensor([0.5, -1.5, 3.0])]
