"""``torch.func`` inside compiled functions: ``grad``, ``grad_and_value``, ``vmap``,
``jacrev``, ``jacfwd`` as one graph node each; ``functional_call`` as a module call.

A transform's own Python (interpreter levels, wrapper tensors) is not traced; the
function it transforms is, into a body graph of its own (``body_graph``), on fakes
shaped as the transform hands it its arguments (one sample of each batched argument
under ``vmap``). The caller's graph gets one node, a ``TransformCall``, that runs
``torch.func.<name>(body, **options)(*args, **kwargs)``: the eager backend calls the
transform for real; the autograd stage runs it under its dispatch mode, which sees
the batched and differentiated aten ops functorch produces, so ``aot_eager`` and the
kernel compiler get plain aten graphs. A transform that rejects its input raises the
same error while the node's result is propagated on fakes (the frame then runs
eagerly and raises eager's own error).

``functional_call(module, params, args)`` needs no node: the module is called with the
given tensors read in place of its parameters and buffers (``ObjectValue.attrs``, the
reads a trace's own writes answer), restored after the call.
"""
from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Callable

import torch
import torch.func
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import _broadcast_to_and_flatten, tree_flatten, tree_leaves, tree_map, \
    tree_structure, tree_unflatten

from kiln.capture import values as V
from kiln.capture.body_graph import BodyGraph, trace_body
from kiln.capture.errors import Unsupported
from kiln.capture.fake import FakeTensor
from kiln.dispatch_mode import KilnDispatchMode
from kiln.debug.logs import log_for

_log = log_for("graph")


@dataclass(frozen=True)
class Transform:
    """How a transform presents its function's arguments to it."""
    name: str
    fn: Callable
    grad_mode: bool | None      # the grad mode the function runs in (None: the caller's)
    batched: bool               # each batched argument is one sample (``in_dims``)
    differentiates: bool        # the ``argnums`` arguments track gradients


TRANSFORMS = {t.fn: t for t in (
    Transform("grad", torch.func.grad, True, False, True),
    Transform("grad_and_value", torch.func.grad_and_value, True, False, True),
    Transform("vmap", torch.func.vmap, None, True, False),
    Transform("jacrev", torch.func.jacrev, True, False, True),
    Transform("jacfwd", torch.func.jacfwd, None, False, False),
)}
_FUNCTIONAL_CALLS = {torch.func.functional_call}


@V.rule(name="transform_special_value")
def special_value(obj):
    """The Value for a ``torch.func`` callable kiln models, or None."""
    rule = TRANSFORMS.get(obj)
    if rule is not None:
        return TransformValue(rule)
    if obj in _FUNCTIONAL_CALLS:
        return FunctionalCallValue(obj)
    return None


def _dummy(*args, **kwargs):
    return None


_prebuilt_codes: dict = {}


def _prebuilt_table() -> dict:
    """The code object of the function each transform returns -> the transform (the
    wrappers keep ``func`` and their options in closure cells of those names)."""
    if not _prebuilt_codes:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for rule in TRANSFORMS.values():
                _prebuilt_codes[rule.fn(_dummy).__code__] = rule
    return _prebuilt_codes


@V.rule
def prebuilt_value(tx, fn, source):
    """``fn`` made by a transform outside the compiled code (``g = vmap(grad(f))`` at
    module level), as the Value a call of the transform makes inside it; None for any
    other function. ``fn`` itself is guarded by identity; its cells, by value."""
    rule = _prebuilt_table().get(fn.__code__)
    if rule is None or fn.__closure__ is None:
        return None
    from kiln.capture.builder import wrap
    from kiln.capture.sources import FuncCellSource

    names = fn.__code__.co_freevars
    cells = {n: (i, c.cell_contents) for i, (n, c) in enumerate(zip(names, fn.__closure__))}
    params = [p for p in inspect.signature(rule.fn).parameters if p != "func"]
    if "func" not in cells or any(p not in cells for p in params):
        return None
    options = {}
    for p in params:
        i, value = cells[p]
        if source is not None:
            tx.output.guards.constant(FuncCellSource(source, i), value)
        options[p] = value
    i, func = cells["func"]
    fn_value = wrap(tx, func, FuncCellSource(source, i) if source is not None else None)
    return TransformedFunctionValue(rule, fn_value, options)


