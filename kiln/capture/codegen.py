"""The generated entry function: guards, the graph call, side effects, and either the
return value or the graph break (the unsupported step run as plain Python, then the
resume function).

It is ordinary Python source, printable with ``KILN_LOGS=bytecode``, compiled with
``exec`` into a function that has the same parameters as the user's frame. Values are
rebuilt from graph outputs (``__o[i]``), from their sources, or from constants kept in
the namespace.
"""
from __future__ import annotations

import functools
import types

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.sources import LocalSource

MISS = object()  # returned by an entry whose guards fail

_LITERAL_TYPES = (int, float, bool, str, bytes, type(None))


class EntryCodegen:
    def __init__(self, output, namespace: dict):
        self.output = output
        self.ns = namespace
        self.lines: list[str] = []
        self.graph_outputs: list = []  # TensorValues the graph must return
        self._out_index: dict = {}
        self._input_nodes = {node: src for src, node, _ in output.inputs}
        self._temps: dict = {}
        self._n = 0
        self.reads: list[str] = []  # source reads hoisted before the side effects
        self._read_names: dict = {}
        self.continues = False  # a break's entry: the user's code resumes inside it

    # --- namespace helpers -------------------------------------------------------------
    def ref(self, obj, hint="r") -> str:
        for k, v in self.ns.items():
            if v is obj and k.startswith("__"):
                return k
        name = self._fresh(hint)
        self.ns[name] = obj
        return name

    def temp(self) -> str:
        return self._fresh("t")

    def _fresh(self, hint: str) -> str:
        """A name no other part of the entry uses: not in the namespace (another
        codegen's over the same namespace), not a guard's constant, which joins the
        namespace later (``GuardSet.reserve`` keeps the guards off it in turn)."""
        guards = self.output.guards
        while True:
            name = f"__{hint}{self._n}"
            self._n += 1
            if name not in self.ns and name not in guards.consts:
                guards.reserve(name)
                return name

    def read(self, src) -> str:
        """``src`` as it was on entry. When the program writes state, every read is
        hoisted before the writes: a value read from ``o.t`` before ``o.t = new`` is
        the old object, and a mutation applies to the object the program mutated."""
        if not self.output.mutated or isinstance(src, LocalSource):
            return src.expr()
        e = src.expr()
        name = self._read_names.get(e)
        if name is None:
            name = self._read_names[e] = self.temp()
            self.reads.append(f"{name} = {e}")
        return name

    # --- graph outputs -----------------------------------------------------------------
    def need(self, v, seen=None):
        """Walk a value and register the graph-computed tensors it contains."""
        seen = seen if seen is not None else set()
        if id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, V.TensorValue):
            if v.node not in self._input_nodes and id(v) not in self._out_index:
                self._out_index[id(v)] = len(self.graph_outputs)
                self.graph_outputs.append(v)
        elif isinstance(v, (V._Sequence,)):
            for i in v.items:
                self.need(i, seen)
        elif isinstance(v, V.DictValue):
            for i in v.items.values():
                self.need(i, seen)
            for i in getattr(v, "attrs", {}).values():  # dataclass dicts
                self.need(i, seen)
        elif isinstance(v, V.ObjectValue):
            for i in v.attrs.values():
                if isinstance(i, V.ConstantValue) and type(i.value) is object:
                    continue
                self.need(i, seen)
        elif isinstance(v, V.MethodValue):
            self.need(v.self_value, seen)
            self.need(v.func, seen)
        elif isinstance(v, V.ExceptionValue):
            for i in v.args + list(v.attrs.values()):
                self.need(i, seen)
        elif hasattr(v, "referenced"):  # iterators, dict views
            for i in v.referenced():
                self.need(i, seen)
        elif hasattr(v, "func") and hasattr(v, "args"):  # partial
            self.need(v.func, seen)
            for i in v.args:
                self.need(i, seen)
            for i in v.kwargs.values():
                self.need(i, seen)
        elif hasattr(v, "written"):  # RealCell
            if v.written is not None:
                self.need(v.written, seen)

    # --- rebuilding values -----------------------------------------------------------
    def expr(self, v) -> str:
        t = self._temps.get(id(v))
        if t is not None:
            return t
        if isinstance(v, V.LazyArg):
            return self.read(v.source)
        if isinstance(v, V.SymIntValue):    # a size returned or stored: fixed by a guard
            return repr(v.const())
        if isinstance(v, V.TupleValue) and v.python_type() is torch.Size:   # a symbolic shape
            return self.ref(v.const(), "c")
        if isinstance(v, V.TensorValue):
            src = self._input_nodes.get(v.node)
            if src is not None:
                return self.read(src)
            return f"__o[{self._out_index[id(v)]}]"
        if isinstance(v, V.ConstantValue):
            val = v.value
            if type(val) in _LITERAL_TYPES and (type(val) is not float or val == val and abs(val) != float("inf")):
                return repr(val)
            return self.ref(val, "c")
        if isinstance(v, V.NamedTupleValue):
            items = ", ".join(self.expr(i) for i in v.items)
            cls = self.ref(v.cls, "cls")
            if hasattr(v.cls, "_fields"):
                return f"{cls}({items})"
            return f"{cls}(({items},))"
        if isinstance(v, V.TupleValue):
            if v.source is not None and not getattr(v, "_changed", False):
                return self.read(v.source)
            items = ", ".join(self.expr(i) for i in v.items)
            return f"({items},)" if v.items else "()"
        if hasattr(v, "rebuild_kwargs"):
            return self._new_dataclass_dict(v)
        if isinstance(v, (V.ListValue, V.DictValue, V.SetValue)):
            if v.source is not None:
                return self.read(v.source)
            return self._new_mutable(v)
        if isinstance(v, V.NewObjectValue):
            return self._new_object(v)
        if isinstance(v, (V.ObjectValue,)):
            if getattr(v, "made_in_trace", False):
                raise Unsupported("K0021", f"{v} made in the compiled region outlives it (eager makes a new one per call)")
            if v.source is None:
                if v.obj is not None and not v.attrs:
                    return self.ref(v.obj, "obj")  # the same real object, unchanged
                raise Unsupported("K0021", f"rebuilding {v}")
            return self.read(v.source)
        if isinstance(v, (V.UserFunctionValue, V.BuiltinValue, V.TorchFunctionValue)):
            return self.read(v.source) if v.source is not None else self.ref(v.fn, "f")
        if isinstance(v, V.ClassValue):
            return self.read(v.source) if v.source is not None else self.ref(v.cls, "cls")
        if isinstance(v, V.PythonModuleValue):
            return self.read(v.source) if v.source is not None else self.ref(v.mod, "m")
        if isinstance(v, V.MethodValue):
            if v.source is not None:
                return self.read(v.source)
            fn = v.func
            if isinstance(fn, (V.BuiltinValue, V.TorchFunctionValue)):
                name = getattr(fn.fn, "__name__", None)
                return f"{self.expr(v.self_value)}.{name}"
            return f"{self.ref(types.MethodType, 'types')}({self.expr(fn)}, {self.expr(v.self_value)})"
        if isinstance(v, V.NestedFunctionValue):
            if v.__dict__.get("attrs"):
                raise Unsupported("K0021", "rebuilding a function whose attributes were set inside the compiled region")
            if v.closure:
                raise Unsupported("K0021", "rebuilding a closure created inside the compiled region")
            defaults = "None" if not v.defaults else "(" + ", ".join(self.expr(d) for d in v.defaults) + ",)"
            fn = f"{self.ref(types.FunctionType, 'types')}({self.ref(v.code, 'code')}, {self.ref(v.f_globals, 'g')}, {v.qualname!r}, {defaults})"
            if v.kwdefaults:
                raise Unsupported("K0021", "rebuilding a nested function with keyword defaults")
            return fn
        if isinstance(v, V.ExceptionValue):
            if not v.attrs and not v.custom_init:
                return f"{self.ref(v.cls, 'cls')}({', '.join(self.expr(a) for a in v.args)})"
            args = "".join(self.expr(a) + ", " for a in v.args)
            attrs = ", ".join(f"{k!r}: {self.expr(a)}" for k, a in v.attrs.items())
            return f"{self.ref(made_exception, 'exc')}({self.ref(v.cls, 'cls')}, ({args}), {{{attrs}}})"
        if hasattr(v, "rebuild"):  # iterators, dict views
            return self._rebuilt(v)

        if isinstance(v, V.ExitValue) and isinstance(v.ctx, V.GradModeValue):
            return f"{self.ref(grad_mode_exit, 'gexit')}({v.ctx.enabled}, {v.ctx.prev})"
        if isinstance(v, V.ExitValue) and hasattr(v.ctx, "exit_expr"):
            return v.ctx.exit_expr(self)
        if isinstance(v, V.SuperValue):
            raise Unsupported("K0021", "rebuilding super()")
        if hasattr(v, "fn") and not hasattr(v, "code"):  # special kiln functions
            return self.ref(v.fn, "f")
        if hasattr(v, "func") and hasattr(v, "kwargs"):  # partial
            import functools

            args = "".join(self.expr(a) + ", " for a in v.args)
            kw = "".join(f"{k}={self.expr(a)}, " for k, a in v.kwargs.items())
            return f"{self.ref(functools.partial, 'partial')}({self.expr(v.func)}, {args}{kw})"
        raise Unsupported("K0021", f"rebuilding {v} after the graph")

    def _new_mutable(self, v):
        name = self.temp()
        self._temps[id(v)] = name
        if isinstance(v, V.ListValue):
            body = "[" + ", ".join(self.expr(i) for i in v.items) + "]"
        elif isinstance(v, V.SetValue):
            body = "{" + ", ".join(repr(i) if type(i) in _LITERAL_TYPES else self.ref(i, 'c') for i in v.items) + "}" if v.items else "set()"
        else:
            inner = "{" + ", ".join(f"{self.key(k)}: {self.expr(i)}" for k, i in v.items.items()) + "}"
            factory = f"{v.factory_expr(self)}, " if hasattr(v, "factory_expr") else ""
            body = inner if v.cls is dict else f"{self.ref(v.cls, 'cls')}({factory}{inner})"
        self.lines.append(f"{name} = {body}")
        return name

    def _rebuilt(self, v):
        """An iterator or a view, made once (aliases stay one object)."""
        text = v.rebuild(self)
        name = self.temp()
        self._temps[id(v)] = name
        self.lines.append(f"{name} = {text}")
        return name

    def _new_dataclass_dict(self, v):
        kw = v.rebuild_kwargs()
        if kw is None:
            raise Unsupported("K0021", f"rebuilding {v}: its items and attributes no longer agree")
        name = self.temp()
        self._temps[id(v)] = name
        args = ", ".join(f"{k}={self.expr(a)}" for k, a in kw.items())
        self.lines.append(f"{name} = {self.ref(v.cls, 'cls')}({args})")
        return name

    def key(self, k):
        if type(k) in _LITERAL_TYPES and (type(k) is not float or k == k and abs(k) != float("inf")):
            return repr(k)
        return self.ref(k, "k")

    def _new_object(self, v):
        name = self.temp()
        self._temps[id(v)] = name
        cls = self.ref(v.cls, "cls")
        self.lines.append(f"{name} = {cls}.__new__({cls})")
        for k, a in v.attrs.items():
            self.lines.append(f"object.__setattr__({name}, {k!r}, {self.expr(a)})")
        return name

    # --- side effects ------------------------------------------------------------------
    def side_effects(self):
        """Apply the program's mutations to the real objects. All new values are
        computed first (they may read state that a later write changes), then written."""
        compute, apply = [], []

        def val(expr):
            t = self.temp()
            compute.append(f"{t} = {expr}")
            return t

        for m in self.output.mutated:
            if hasattr(m, "write_back"):  # a Value that writes its own changes
                m.write_back(self, val, apply)
            elif isinstance(m, tuple) and m[0] == "call":  # a deferred call (logging)
                _, fn, args, kwargs = m
                parts = [self.expr(a) for a in args] + [f"{k}={self.expr(a)}" for k, a in kwargs.items()]
                apply.append(f"{self.ref(fn, 'f')}({', '.join(parts)})")
            elif isinstance(m, tuple) and m[0] == "global":
                v = val(self.expr(self.output.global_writes[m[1]]))
                apply.append(f"__G[{m[1]!r}] = {v}")
            elif hasattr(m, "written"):  # RealCell
                v = val(self.expr(m.written))
                apply.append(f"{m.source.expr()} = {v}")
            elif isinstance(m, V.ListValue):
                v = val("[" + ", ".join(self.expr(i) for i in m.items) + "]")
                apply.append(f"{self.read(m.source)}[:] = {v}")
            elif isinstance(m, V.DictValue):
                inner = ", ".join(f"{self.key(k)}: {self.expr(i)}" for k, i in m.items.items())
                v = val("{" + inner + "}")
                t = self.temp()
                apply.append(f"{t} = {self.read(m.source)}; {t}.clear(); {t}.update({v})")
            elif isinstance(m, V.SetValue):
                v = val("[" + ", ".join(self.key(i) for i in m.items) + "]")
                t = self.temp()
                apply.append(f"{t} = {self.read(m.source)}; {t}.clear(); {t}.update({v})")
            elif isinstance(m, V.ObjectValue):
                for k, a in m.attrs.items():
                    if a is V.DELETED:
                        apply.append(f"delattr({self.read(m.source)}, {k!r})")
                        continue
                    v = val(self.expr(a))
                    apply.append(f"setattr({self.read(m.source)}, {k!r}, {v})")
            else:
                raise Unsupported("K0022", f"applying a side effect on {m}")
        self.lines += compute + apply

    def mutated_values(self):
        out = []
        for m in self.output.mutated:
            if isinstance(m, tuple) and m[0] == "call":
                out.extend(m[2])
                out.extend(m[3].values())
            elif isinstance(m, tuple):
                out.append(self.output.global_writes[m[1]])
            elif hasattr(m, "written"):
                out.append(m.written)
            else:
                out.append(m)
        return out


