"""A 0-d tensor passed where an op takes a Python number (``alpha=``, ``value=``).

Eager reads the number out of the tensor (``.item()``), which a graph cannot do; an
optimizer passes its tensor learning rate (``param.add_(grad, alpha=-lr)``) or, while
compiled, its tensor step size (``param.addcdiv_(m, d, value=-step_size)``) that way.
The same arithmetic as tensor ops: ``x + alpha * y``, ``x + value * t1 * t2``,
``x + value * t1 / t2``, computed in the op's math type (float32 for bf16/fp16, as
eager's kernels do) and rounded once into ``x``'s dtype. Applies only where eager
accepts the call: float tensors of one dtype, a 0-d scalar tensor that does not
require grad.
"""
from __future__ import annotations

import torch

from kiln.capture import values as V

# method -> (the number's keyword, the tensor arguments, how the delta is made)
_RULES = {
    "add": ("alpha", 1, "mul"), "add_": ("alpha", 1, "mul"),
    "sub": ("alpha", 1, "mul"), "sub_": ("alpha", 1, "mul"),
    "addcmul": ("value", 2, "mul"), "addcmul_": ("value", 2, "mul"),
    "addcdiv": ("value", 2, "div"), "addcdiv_": ("value", 2, "div"),
}
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def rewrite(tx, tv, name, args, kwargs):
    """The Value of ``tv.name(*args, **kwargs)`` made of tensor ops, or None where the
    call takes no tensor number (or eager would refuse it: left to the op itself)."""
    rule = _RULES.get(name)
    if rule is None:
        return None
    key, n_tensors, combine = rule
    scalar = kwargs.get(key)
    if not isinstance(scalar, V.TensorValue) or set(kwargs) != {key} or len(args) != n_tensors:
        return None
    tensors = [tv] + list(args)
    if not all(isinstance(t, V.TensorValue) for t in tensors):
        return None
    dtype = tv.fake.dtype
    s = scalar.fake
    if s.dim() != 0 or s.requires_grad or not s.dtype.is_floating_point \
            or not dtype.is_floating_point or any(t.fake.dtype != dtype for t in tensors):
        return None

    def op(method, *operands):
        return tx.output.op("call_method", method, list(operands), {})

    def opmath(t):
        return op("float", t) if dtype in _LOW_PRECISION else t

    operands = [opmath(t) for t in args]
    scaled = op("mul", operands[0], scalar)  # value * t1, then * t2 or / t2: eager's order
    delta = scaled if n_tensors == 1 else op(combine, scaled, operands[1])
    base = "sub" if name.startswith("sub") else "add"
    if name.endswith("_"):
        return op(base + "_", tv, delta)
    out = op(base, tv, delta)
    return op("to", out, V.ConstantValue(dtype)) if dtype in _LOW_PRECISION else out
