"""Guards: the assumptions a compiled entry was traced under, checked on every call.

Each guard is one Python boolean expression over the frame's inputs (see sources.py),
kept with a plain-words description. A cache entry compiles all of its guards into the
head of one generated function (``codegen.py``), so a call pays one ``and`` chain. When
every entry misses, ``first_failure`` re-evaluates an entry's guards one by one to say
which assumption broke — that is what ``KILN_LOGS=recompiles`` prints.
"""
from __future__ import annotations

import keyword
import math
import types
from dataclasses import dataclass, field

import torch

from kiln.capture import global_state, native_guards
from kiln.capture import guard_program as P
from kiln.capture.fake import autograd_standing
from kiln.capture.sources import AttrSource, Source


@dataclass
class Guard:
    code: str  # a boolean expression in the entry namespace
    description: str  # what it checks, in the user's names
    lhs: str | None = None  # expression whose actual value explains a failure


@dataclass
class GuardSet:
    """Guards in the order they were added, without duplicates; constants they compare
    against live in ``consts`` under generated names."""

    guards: list[Guard] = field(default_factory=list)
    consts: dict[str, object] = field(default_factory=dict)
    _seen: set = field(default_factory=set)
    _const_ids: dict = field(default_factory=dict)
    _reserved: set = field(default_factory=set)
    #: source expression -> (native_guards spec, the guard codes it stands for)
    tensor_specs: dict = field(default_factory=dict)
    #: guard code -> the same guard as checks on access paths (guard_program.py)
    programs: dict = field(default_factory=dict)

    def const(self, obj, hint="c") -> str:
        key = id(obj)
        name = self._const_ids.get(key)
        if name is None:
            n = len(self.consts)
            name = f"__{hint}{n}"
            while name in self.consts or name in self._reserved:
                n += 1
                name = f"__{hint}{n}"
            self.consts[name] = obj
            self._const_ids[key] = name
        return name

    def reserve(self, name: str) -> None:
        """``name`` is the entry code's own (``EntryCodegen``): the constants, which
        join the same namespace, never take it."""
        self._reserved.add(name)

    def add(self, code: str, description: str, lhs: str | None = None, checks=None):
        """``checks``: the guard as ((source or path, op, a, b), ...), for
        ``guard_program``; left out where a source is not a plain access path."""
        if code in self._seen:
            return
        self._seen.add(code)
        self.guards.append(Guard(code, description, lhs))
        if checks:
            paths = [c[0] if type(c[0]) is tuple else P.path_of(c[0]) for c in checks]
            if None not in paths:
                self.programs[code] = tuple((p, *c[1:]) for p, c in zip(paths, checks))

    def drop_since(self, first: int) -> None:
        """Forget the guards added from index ``first`` on (a value whose guards another
        one implies: an ndarray's tensor view, a random draw's result), with the
        tensor specs and programs that stood for them."""
        dropped = {g.code for g in self.guards[first:]}
        self._seen -= dropped
        del self.guards[first:]
        for e in [e for e, (_, codes) in self.tensor_specs.items() if dropped.intersection(codes)]:
            del self.tensor_specs[e]
        for code in dropped:
            self.programs.pop(code, None)

    # --- one builder per kind of guard --------------------------------------------
    def type_is(self, src: Source, cls) -> str:
        e = src.expr()
        code = f"type({e}) is {self.const(cls, 'T')}"
        self.add(code, f"type({src.pretty()}) is {cls.__qualname__}", f"type({e})",
                 [(src, P.TYPE_IS, cls, None)])
        return code

    def identity(self, src: Source, obj):
        e = src.expr()
        # bound builtin methods are new objects on every read: compare them with ==
        op = "==" if type(obj).__name__ in ("builtin_function_or_method", "method-wrapper") and getattr(obj, "__self__", None) is not None and not isinstance(obj.__self__, type(torch)) else "is"
        self.add(f"{e} {op} {self.const(obj, 'O')}",
                 f"{src.pretty()} is the same object as when compiled ({_short(obj)})", e,
                 [(src, P.EQ if op == "==" else P.IS, obj, None)])

    def constant_tuple(self, src: Source, value: tuple):
        """A tuple of constants (``builder.constant_tuple``: a convolution's stride, a
        shape argument): the tuple read at trace time itself, or one equal to it item by
        item in types and values (``same_value``). One guard, usually an identity test
        (a module keeps its attribute's tuple), where item by item it was 2 + 2n: type,
        length, then each item's type and value."""
        e, c = src.expr(), self.const(value, 'v')
        self.add(f"{e} is {c} or {self.const(same_value, 'same')}({e}, {c})",
                 f"{src.pretty()} == {value!r}", e, [(src, P.IS_OR_CALL, value, same_value)])

    def constant(self, src: Source, value):
        e = src.expr()
        if value is None or value is True or value is False or value is Ellipsis:
            self.add(f"{e} is {value!r}", f"{src.pretty()} is {value!r}", e,
                     [(src, P.IS, value, None)])
            return
        t = type(value)
        if t in (int, str, bytes) or t is float and _plain_float(value):
            self.add(f"type({e}) is {t.__name__} and {e} == {value!r}",
                     f"{src.pretty()} == {value!r}", e, [(src, P.TYPED_EQ, t, value)])
            return
        if t in (float, complex):  # NaN, a signed zero, an infinity
            self.add(f"type({e}) is {t.__name__} and {self.const(same_value, 'same')}({e}, {self.const(value, 'v')})",
                     f"{src.pretty()} is {_float_words(value)}", e,
                     [(src, P.TYPED_CALL, t, (same_value, value))])
            return
        # dtype, device, Size, other hashable constants: equality against a stored copy
        self.equal(src, value)

    def equal(self, src: Source, value, description: str | None = None):
        """``src`` equals ``value`` as the trace saw it: ``==``, unless the value holds
        floats, where NaN must equal NaN and 0.0 must differ from -0.0 (``same_value``)."""
        e = src.expr()
        code, check = self._equality(e, value, "v", P.EQ, P.CALL)
        self.add(code, description or f"{src.pretty()} == {value!r}", e, [(src, *check)])

    def _equality(self, read: str, value, hint: str, eq_op: int, same_op: int):
        """(``read == value`` as code, its program check): ``same_value`` where the value
        holds floats (NaN equal to NaN, 0.0 different from -0.0)."""
        if _holds_float(value):
            return (f"{self.const(same_value, 'same')}({read}, {self.const(value, hint)})",
                    (same_op, value, same_value))
        return f"{read} == {self.const(value, hint)}", (eq_op, value, None)

    def length(self, src: Source, n: int):
        e = src.expr()
        self.add(f"len({e}) == {n}", f"len({src.pretty()}) == {n}", f"len({e})",
                 [(src, P.LEN, n, None)])

    def dict_keys(self, src: Source, keys: tuple):
        e = src.expr()
        code, check = self._equality(f"tuple({e})", keys, "k", P.KEYS, P.KEYS_CALL)
        self.add(code, f"keys of {src.pretty()} == {list(keys)}", f"tuple({e})", [(src, *check)])

    def no_forward_hooks(self, src: Source):
        """An ``nn.Module`` the trace called has no forward (pre-)hooks of its own."""
        e = src.expr()
        self.add(f"not {e}._forward_hooks and not {e}._forward_pre_hooks",
                 f"{src.pretty()} has no forward hooks", None,
                 [(AttrSource(src, "_forward_hooks"), P.FALSY, None, None),
                  (AttrSource(src, "_forward_pre_hooks"), P.FALSY, None, None)])

    def tensor(self, src: Source, t: torch.Tensor, dynamic=(), layout=None):
        """Type, dtype, device, shape, strides and requires_grad: what a trace assumed.
        A static tensor that ``native_guards`` covers also gets a spec in
        ``tensor_specs``, naming the guards here that its check stands for."""
        e = src.expr()
        p = src.pretty()
        plain = [self.type_is(src, type(t))]    # the guards a native spec stands for
        plain.append(f"{e}.dtype is {self.const(t.dtype, 'dt')}")
        self.add(plain[-1], f"{p}.dtype is {t.dtype}", f"{e}.dtype")
        plain.append(f"{e}.device == {self.const(t.device, 'dev')}")
        self.add(plain[-1], f"{p}.device == {t.device}", f"{e}.device")
        shape = tuple(t.shape)
        if dynamic:   # its sizes: the size guards (kiln/shapes); its layout: contiguous
            self.add(f"{e}.dim() == {t.dim()}", f"{p}.dim() == {t.dim()}", f"{e}.dim()")
            if layout is None:
                self.add(f"{e}.is_contiguous()", f"{p} is contiguous", f"{e}.stride()")
            for code, words in layout or ():   # a permuted dense layout, stride by stride
                self.add(code, words, code.split(" == ")[0])
            for d, n in enumerate(shape):
                if d not in dynamic:
                    self.add(f"{e}.size({d}) == {n}", f"{p}.size({d}) == {n}", f"{e}.size({d})")
        else:
            stride = tuple(t.stride())
            plain.append(f"{e}.shape == {shape!r}")
            self.add(plain[-1], f"{p}.shape == {shape}", f"tuple({e}.shape)")
            plain.append(f"{e}.stride() == {stride!r}")
            self.add(plain[-1], f"{p}.stride() == {stride}", f"{e}.stride()")
        rg = bool(t.requires_grad)
        plain_rg = not rg or isinstance(t, torch.nn.Parameter)
        if plain_rg:
            # a parameter (its type guarded above) is a leaf
            plain.append(f"{e}.requires_grad is {rg}")
            self.add(plain[-1], f"{p}.requires_grad is {rg}", f"{e}.requires_grad")
        elif t.is_leaf:     # in-place ops on it are refused: a trace assumed one or the other
            self.add(f"{e}.requires_grad is True and {e}.is_leaf",
                     f"{p}.requires_grad is True, a leaf", f"({e}.requires_grad, {e}.is_leaf)")
        else:
            standing = autograd_standing(t)
            what = "a view of a leaf" if standing == 1 else "not a leaf"
            self.add(f"{e}.requires_grad is True and {self.const(autograd_standing, 'f')}({e}) == {standing}",
                     f"{p}.requires_grad is True, {what}", f"({e}.requires_grad, {e}.is_leaf)")
        if not dynamic and native_guards.covers(t):
            self.tensor_specs[e] = (native_guards.spec_of(t, rg if plain_rg else None), tuple(plain))

    def grad_mode(self, enabled: bool):
        self.add(f"__torch.is_grad_enabled() is {enabled}",
                 f"torch.is_grad_enabled() is {enabled}", "__torch.is_grad_enabled()",
                 [((("ns", "__torch"), ("attr", "is_grad_enabled"), ("call",)), P.IS, enabled, None)])

    def class_attr(self, cls, name: str):
        """``cls.name`` is still what the trace found there (a method it inlined, a
        property it ran, a class attribute it folded): swapping one on the class is a
        recompile. Read as Python reads it from the class, so a name shadowed later in
        the MRO fails too."""
        try:
            first, second = getattr(cls, name), getattr(cls, name)
        except Exception:  # noqa: BLE001  (a descriptor that refuses class access)
            return
        t = self.const(cls, "T")
        read = f"{t}.{name}" if name.isidentifier() and not keyword.iskeyword(name) \
            else f"getattr({t}, {name!r})"
        path = (("ns", t), ("attr", name))
        if first is second:
            code = f"{read} is {self.const(first, 'O')}"
            check = (path, P.IS, first, None)
        elif isinstance(first, types.MethodType) and first.__func__ is second.__func__:
            read += ".__func__"      # a classmethod: bound anew on every read
            code = f"{read} is {self.const(first.__func__, 'O')}"
            check = (path + (("attr", "__func__"),), P.IS, first.__func__, None)
        else:
            return
        self.add(code, f"{cls.__qualname__}.{name} is the same object as when compiled ({_short(first)})",
                 read, [check])

    def global_state(self, state: tuple):
        fn = self.const(global_state.snapshot, 'state')
        self.add(f"{fn}() == {self.const(state, 'S')}",
                 f"global torch state is ({global_state.describe(state)})", f"{fn}()",
                 [((("ns", fn), ("call",)), P.EQ, state, None)])

    def expression(self, code: str, description: str, lhs: str | None = None):
        self.add(code, description, lhs)


