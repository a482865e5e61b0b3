"""``nn.Module`` during a trace: attribute lookup through ``_parameters``, ``_buffers``
and ``_modules``, calls with hooks, and the container modules (Sequential, ModuleList,
ModuleDict)."""
from __future__ import annotations

import torch
import torch.nn as nn

from kiln.capture import values as V
from kiln.capture.builder import wrap, wrap_class_attr
from kiln.capture.errors import Unsupported
from kiln.capture.sources import AttrSource, ItemSource


class _ModuleIterMethod(V.Value):
    """``m.parameters()``, ``m.named_children()``… answered from the module tree
    directly (PyTorch's own versions use generators over sets of modules)."""

    def __init__(self, mv, name):
        self.mv = mv
        self.name = name

    def call(self, tx, args, kwargs):
        ba = {k: v.const() for k, v in kwargs.items()}
        pos = [a.const() for a in args]
        return V.IteratorValue(_iter_items(tx, self.mv, self.name, pos, ba))


_ITER_METHODS = ("parameters", "named_parameters", "buffers", "named_buffers", "children",
                 "named_children", "modules", "named_modules")


def _iter_items(tx, mv, name, pos, kw):
    mod = mv.mod
    named = name.startswith("named_")
    kind = name[len("named_"):] if named else name
    if kind in ("parameters", "buffers"):
        prefix = kw.get("prefix", pos[0] if named and pos else "")
        recurse = kw.get("recurse", pos[0] if (not named and pos) else (pos[1] if named and len(pos) > 1 else True))
        table = "_parameters" if kind == "parameters" else "_buffers"
        out, seen = [], set()
        mods = _walk(tx, mv, "") if recurse else [("", mv)]
        for mprefix, sub in mods:
            if getattr(sub, "functional_overrides", 0):
                raise Unsupported("K0037", f"nn.Module.{name}() inside torch.func.functional_call")
            for k, t in sub.mod.__dict__[table].items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                v = wrap(tx, t, ItemSource(AttrSource(sub.source, table), k) if sub.source is not None else None)
                full = (prefix + "." if prefix else "") + (mprefix + "." if mprefix else "") + k
                out.append(V.TupleValue([V.ConstantValue(full), v]) if named else v)
        return out
    if kind == "children":
        out = []
        for k, m in mod._modules.items():
            if m is None:
                continue
            v = _submodule(tx, mv, k)
            out.append(V.TupleValue([V.ConstantValue(k), v]) if named else v)
        return out
    if kind == "modules":
        prefix = kw.get("prefix", pos[1] if len(pos) > 1 else "")
        return [V.TupleValue([V.ConstantValue((prefix + "." + p if prefix and p else prefix or p)), v]) if named else v
                for p, v in _walk(tx, mv, "")]
    raise Unsupported("K0038", f"nn.Module.{name}")


def _walk(tx, mv, prefix, seen=None):
    seen = seen if seen is not None else set()
    if id(mv.mod) in seen:
        return []
    seen.add(id(mv.mod))
    out = [(prefix, mv)]
    for k, m in mv.mod._modules.items():
        if m is None:
            continue
        out += _walk(tx, _submodule(tx, mv, k), (prefix + "." if prefix else "") + k, seen)
    return out


@V.rule
def module_getattr(tx, mv, name):
    """Parameters, buffers and submodules, as ``nn.Module.__getattr__`` finds them;
    None when the name is none of those."""
    mod = mv.mod
    src = mv.source
    if name in _ITER_METHODS and name not in mod.__dict__ and getattr(type(mod), name) is getattr(nn.Module, name):
        return _ModuleIterMethod(mv, name)
    for table in ("_parameters", "_buffers", "_modules"):
        d = mod.__dict__.get(table)
        if d is not None and name in d:
            v = d[name]
            s = ItemSource(AttrSource(src, table), name) if src is not None else None
            if v is None:
                if s is not None:
                    tx.output.guards.constant(s, None)
                return V.ConstantValue(None)
            return wrap(tx, v, s)
    return None


def _hooks_guard(tx, mv):
    if mv.source is None:
        return
    tx.output.guards.no_forward_hooks(mv.source)


