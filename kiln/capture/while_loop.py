"""``torch.while_loop(cond_fn, body_fn, carried)`` captured as one graph node.

Both functions are traced as body graphs (``cond``'s machinery: no Python side
effects, no writes into their inputs, no output aliasing an input — eager raises on
that); the body must give back tensors of the carried tensors' shapes, dtypes and
devices. The node, ``WhileLoopCall``, runs the loop for real on real tensors (eager
backend, and the torch-level graph wherever the autograd stage falls back: it always
does, since the trip count is data); on kiln's capture fakes it runs the body once for
the outputs' metadata. Outputs are new tensors, also after zero iterations, as eager's.
"""
from __future__ import annotations

import torch

from kiln.capture import values as V
from kiln.capture.cond import _body_fake, _may_alias_input
from kiln.capture.body_graph import BodyGraph, trace_body
from kiln.capture.errors import Unsupported
from kiln.capture.fake import FakeTensor
from kiln.capture.rule_tables import CONST_FOLD


class WhileLoopCall:
    """The node's target: ``(*carried, *lifted_cond, *lifted_body)`` → the final
    carried tensors (a tuple)."""

    def __init__(self, cond_gm, body_gm, n_carried, n_cond_lifted):
        self.cond_gm = cond_gm
        self.body_gm = body_gm
        self.n_carried = n_carried
        self.n_cond_lifted = n_cond_lifted
        self.__name__ = self.__qualname__ = "torch_while_loop"
        self.__module__ = __name__

    def __call__(self, *flat):
        n, nc = self.n_carried, self.n_cond_lifted
        carried, lifted_c, lifted_b = list(flat[:n]), flat[n:n + nc], flat[n + nc:]
        if isinstance(carried[0], FakeTensor):   # capture: the outputs' metadata
            return tuple(self.body_gm.forward(*carried, *lifted_b))
        if carried[0].is_meta:
            from kiln.autograd.functionalize import AotUnsupported

            raise AotUnsupported("K0114", "torch.while_loop: its trip count is data; the graph runs at torch level")
        vals = carried
        while bool(self.cond_gm.forward(*vals, *lifted_c)[0]):
            vals = list(self.body_gm.forward(*vals, *lifted_b))
        return tuple(v.clone() if any(v is c for c in carried) else v for v in vals)

    def __repr__(self):
        return "torch.while_loop(<cond>, <body>)"


def _trace(tx, fn, carried, what):
    body = BodyGraph(tx.output, tx.output.grad_enabled, f"the {what} of torch.while_loop")
    args = [body.argument(_body_fake(t.fake), f"while_{what}_arg{i}") for i, t in enumerate(carried)]
    result = trace_body(tx, body, fn, args, {})
    if isinstance(result, V.TensorValue):
        outs, single = [result], True
    elif type(result) is V.TupleValue and all(isinstance(i, V.TensorValue) for i in result.items):
        outs, single = list(result.items), False
    else:
        raise Unsupported("K0057", f"the {what} of torch.while_loop returns {result} (not tensors)")
    if any(_may_alias_input(o.node) for o in outs):
        raise Unsupported("K0057", f"the {what} of torch.while_loop returns an input or a view of one "
                          "(eager's torch.while_loop raises on aliasing)")
    fakes = [o.fake for o in outs]
    gm = body.finish(outs)
    return gm, [outer for outer, _ in body.lifted], fakes, single


def call_while_loop(tx, args, kwargs):
    names = ("cond_fn", "body_fn", "carried_inputs")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise Unsupported("K0057", f"torch.while_loop with argument {k!r}")
        bound[k] = v
    if len(bound) != 3:
        raise Unsupported("K0057", "torch.while_loop with these arguments")
    carried = bound["carried_inputs"]
    if type(carried) is not V.TupleValue or not carried.items or \
            not all(isinstance(c, V.TensorValue) for c in carried.items):
        raise Unsupported("K0057", "torch.while_loop carrying other than a tuple of tensors")
    items = list(carried.items)
    cond_gm, cond_lifted, cond_out, _ = _trace(tx, bound["cond_fn"], items, "condition")
    if len(cond_out) != 1 or cond_out[0].dtype != torch.bool or cond_out[0].numel() != 1:
        raise Unsupported("K0057", "the condition of torch.while_loop is not a one-element bool tensor")
    body_gm, body_lifted, body_out, single = _trace(tx, bound["body_fn"], items, "body")
    if single and len(items) != 1:
        raise Unsupported("K0057", "the body of torch.while_loop returns one tensor for several carried ones")
    if len(body_out) != len(items) or any(
            o.shape != c.fake.shape or o.dtype != c.fake.dtype or o.fake_device != c.fake.fake_device
            for o, c in zip(body_out, items)):
        raise Unsupported("K0057", "the body of torch.while_loop changes the carried tensors' metadata")
    call = WhileLoopCall(cond_gm, body_gm, len(items), len(cond_lifted))
    res = tx.output.op("call_function", call, items + cond_lifted + body_lifted, {})
    outs = res.items if isinstance(res, V.TupleValue) else [res]
    return outs[0] if single else V.TupleValue(list(outs))


CONST_FOLD[torch.while_loop] = call_while_loop