def same_value(a, b) -> bool:
    """Equality as a trace depends on it: types equal, NaN equal to NaN, 0.0 different
    from -0.0 (``math.copysign``, ``1 / x``, ``str`` tell them apart), containers item by
    item (dicts and sets too, in their order); anything else by ``==``."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    rule = _SAME_RULES.get(t)
    if rule is not None:
        return rule(a, b)
    if isinstance(a, dict):
        return _same_items(tuple(a.items()), tuple(b.items()))
    return bool(a == b)


def _same_float(a, b):
    if a != a:
        return b != b
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _same_items(a, b):
    return len(a) == len(b) and all(map(same_value, a, b))


_SAME_RULES = {
    float: _same_float,
    complex: lambda a, b: _same_float(a.real, b.real) and _same_float(a.imag, b.imag),
    tuple: _same_items,
    list: _same_items,
    set: lambda a, b: _same_items(tuple(a), tuple(b)),
    frozenset: lambda a, b: _same_items(tuple(a), tuple(b)),
    slice: lambda a, b: _same_items((a.start, a.stop, a.step), (b.start, b.stop, b.step)),
}


def _plain_float(x: float) -> bool:
    """Compared exactly by ``==`` and written exactly by ``repr``: finite and nonzero."""
    return x == x and x != 0.0 and abs(x) != math.inf


def _holds_float(value) -> bool:
    t = type(value)
    if t in (float, complex):
        return True
    if t in (tuple, list, set, frozenset):
        return any(_holds_float(x) for x in value)
    if isinstance(value, dict):
        return any(_holds_float(k) or _holds_float(v) for k, v in value.items())
    if t is slice:
        return _holds_float((value.start, value.stop, value.step))
    return False


def _float_words(x) -> str:
    return "NaN" if x != x else repr(x)


def _short(obj) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return name if isinstance(name, str) else type(obj).__qualname__


def first_failure(guards: list[Guard], namespace: dict, args: dict) -> str | None:
    """Plain words for the first guard that fails on these arguments (slow path only)."""
    env = dict(namespace)
    env.update(args)
    for g in guards:
        try:
            ok = eval(g.code, env)
        except Exception as ex:  # the source itself no longer resolves
            return f"{g.description} (could not be checked: {type(ex).__name__}: {ex})"
        if not ok:
            got = ""
            if g.lhs is not None:
                try:
                    got = f" (got {eval(g.lhs, env)!r})"
                except Exception:
                    pass
            return f"{g.description}{got}"
    return None
