"""Capture rules for ``torch.optim``: ``opt.step()`` and ``opt.zero_grad()`` traced into
the graph.

PyTorch wraps its optimizers' methods for its own compiler, and those wrappers are
what a trace meets first:
- ``torch._disable_dynamo(f)`` (``zero_grad``, ``add_param_group``…) keeps that
  compiler out of ``f``; for kiln it is ``f`` itself, traced.
- ``_use_grad_for_differentiable`` runs ``step`` with grad mode set to the group's
  ``differentiable`` flag (and asks that compiler for a break around it): a grad-mode
  block around the inlined ``step``.
- ``Optimizer.profile_hook_step`` opens a ``record_function`` profiler range, which
  is a no-op annotation in a graph (``NoOpContextValue``), and runs the step hooks.
While compiling, PyTorch's optimizers keep the step count as a tensor and compute the
bias corrections from it; the path written for that is the ``capturable`` one, so a
trace of ``step`` sees ``capturable=True`` (as PyTorch's own compiler arranges), except
where that would change the state eager creates (a step tensor on a GPU where eager
keeps it on the CPU): there it sees the group as it is. The real group is never changed.
An optimizer's ``state`` is a dict keyed by its parameters (``tensor_keyed_dicts``).
"""
from __future__ import annotations

import functools
import os
import types
import weakref

import torch
import torch.optim.optimizer as torch_optimizer

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.fake import prime_non_leaf_fakes
from kiln.capture.rule_tables import CONST_FOLD
from kiln.capture.sources import AttrSource


def _probe():
    pass


def _no_op_exit(*exc_info):
    return None


class NoOpContextValue(V.ContextValue):
    """A profiler annotation (``record_function(name)``): nothing in the graph; a
    break inside it resumes in a block whose exit does nothing either."""

    stateless = True  # no global state to restore or to re-enter at a break

    def exit_expr(self, cg) -> str:
        return cg.ref(_no_op_exit, "noexit")

    def python_type(self):
        return torch.autograd.profiler.record_function

    def enter(self, tx):
        return self

    def exit(self, tx):
        return V.ConstantValue(None)

    def getattr(self, tx, name):
        raise Unsupported("K0009", f"attribute {name!r} of a profiler range inside a compiled region")


class NoOpContextClass(V.Value):
    """``record_function`` itself: calling it makes a ``NoOpContextValue``."""

    def __init__(self, cls):
        self.fn = cls

    def python_type(self):
        return type(self.fn)

    def call(self, tx, args, kwargs):
        return NoOpContextValue()


def _refuse(why):
    def rule(tx, args, kwargs):
        raise Unsupported("K0043", why)

    return rule


_FUSED = "a fused optimizer kernel (fused=True) runs eagerly: its in-place list op is not captured"
_UNSCALE = ("GradScaler's unscale kernel runs eagerly: its in-place list op is not captured")
#: kernels of a training step that write lists of tensors in place, which the autograd
#: stage does not functionalize: a graph break each, run as eager runs them
STEP_KERNEL_RULES = {getattr(torch, name): _refuse(why) for name, why in (
    ("_fused_adam_", _FUSED), ("_fused_adamw_", _FUSED), ("_fused_sgd_", _FUSED),
    ("_fused_adagrad_", _FUSED), ("_amp_foreach_non_finite_check_and_unscale_", _UNSCALE),
) if hasattr(torch, name)}
CONST_FOLD.update(STEP_KERNEL_RULES)


@V.rule(name="optimizer_special")
def special(obj):
    """The Value for ``obj`` where it is one of the callables these rules model."""
    if obj is torch.autograd.profiler.record_function:
        return NoOpContextClass(obj)
    return None


class OptimizerValue(V.ObjectValue):
    """A ``torch.optim.Optimizer``: an object whose ``state`` is keyed by tensors."""

    _state = None

    def getattr(self, tx, name):
        if name == "state" and name not in self.attrs and "state" in self.obj.__dict__:
            if self._state is None:
                from kiln.capture.tensor_keyed_dicts import TensorKeyedDictValue

                state = self.obj.__dict__["state"]
                src = AttrSource(self.source, "state")
                tx.output.guards.type_is(src, type(state))
                self._state = TensorKeyedDictValue(state, src)
            return self._state
        return super().getattr(tx, name)


@V.rule
def wrap_optimizer(tx, obj, source):
    tx.output.guards.type_is(source, type(obj))
    return tx.output.object_value(obj, source, OptimizerValue)


# --- the wrappers, recognised by their code objects ------------------------------------

def _traced_unwrapped(tx, fnv, args, kwargs):
    """``torch._disable_dynamo(f)``: ``f``, traced."""
    inner = getattr(fnv.fn, "__wrapped__", None)
    if not isinstance(inner, type(_probe)):
        raise Unsupported("K0043", f"{fnv.fn.__qualname__} wraps {inner!r}")
    return V.UserFunctionValue(inner).call(tx, args, kwargs)


def _step_in_grad_mode(tx, fnv, args, kwargs):
    """``_use_grad_for_differentiable(step)``: ``step`` under grad mode
    ``self.defaults["differentiable"]``, restored afterwards, seeing ``capturable``."""
    inner = getattr(fnv.fn, "__wrapped__", None)
    if not args or not isinstance(inner, type(_probe)):
        raise Unsupported("K0043", f"{fnv.fn.__qualname__} called without its optimizer")
    opt = args[0]
    prime_non_leaf_fakes()
    defaults = opt.getattr(tx, "defaults")
    from kiln.capture.operators import subscr

    differentiable = subscr(tx, defaults, V.ConstantValue("differentiable")).const()
    restore = _see_capturable(tx, opt) if isinstance(opt, OptimizerValue) else []
    try:
        return V._GradModeWrapped(bool(differentiable), V.UserFunctionValue(inner)).call(tx, args, kwargs)
    finally:
        for group, value in restore:
            group.items["capturable"] = value