class TransformValue(V.Value):
    """``torch.func.grad`` itself: calling it with a function makes a transformed one."""

    def __init__(self, rule: Transform):
        self.rule = rule
        self.fn = rule.fn

    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        if args:
            fn_value, args = args[0], args[1:]
        elif "func" in kwargs:
            kwargs = dict(kwargs)
            fn_value = kwargs.pop("func")
        else:
            raise Unsupported("K0036", f"torch.func.{self.rule.name} without a function")
        try:
            options = inspect.signature(self.rule.fn).bind(_dummy, *[_option(a) for a in args],
                                                           **{k: _option(v) for k, v in kwargs.items()})
            options.apply_defaults()
            options = {k: v for k, v in options.arguments.items() if k != "func"}
            self.rule.fn(_dummy, **options)   # the transform's own checks of its options
        except Unsupported:
            raise Unsupported("K0011", f"torch.func.{self.rule.name} with non-constant options")
        except Exception as e:  # noqa: BLE001 -- eager raises it at this call: run it there
            raise Unsupported("K0036", f"torch.func.{self.rule.name} rejects its options ({e})")
        return TransformedFunctionValue(self.rule, fn_value, options)

    def __repr__(self):
        return f"TorchFunc({self.rule.name})"


def _option(v):
    """A transform's option (``in_dims`` may be a pytree built in the trace) as a constant."""
    if isinstance(v, V.DictValue) and v.python_type() is dict:
        return {k: _option(i) for k, i in v.items.items()}
    if type(v) in (V.TupleValue, V.ListValue):
        items = [_option(i) for i in v.items]
        return tuple(items) if isinstance(v, V.TupleValue) else items
    return v.const()


class TransformedFunctionValue(V.Value):
    """``torch.func.grad(f, argnums=1)``: a call traces ``f`` into a body graph and
    records one ``TransformCall`` node."""

    def __init__(self, rule: Transform, fn_value: V.Value, options: dict):
        self.rule = rule
        self.fn_value = fn_value
        self.options = options

    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        return call_transformed(tx, self, list(args), dict(kwargs))

    def referenced(self):
        return [self.fn_value]

    def rebuild(self, cg):
        return (f"{cg.ref(self.rule.fn, 'f')}({cg.expr(self.fn_value)}, "
                f"**{cg.ref(self.options, 'c')})")

    def __repr__(self):
        return f"TorchFunc({self.rule.name}({self.fn_value}))"


# --- pytrees of Values -------------------------------------------------------------------
@dataclass(frozen=True)
class _Slot:
    """Where a tensor sits in a template: the ``index``-th tensor."""
    index: int


def _template(v, tensors: list):
    """``v`` as a plain pytree whose tensors are ``_Slot``s (``tensors`` collects them)."""
    if isinstance(v, V.TensorValue):
        tensors.append(v)
        return _Slot(len(tensors) - 1)
    if isinstance(v, V.ConstantValue):
        return v.value
    if isinstance(v, V.NamedTupleValue):
        raise Unsupported("K0036", "a named tuple passed to or returned by a torch.func-transformed function")
    if isinstance(v, V.TupleValue):
        return tuple(_template(i, tensors) for i in v.items)
    if isinstance(v, V.ListValue):
        return [_template(i, tensors) for i in v.items]
    if isinstance(v, V.DictValue) and v.python_type() is dict:
        return {k: _template(i, tensors) for k, i in v.items.items()}
    raise Unsupported("K0036", f"{v} passed to or returned by a torch.func-transformed function")


def _fill(template, items):
    return tree_map(lambda x: items[x.index] if isinstance(x, _Slot) else x, template)


def _as_value(tree):
    """A pytree of Values and constants as one Value."""
    if isinstance(tree, V.Value):
        return tree
    if type(tree) is tuple:
        return V.TupleValue([_as_value(i) for i in tree])
    if type(tree) is list:
        return V.ListValue([_as_value(i) for i in tree])
    if type(tree) is dict:
        return V.DictValue({k: _as_value(i) for k, i in tree.items()})
    from kiln.capture.builder import wrap_static

    return wrap_static(tree)