def grad_mode_exit(enabled: bool, prev: bool):
    """The ``__exit__`` of a grad-mode with-block entered before a graph break: a real
    context manager that restores ``prev`` when the resumed code leaves the block."""
    cm = torch.enable_grad() if enabled else torch.no_grad()
    cm.prev = prev
    return cm.__exit__


def made_exception(cls, args, attrs):
    """An exception the program made whose ``__init__`` is Python code: its state as the
    trace left it (``args``, attributes), without running ``__init__`` again."""
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(attrs)
    return e


def call_source(code) -> str:
    """Arguments passing a frame's parameters on: ``a, b, *args, c=c, **kw``."""
    names = code.co_varnames
    n = code.co_argcount
    k = code.co_kwonlyargcount
    parts = list(names[:n])
    i = n + k
    if code.co_flags & 0x04:
        parts.append("*" + names[i])
        i += 1
    parts.extend(f"{x}={x}" for x in names[n:n + k])
    if code.co_flags & 0x08:
        parts.append("**" + names[i])
    return ", ".join(parts)


@functools.lru_cache(maxsize=None)
def call_at(filename: str, lineno: int, name: str):
    """``f(*args, **kwargs)``, called from the user's line: a call run at a graph break
    goes through it, so the traceback of an exception it raises shows
    ``File "user.py", line N, in f`` and the user's source line, not kiln's entry."""
    import ast

    tree = ast.parse("def call(__f, /, *args, **kwargs):\n    return __f(*args, **kwargs)\n")
    for node in ast.walk(tree):
        if hasattr(node, "lineno"):  # the whole line, no carets
            node.lineno = node.end_lineno = lineno
            node.col_offset, node.end_col_offset = 0, 10_000
    ns: dict = {}
    exec(compile(tree, filename, "exec"), ns)
    fn = ns["call"]
    fn.__code__ = fn.__code__.replace(co_name=name, co_qualname=name)
    return fn


