"""``torch.cond(pred, true_fn, false_fn, operands)`` captured as one graph node.

With a Python-constant predicate eager's ``torch.cond`` just calls one branch, and so
does the trace (inlined). With a tensor predicate both branches are traced into body
graphs (``body_graph.BodyGraph``: no Python side effects, no writes into operands) and
one ``CondCall`` node holds them. The node runs as follows:

* on real tensors (eager backend, and the torch-level graph wherever the autograd stage
  falls back): the predicate is read and only the chosen branch runs, as in eager;
* on kiln's capture fakes: both branches, selected by ``torch.where`` (the outputs'
  metadata);
* under the autograd stage's meta trace: the same ``where`` selection, which is exact
  in value (both branches return one shape, dtype and layout, checked at capture) —
  but not in gradient (a zero gradient through the branch not taken can turn into NaN,
  ``0 * inf``), so when an operand needs a gradient the autograd stage gives up
  (``AotUnsupported``) and the torch-level graph runs the node on real tensors.

Branches must return a tensor or a tuple/list of tensors of equal metadata, as eager's
``torch.cond`` requires; anything else is a graph break.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from kiln.capture import values as V
from kiln.capture.body_graph import BodyGraph, trace_body
from kiln.capture.errors import Unsupported
from kiln.capture.fake import FakeTensor
from kiln.capture.rule_tables import CONST_FOLD


class CondCall:
    """The node's target: ``(pred, *operands, *lifted_true, *lifted_false)`` → the
    chosen branch's output leaves (a tuple)."""

    def __init__(self, true_gm, false_gm, n_operands, n_true_lifted):
        self.true_gm = true_gm
        self.false_gm = false_gm
        self.n_operands = n_operands
        self.n_true_lifted = n_true_lifted
        self.__name__ = self.__qualname__ = "torch_cond"
        self.__module__ = __name__

    def _split(self, flat):
        ops = list(flat[:self.n_operands])
        lifted = flat[self.n_operands:]
        return ops + list(lifted[:self.n_true_lifted]), ops + list(lifted[self.n_true_lifted:])

    def __call__(self, pred, *flat):
        true_args, false_args = self._split(flat)
        if isinstance(pred, FakeTensor) or not pred.is_meta:
            if not isinstance(pred, FakeTensor):   # real tensors: eager's one branch
                gm, args = (self.true_gm, true_args) if bool(pred) else (self.false_gm, false_args)
                return tuple(gm.forward(*args))
        elif torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat):
            from kiln.autograd.functionalize import AotUnsupported

            raise AotUnsupported("K0114", "torch.cond with operands that need gradients (both branches would be "
                                 "differentiated): the graph runs at torch level")
        outs_t = self.true_gm.forward(*true_args)
        outs_f = self.false_gm.forward(*false_args)
        p = pred.reshape(())
        return tuple(torch.where(p, a, b) for a, b in zip(outs_t, outs_f))

    def __repr__(self):
        return "torch.cond(<true branch>, <false branch>)"


def _body_fake(fake):
    elem = torch.empty_strided(tuple(fake.shape), tuple(fake.stride()), dtype=fake.dtype, device="meta")
    if fake.requires_grad:
        elem.requires_grad_(True)
    return FakeTensor(elem, fake.fake_device)


def _trace_branch(tx, fn, operands, which):
    body = BodyGraph(tx.output, tx.output.grad_enabled, f"the {which} branch of torch.cond")
    args = [body.argument(_body_fake(t.fake), f"cond_{which}_arg{i}") for i, t in enumerate(operands)]
    result = trace_body(tx, body, fn, args, {})
    if isinstance(result, V.TensorValue):
        outs, structure = [result], "tensor"
    elif isinstance(result, (V.TupleValue, V.ListValue)) and not isinstance(result, V.NamedTupleValue) \
            and all(isinstance(i, V.TensorValue) for i in result.items):
        outs, structure = list(result.items), type(result)
    else:
        raise Unsupported("K0057", f"the {which} branch of torch.cond returns {result} (not a tensor or a tuple of tensors)")
    if any(_may_alias_input(o.node) for o in outs):
        raise Unsupported("K0057", f"the {which} branch of torch.cond returns an operand or a view of one "
                          "(eager's torch.cond raises on aliasing)")
    fakes = [o.fake for o in outs]   # body Values are unusable once the body is finished
    gm = body.finish(outs)
    return gm, [outer for outer, _ in body.lifted], fakes, structure


_VIEW_NAMES = {"view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "squeeze",
               "unsqueeze", "expand", "expand_as", "narrow", "select", "getitem", "__getitem__",
               "flatten", "unflatten", "as_strided", "detach", "alias", "split", "chunk", "unbind",
               "movedim", "swapaxes", "diagonal", "real", "imag", "view_as_real", "contiguous",
               "to", "type_as", "unfold", "T", "mT", "mH", "H"}


def _may_alias_input(node) -> bool:
    """Whether a body output may share memory with a body input (conservatively:
    through any chain of view-like ops, ``contiguous`` and ``to`` included)."""
    while True:
        if node.op == "placeholder":
            return True
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if name not in _VIEW_NAMES or not node.args or not hasattr(node.args[0], "op"):
            return False
        node = node.args[0]


def _same_meta(a, b) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
            and a.fake_device == b.fake_device and a.is_contiguous())


def call_cond(tx, args, kwargs):
    names = ("pred", "true_fn", "false_fn", "operands")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise Unsupported("K0057", f"torch.cond with argument {k!r}")
        bound[k] = v
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    operands = bound.get("operands", V.TupleValue([]))
    if not isinstance(operands, (V.TupleValue, V.ListValue)) or \
            not all(isinstance(o, V.TensorValue) for o in operands.items):
        raise Unsupported("K0057", "torch.cond operands other than a flat tuple of tensors")
    ops = list(operands.items)
    if isinstance(pred, V.ConstantValue) and isinstance(pred.value, (bool, int, float)):
        return (true_fn if pred.value else false_fn).call(tx, ops, {})   # eager calls one branch
    if not isinstance(pred, V.TensorValue) or pred.fake.numel() != 1 or pred.fake.dtype != torch.bool:
        raise Unsupported("K0057", "torch.cond with a predicate other than a one-element bool tensor or a constant")
    true_gm, true_lifted, true_outs, t_struct = _trace_branch(tx, true_fn, ops, "true")
    false_gm, false_lifted, false_outs, f_struct = _trace_branch(tx, false_fn, ops, "false")
    if t_struct != f_struct or len(true_outs) != len(false_outs) or \
            not all(_same_meta(a, b) for a, b in zip(true_outs, false_outs)):
        raise Unsupported("K0057", "torch.cond branches return different structures or tensor metadata")
    call = CondCall(true_gm, false_gm, len(ops), len(true_lifted))
    res = tx.output.op("call_function", call, [pred] + ops + true_lifted + false_lifted, {})
    items = res.items if isinstance(res, V.TupleValue) else [res]
    if t_struct == "tensor":
        return items[0]
    return V.TupleValue(items) if t_struct is V.TupleValue else V.ListValue(items)


CONST_FOLD[torch.cond] = call_cond