# --- the graph node ----------------------------------------------------------------------
class TransformCall:
    """The node's target: the transform applied to the traced body, called with the
    arguments rebuilt around the node's tensors; returns the result's leaves (the trace
    rebuilds its structure from ``result_spec``). Tensors the body read from outside
    come after the arguments' tensors and reach the body as closed-over values, which a
    transform neither batches nor differentiates — as for the user's own closure."""

    def __init__(self, rule: Transform, options: dict, body, in_template, n_in: int,
                 out_template):
        self.rule = rule
        self.options = options
        self.body = body
        self.in_template = in_template
        self.positions = [i for i, x in enumerate(tree_leaves(in_template)) if isinstance(x, _Slot)]
        self.n_in = n_in
        self.out_template = out_template
        self.result_spec = None
        self.__name__ = self.__qualname__ = f"torch_func_{rule.name}"
        self.__module__ = __name__

    def __call__(self, *flat):
        tensors, lifted = flat[:self.n_in], flat[self.n_in:]
        args, kwargs = _fill(self.in_template, tensors)
        body, positions, out_template = self.body, self.positions, self.out_template

        def transformed(*a, **k):
            leaves = tree_leaves((a, k))
            outs = body.forward(*[leaves[i] for i in positions], *lifted)
            return _fill(out_template, outs)

        apply = self.rule.fn(transformed, **self.options)
        if any(isinstance(t, FakeTensor) for t in flat):    # the result propagated on fakes
            with _RealConstants():
                result = apply(*args, **kwargs)
        else:
            result = apply(*args, **kwargs)
        leaves, self.result_spec = tree_flatten(result)
        return tuple(leaves)

    def __repr__(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"torch.func.{self.rule.name}(<body>, {opts})"


class _RealConstants(KilnDispatchMode):
    """Above the fake mode while a transform's result is propagated on fakes: an op
    whose tensors are all real (none fake) runs for real. Those are the transform's own
    bookkeeping on tensors it makes from Python numbers (``jacfwd`` on torch 2.11 turns
    ``torch.tensor(numels).cumsum(0)`` into ints); their values depend on no input, so
    computing them is exact. Everything else goes on to the fake mode."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if tensors and not any(isinstance(t, FakeTensor) or t.device.type == "meta"
                               for t in tensors):
            with _disable_current_modes():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


# --- tracing a transformed call ----------------------------------------------------------
def call_transformed(tx, tv: TransformedFunctionValue, args: list, kwargs: dict):
    rule = tv.rule
    what = f"the function given to torch.func.{rule.name}"
    tensors: list = []
    template = (tuple(_template(a, tensors) for a in args),
                {k: _template(v, tensors) for k, v in kwargs.items()})
    per_arg = _arg_roles(rule, tv.options, template[0], len(tensors))
    body = BodyGraph(tx.output, tx.output.grad_enabled if rule.grad_mode is None else rule.grad_mode,
                     what)
    body_tensors = [body.argument(_body_fake(t.fake, *per_arg[i]), f"{rule.name}_arg{i}")
                    for i, t in enumerate(tensors)]
    body_args, body_kwargs = _fill(template, body_tensors)
    result = trace_body(tx, body, tv.fn_value, [_as_value(a) for a in body_args],
                        {k: _as_value(v) for k, v in body_kwargs.items()})
    outputs: list = []
    out_template = _template(result, outputs)
    gm = body.finish(outputs)
    call = TransformCall(rule, tv.options, gm, template, len(tensors), out_template)
    _log.info("torch.func.%s body:\n%s", rule.name, gm.code)
    res = tx.output.op("call_function", call, tensors + [outer for outer, _ in body.lifted], {})
    items = res.items if isinstance(res, V.TupleValue) else []
    return _as_value(tree_unflatten(list(items), call.result_spec))


def _arg_roles(rule, options, args_template, n_tensors):
    """Per tensor of the call (positional ones first, in order): (the batch dimension
    the transform removes or None, whether it tracks gradients inside)."""
    roles = [(None, False)] * n_tensors
    slots_per_arg = [[x for x in tree_leaves(a) if isinstance(x, _Slot)] for a in args_template]
    if rule.batched:
        spec = tree_structure(args_template)
        dims = _broadcast_to_and_flatten(options["in_dims"], spec)
        if dims is None:
            raise Unsupported("K0036", f"vmap in_dims={options['in_dims']!r} do not match the arguments")
        for x, d in zip(tree_leaves(args_template), dims):
            if isinstance(x, _Slot):
                if d is not None and not isinstance(d, int):
                    raise Unsupported("K0036", f"vmap in_dims entry {d!r}")
                roles[x.index] = (d, False)
    if rule.differentiates:
        argnums = options["argnums"]
        for n in (argnums,) if isinstance(argnums, int) else tuple(argnums):
            if not isinstance(n, int) or not -len(slots_per_arg) <= n < len(slots_per_arg):
                raise Unsupported("K0036", f"torch.func.{rule.name} argnums={argnums!r} out of range")
            for x in slots_per_arg[n]:
                roles[x.index] = (None, True)
    return roles


def _body_fake(fake, batch_dim, differentiable):
    """The fake a transform's function sees for ``fake``: without its batch dimension,
    tracking gradients only where the transform differentiates (a batched or
    transform-level tensor reports ``requires_grad=False``)."""
    shape, stride = list(fake.shape), list(fake.stride())
    if batch_dim is not None:
        if not -len(shape) <= batch_dim < len(shape):
            raise Unsupported("K0036", f"vmap in_dim {batch_dim} out of range for a {len(shape)}-d tensor")
        d = batch_dim % len(shape)
        del shape[d], stride[d]
    elem = torch.empty_strided(shape, stride, dtype=fake.dtype, device="meta")
    if differentiable and (fake.is_floating_point() or fake.is_complex()):
        elem.requires_grad_(True)
    return FakeTensor(elem, fake.fake_device)


# --- functional_call ---------------------------------------------------------------------
class FunctionalCallValue(V.Value):
    """``torch.func.functional_call(module, tensors, args, kwargs)``."""

    def __init__(self, fn):
        self.fn = fn

    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise Unsupported("K0037", f"functional_call: {e}")
        bound.apply_defaults()
        a = bound.arguments
        module, dicts = a["module"], a["parameter_and_buffer_dicts"]
        if not isinstance(module, V.ModuleValue) or module.source is None:
            raise Unsupported("K0037", "functional_call of something other than a module read from a source")
        tie, strict = a["tie_weights"].const() if isinstance(a["tie_weights"], V.Value) else a["tie_weights"], \
            a["strict"].const() if isinstance(a["strict"], V.Value) else a["strict"]
        given = _given_tensors(dicts)
        _check_names(tx, module, given, tie, strict)
        call_args = _call_args(a["args"])
        call_kwargs = _call_kwargs(a["kwargs"])
        return call_with_tensors(tx, module, given, call_args, call_kwargs)


def _given_tensors(dicts) -> dict:
    items = dicts.items if isinstance(dicts, (V.TupleValue, V.ListValue)) else [dicts]
    given: dict = {}
    for d in items:
        if not isinstance(d, V.DictValue):
            raise Unsupported("K0037", "functional_call with parameters that are not a dict")
        for k, v in d.items.items():
            if not isinstance(k, str) or k in given:
                raise Unsupported("K0037", f"functional_call parameter name {k!r} (repeated or not a string)")
            if not isinstance(v, V.TensorValue):
                raise Unsupported("K0037", f"functional_call with {k!r} given as {v}")
            given[k] = v
    return given


def _call_args(v):
    if v is None or isinstance(v, V.ConstantValue) and v.value is None:
        return []
    if type(v) is V.TupleValue:
        return list(v.items)
    return [v]


def _call_kwargs(v):
    if v is None or isinstance(v, V.ConstantValue) and v.value is None:
        return {}
    if not isinstance(v, V.DictValue):
        raise Unsupported("K0037", "functional_call kwargs that are not a dict")
    return dict(v.items)


def _tensor_names(mod) -> dict:
    """name -> tensor for every parameter and buffer, tied ones under each name."""
    named = dict(mod.named_parameters(remove_duplicate=False))
    named.update(mod.named_buffers(remove_duplicate=False))
    return named


def tie_groups(mod) -> tuple:
    """The names that share a tensor, as sorted groups (what ``tie_weights`` follows)."""
    by_id: dict = {}
    for name, t in _tensor_names(mod).items():
        by_id.setdefault(id(t), []).append(name)
    return tuple(sorted(tuple(sorted(g)) for g in by_id.values() if len(g) > 1))


def _check_names(tx, module, given, tie, strict):
    """The names must be the module's parameters and buffers (other names make eager set
    new attributes), with ties followed as eager follows them, guarded."""
    mod = module.mod
    from torch.nn.utils import parametrize

    if any(parametrize.is_parametrized(m) for m in mod.modules()):
        raise Unsupported("K0037", "functional_call of a parametrized module")
    names = _tensor_names(mod)
    unknown = [k for k in given if k not in names]
    if unknown or strict and set(names) - set(given):
        raise Unsupported("K0037", f"functional_call names {unknown or sorted(set(names) - set(given))} "
                          "that are not the module's parameters and buffers")
    if tie:
        groups = tie_groups(mod)
        g = tx.output.guards
        src = module.source
        g.expression(f"{g.const(tie_groups, 'fn')}({src.expr()}) == {g.const(groups, 'c')}",
                     f"{src.pretty()} ties the same parameters and buffers")
        for group in groups:
            present = [n for n in group if n in given]
            if present and any(given[n] is not given[present[0]] for n in present):
                raise Unsupported("K0037", "functional_call with different tensors for tied names")
            for n in group:
                if present and n not in given:
                    given[n] = given[present[0]]


def call_with_tensors(tx, module, given: dict, args, kwargs):
    """Call ``module`` with ``given`` read in place of the parameters and buffers they
    name, then put the module's own back."""
    saved = []
    try:
        for name, tv in given.items():
            owner = module
            *path, leaf = name.split(".")
            for part in path:
                owner = owner.getattr(tx, part)
                if not isinstance(owner, V.ModuleValue):
                    raise Unsupported("K0037", f"functional_call name {name!r} does not name a submodule")
            saved.append((owner, leaf, owner.attrs.get(leaf, _MISSING)))
            owner.attrs[leaf] = tv
            owner.functional_overrides = getattr(owner, "functional_overrides", 0) + 1
        return module.call(tx, args, kwargs)
    finally:
        for owner, leaf, before in reversed(saved):
            if before is _MISSING:
                owner.attrs.pop(leaf, None)
            else:
                owner.attrs[leaf] = before
            owner.functional_overrides -= 1


_MISSING = object()
