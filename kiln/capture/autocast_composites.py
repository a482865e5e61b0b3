"""Composite ops whose autocast effect is a cast *inside* them, recorded as their parts.

``AmpTracker.explicit_call`` records autocast as casts of an op's own arguments; where
that does not reproduce the op under autocast (K0034), ``rewrite`` is tried. Some
composites are not on autocast's lists themselves, but reach an op that is: CUDA's
``cross_entropy`` runs ``log_softmax`` in the input's dtype (it passes that dtype,
which autocast keeps) and then ``nll_loss``, which autocast runs in float32 — a cast of
an intermediate, not of an argument. Such a call is recorded as the calls it makes,
each then going through ``explicit_call`` on its own, which gives exactly eager's casts
and dtypes. Only the forms whose parts are plain calls are rewritten; the rest (class
probabilities as targets, label smoothing, more than 2 dims) keep the graph break.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from kiln.capture import values as V

_CE_SIGNATURE = inspect.signature(F.cross_entropy)


def _const(v):
    """A bound argument's Python value where it is a constant (else the Value)."""
    return v.value if isinstance(v, V.ConstantValue) else v


def _cross_entropy(out, args, kwargs):
    """``nll_loss(log_softmax(input, class_dim, dtype=input.dtype), target, ...)``, as
    ``cross_entropy_loss`` computes it for class-index targets without smoothing; None
    for any other form."""
    try:
        bound = _CE_SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return None
    a = bound.arguments
    inp, target = a.get("input"), a.get("target")
    if not (isinstance(inp, V.TensorValue) and isinstance(target, V.TensorValue)):
        return None
    if target.fake.is_floating_point() or inp.fake.dim() not in (1, 2):
        return None         # (N-d: nll_loss itself casts after a view: no rewrite)
    consts = {k: _const(a.get(k)) for k in ("size_average", "reduce", "label_smoothing",
                                            "reduction", "ignore_index")}
    if consts["size_average"] is not None or consts["reduce"] is not None:
        return None
    if consts["label_smoothing"] not in (None, 0, 0.0):
        return None
    reduction = consts["reduction"] if consts["reduction"] is not None else "mean"
    ignore = consts["ignore_index"] if consts["ignore_index"] is not None else -100
    if not isinstance(reduction, str) or not isinstance(ignore, int):
        return None
    weight = a.get("weight")
    if weight is not None and not isinstance(weight, V.TensorValue) and _const(weight) is not None:
        return None
    class_dim = 0 if inp.fake.dim() == 1 else 1
    wt = weight if isinstance(weight, V.TensorValue) else None

    def parts(x, t, w=None):
        logp = torch.log_softmax(x, class_dim, dtype=x.dtype)
        return F.nll_loss(logp, t, weight=w, ignore_index=ignore, reduction=reduction)
    if not _same_dispatches(out, target=F.cross_entropy, args=args, kwargs=kwargs,
                            parts=parts, part_args=[inp, target] + ([wt] if wt is not None else [])):
        return None
    logp = out.op("call_function", torch.log_softmax, [inp],
                  {"dim": V.ConstantValue(class_dim), "dtype": V.ConstantValue(inp.fake.dtype)})
    nll_kwargs = {"ignore_index": V.ConstantValue(ignore), "reduction": V.ConstantValue(reduction)}
    if wt is not None:
        nll_kwargs["weight"] = wt
    return out.op("call_function", F.nll_loss, [logp, target], nll_kwargs)


def _same_dispatches(out, target, args, kwargs, parts, part_args) -> bool:
    """Do ``parts(*part_args)`` and ``target(*args, **kwargs)``, each on fakes under the
    traced autocast state, reach the dispatcher (below autocast) with the same ops on
    the same dtypes? The rewrite is eager's own sequence only where they do (the CPU's
    autocast casts cross_entropy's input itself: there they differ)."""
    amp = out.autocast
    fakes = [V.rules.to_fake(a) for a in args]
    f_kwargs = {k: V.rules.to_fake(v) for k, v in kwargs.items()}
    try:
        _, whole = amp._probe(out, "call_function", target, fakes, f_kwargs, amp.state)
        _, split = amp._probe(out, "call_function", parts,
                              [V.rules.to_fake(a) for a in part_args], {}, amp.state)
    except Exception:      # noqa: BLE001  (no rewrite; the break stands)
        return False
    return _dispatches(whole) == _dispatches(split)


def _dispatches(calls) -> list:
    return [(func, tuple(a.dtype for a in args if isinstance(a, torch.Tensor)), tuple(sorted(
        (k, v) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))))
            for func, args, kwargs in calls if func is not torch.ops.aten.detach.default]


#: callable -> rewrite(output graph, args, kwargs) -> the result's Value, or None
REWRITES = {F.cross_entropy: _cross_entropy}


def rewrite(out, kind, target, args, kwargs):
    """The composite call recorded as its parts (their Value), or None: record it as is."""
    fn = REWRITES.get(target) if kind == "call_function" else None
    return None if fn is None else fn(out, args, kwargs)