def restoring_grad_mode(compiled, mode: bool):
    """``compiled`` (a graph), restoring grad mode ``mode`` if it raises: the mode eager
    leaves once the exception has left the grad-mode with-blocks around the failing op
    (the eager backend stops inside them, aot graphs never change it)."""
    def call(*args):
        try:
            return compiled(*args)
        except BaseException:
            torch._C._set_grad_enabled(mode)
            raise

    return call


def param_names(code) -> tuple[str, ...]:
    """Every parameter name of ``code`` (positional, keyword-only, ``*args``, ``**kw``):
    the names the entry function, which takes ``code``'s signature, binds."""
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) \
        + bool(code.co_flags & 0x08)
    return code.co_varnames[:n]


def signature_source(code) -> str:
    """The parameter list of ``code`` as source: ``a, b, /, *args, c, **kw``."""
    names = code.co_varnames
    n = code.co_argcount
    k = code.co_kwonlyargcount
    parts = list(names[:n])
    if code.co_posonlyargcount:
        parts.insert(code.co_posonlyargcount, "/")
    i = n + k
    if code.co_flags & 0x04:
        parts.append("*" + names[i])
        i += 1
    elif k:
        parts.append("*")
    parts.extend(names[n:n + k])
    if code.co_flags & 0x08:
        parts.append("**" + names[i])
    return ", ".join(parts)