def _see_capturable(tx, opt):
    """Show ``capturable=True`` in each of the trace's param groups where eager's state
    layout is unchanged by it; returns what to put back."""
    groups = opt.getattr(tx, "param_groups")
    restore = []
    for group in getattr(groups, "items", ()):
        flag = group.items.get("capturable") if isinstance(group, V.DictValue) else None
        if not (isinstance(flag, V.ConstantValue) and flag.value is False):
            continue
        params = group.items.get("params")
        if isinstance(params, V.ListValue) and all(_same_state_if_capturable(tx, opt, p)
                                                   for p in params.items):
            restore.append((group, flag))
            group.items["capturable"] = V.ConstantValue(True)
    return restore


def _same_state_if_capturable(tx, opt, p) -> bool:
    """A capturable group keeps ``step`` on the parameter's device; eager's keeps it on
    the CPU. The same where the parameter is on the CPU, gets no step this time (no
    gradient: its state is not touched), or already has its state. The trace reads
    each of these (device, ``.grad``, the state entry) and guards it."""
    if not isinstance(p, V.TensorValue):
        return False
    real = tx.output.real_input(p)
    if real is None:
        return False
    if real.device.type == "cpu" or real.grad is None:
        return True
    entry = opt.obj.state.get(real) if isinstance(opt.obj.state, dict) else None
    return isinstance(entry, dict) and "step" in entry


def _grad_mode_step(wrapper):
    """What ``_use_grad_for_differentiable(step)`` does, without the wrapper's calls into
    PyTorch's compiler (which load it): ``step`` under the optimizer's grad mode."""
    func = wrapper.__wrapped__

    @functools.wraps(func)
    def step_in_grad_mode(self, *args, **kwargs):
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return func(self, *args, **kwargs)

    return step_in_grad_mode


def _dynamo_disabled_optim_fn(wrapper):
    """The torch.optim function inside PyTorch's compiler's ``disable`` wrapper (that
    compiler, once a user loads it, wraps every optimizer's ``_init_group`` so), or None
    for any other wrapped function (a user's ``disable`` stays a graph break)."""
    code = wrapper.__code__
    if "fn" not in code.co_freevars:
        return None
    try:
        inner = wrapper.__closure__[code.co_freevars.index("fn")].cell_contents
    except ValueError:
        return None
    if isinstance(inner, type(_probe)) and (inner.__module__ or "").startswith("torch.optim"):
        return inner
    return None


def _traced_dynamo_disabled(tx, fnv, args, kwargs):
    inner = _dynamo_disabled_optim_fn(fnv.fn)
    if inner is None:
        return tx.inline_function(fnv, args, kwargs)
    return V.UserFunctionValue(inner).call(tx, args, kwargs)


_CALLEES = {}  # a modelled wrapper's code -> what runs in its place as its own frame
_replacements = weakref.WeakKeyDictionary()


def callee_for(fn):
    """The function kiln compiles as its own frame when ``fn`` must be one (a graph break
    inside it): the function a modelled wrapper stands for, else ``fn``."""
    inline_rule(fn)  # learns PyTorch's compiler's disable wrapper, if this is one
    make = _CALLEES.get(getattr(fn, "__code__", None))
    if make is None:
        return fn
    found = _replacements.get(fn)
    if found is None:
        found = _replacements[fn] = make(fn) or fn
    return found


def _rules():
    table = {}
    try:
        import torch._compile   # the wrapper's code object, read to recognise it

        code = torch._compile._disable_dynamo(_probe).__code__
        table[code] = _traced_unwrapped
        _CALLEES[code] = lambda wrapper: wrapper.__wrapped__
    except (ImportError, AttributeError, TypeError):
        pass
    use_grad = getattr(torch_optimizer, "_use_grad_for_differentiable", None)
    if use_grad is not None:
        code = use_grad(_probe).__code__
        table[code] = _step_in_grad_mode
        _CALLEES[code] = _grad_mode_step
    return table


INLINE_RULES = _rules()
# Compatibility read, names only: kiln never imports or reads PyTorch's compiler. Once a
# user's torch.compile has loaded it, it wraps every optimizer's ``_init_group`` in its
# ``disable``; kiln recognises that wrapper by its code's qualified name and file name
# alone (and follows the wrapped torch.optim function through the closure).
_DISABLE_WRAPPER_QUALNAME = "DisableContext.__call__.<locals>._fn"
_DISABLE_WRAPPER_FILE = os.path.join("_dynamo", "eval_frame.py")


def _is_compiler_disable_wrapper(code) -> bool:
    return (isinstance(code, types.CodeType)
            and getattr(code, "co_qualname", "") == _DISABLE_WRAPPER_QUALNAME
            and code.co_filename.endswith(_DISABLE_WRAPPER_FILE))


@V.rule
def inline_rule(fn):
    """The rule that replaces inlining ``fn`` (a Python function), or None."""
    code = getattr(fn, "__code__", None)
    rule = INLINE_RULES.get(code)
    if rule is None and _is_compiler_disable_wrapper(code):
        rule = INLINE_RULES[code] = _traced_dynamo_disabled
        _CALLEES[code] = _dynamo_disabled_optim_fn
    return rule