@V.rule
def call_module(tx, mv, args, kwargs):
    mod = mv.mod
    pre = list(mod._forward_pre_hooks.items())
    post = list(mod._forward_hooks.items())
    if (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks):
        raise Unsupported("K0038", "global module hooks")
    if mod._forward_hooks_with_kwargs or mod._forward_pre_hooks_with_kwargs:
        raise Unsupported("K0038", "module hooks with kwargs")
    if not pre and not post:
        _hooks_guard(tx, mv)
    elif mv.source is not None:
        e = mv.source.expr()
        tx.output.guards.expression(
            f"tuple({e}._forward_pre_hooks.values()) == {tx.output.guards.const(tuple(h for _, h in pre), 'h')} and "
            f"tuple({e}._forward_hooks.values()) == {tx.output.guards.const(tuple(h for _, h in post), 'h')}",
            f"{mv.source.pretty()} has the same forward hooks")
    def hook_value(table, key, h):
        src = ItemSource(AttrSource(mv.source, table), key) if mv.source is not None else None
        return wrap(tx, h, src)

    for key, h in pre:
        r = hook_value("_forward_pre_hooks", key, h).call(tx, [mv, V.TupleValue(args)], {})
        if not (isinstance(r, V.ConstantValue) and r.value is None):
            args = r.items if isinstance(r, V.TupleValue) else [r]
    if "forward" in mod.__dict__:
        fwd = wrap(tx, mod.__dict__["forward"], AttrSource(mv.source, "forward") if mv.source else None)
    else:
        fwd = wrap_class_attr(tx, mv, type(mod), "forward")
    out = fwd.call(tx, args, kwargs)
    for key, h in post:
        r = hook_value("_forward_hooks", key, h).call(tx, [mv, V.TupleValue(args), out], {})
        if not (isinstance(r, V.ConstantValue) and r.value is None):
            out = r
    return out


def _submodule(tx, mv, key):
    mod = mv.mod
    s = ItemSource(AttrSource(mv.source, "_modules"), key) if mv.source is not None else None
    return wrap(tx, mod._modules[key], s)


def _guard_keys(tx, mv):
    if mv.source is not None:
        tx.output.guards.dict_keys(AttrSource(mv.source, "_modules"), tuple(mv.mod._modules.keys()))


@V.rule
def module_items(tx, mv):
    mod = mv.mod
    if isinstance(mod, (nn.Sequential, nn.ModuleList)):
        _guard_keys(tx, mv)
        return [_submodule(tx, mv, k) for k in mod._modules]
    if isinstance(mod, nn.ModuleDict):
        _guard_keys(tx, mv)
        return [V.ConstantValue(k) for k in mod._modules]
    if isinstance(mod, (nn.ParameterList,)):
        return [wrap(tx, p, ItemSource(AttrSource(mv.source, "_parameters"), k)) for k, p in mod._parameters.items()]
    from kiln.capture.objects import object_unpack

    return object_unpack(tx, mv)


@V.rule
def module_getitem(tx, mv, k):
    mod = mv.mod
    key = k.const()
    if isinstance(mod, (nn.Sequential, nn.ModuleList)):
        _guard_keys(tx, mv)
        keys = list(mod._modules)
        if isinstance(key, slice):
            return V.ListValue([_submodule(tx, mv, k) for k in keys[key]]) if isinstance(mod, nn.ModuleList) \
                else _SlicedSequential([_submodule(tx, mv, k) for k in keys[key]])
        return _submodule(tx, mv, keys[key])
    if isinstance(mod, nn.ModuleDict):
        _guard_keys(tx, mv)
        return _submodule(tx, mv, key)
    if isinstance(mod, nn.ParameterList):
        return wrap(tx, mod[key], ItemSource(AttrSource(mv.source, "_parameters"), str(key)))
    from kiln.capture.objects import call_dunder

    return call_dunder(tx, mv, "__getitem__", [k], {})


del torch


class _SlicedSequential(V.Value):
    """``seq[1:3]``: a Sequential over some of the submodules, callable and iterable."""

    def __init__(self, mods):
        self.mods = mods

    def python_type(self):
        return nn.Sequential

    def unpack(self, tx):
        return list(self.mods)

    def call(self, tx, args, kwargs):
        x = args[0]
        for m in self.mods:
            x = m.call(tx, [x], {})
        return x