def build_entry(code, guard_codes: list[str], body_lines: list[str], namespace: dict, name: str):
    """exec the entry function's source; returns (function, source text)."""
    from kiln.capture.guard_cse import cse_statements

    sig = signature_source(code)
    body_lines = list(body_lines)
    # the graph call, when it comes first, reads its inputs right after the guards
    tail = body_lines[0] if body_lines and body_lines[0].startswith("__o = __graph") else None
    checks, new_tail = cse_statements(list(guard_codes), tail)
    if tail is not None:
        # the call's inputs are gathered inside the try (a failed read there is a miss);
        # the call itself runs outside it, so the graph's own errors reach the caller
        callee, args = new_tail[len("__o = "):].split("(", 1)
        checks.append(f"        __a = ({args[:-1]}{',' if args[:-1].strip() else ''})")
        body_lines[0] = f"__o = {callee}(*__a)"
    src = [f"def {name}({sig}):",
           "    try:"]
    src += checks or ["        pass"]
    src += ["    except Exception:",
            "        return __MISS"]
    src += ["    " + ln for ln in body_lines]
    text = "\n".join(src) + "\n"
    namespace["__MISS"] = MISS
    namespace.setdefault("__torch", torch)
    exec(compile(text, f"<kiln entry {code.co_name}>", "exec"), namespace)
    return namespace[name], text
