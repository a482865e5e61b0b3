"""The symbolic interpreter of CPython bytecode: one method per instruction.

A ``Frame`` executes one code object over Values instead of objects. PyTorch calls turn
into graph nodes (through ``OutputGraph.op``); user functions are inlined as child
frames sharing the same OutputGraph; whatever cannot be understood raises
``Unsupported``, which the root frame turns into a graph break (see ``tracer.py``).
"""
from __future__ import annotations

import dis
import operator
import types

import torch

from kiln import config
from kiln.capture import generators, iterators
from kiln.capture import opcodes_blocks, opcodes_calls  # noqa: F401 (they register handlers)
from kiln.capture.opcodes import HANDLERS, handles
from kiln.capture import values as V
from kiln.capture.builder import builtins_dict, wrap, wrap_static
from kiln.capture.cells import RealCell, real_cell
from kiln.capture.bytecode_info import BINARY_OPS, PY312, decode, exception_table, per_code
from kiln.capture.errors import (RestartWithBreak, ReturnSignal, SkipFrame, Unsupported, UserException,
                                 YieldSignal)
from kiln.capture.operators import binary_op, compare_op, contains_op, format_value, subscr, unary_op
from kiln.capture.sources import ClosureSource, FuncCellSource, GlobalSource, ItemSource, LocalSource

_CO_GENERATOR = 0x20
_CO_VARARGS = 0x04
_CO_VARKEYWORDS = 0x08


class Frame:
    """Interprets one code object. ``parent`` is None for the root (compiled) frame."""

    def __init__(self, output, code, f_globals, f_locals: dict, *, parent=None,
                 closure=None, globals_source=None, fn_value=None, is_generator=False):
        self.output = output
        self.code = code
        output.traced_codes.add(code)
        self.insts = _decoded(code)
        self.exc_table = _exc_table(code)
        self.f_globals = f_globals
        self.f_builtins = builtins_dict(f_globals)
        self.locals: dict = dict(f_locals)
        self.cells: dict = {}
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.closure = closure  # tuple of CellValue / real cells, or None
        self.globals_source = globals_source  # how to re-read this frame's globals
        self.fn_value = fn_value
        self.stack: list = []
        self.ip = 0
        self.inst = None
        self.kw_names = None
        self.exc_stack: list = []  # exceptions being handled (PUSH_EXC_INFO)
        self.is_generator = is_generator
        self.steps = 0

    def local(self, name):
        v = self.locals[name]
        if isinstance(v, V.LazyArg):
            v = self.locals[name] = wrap(self, v.real, v.source)
        return v

    # --- stack helpers --------------------------------------------------------------
    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        out = self.stack[-n:]
        del self.stack[-n:]
        return out

    # --- running ----------------------------------------------------------------------
    def run(self):
        """Run to RETURN_VALUE; returns the returned Value."""
        out = self.output
        caller = out.active_frame
        try:
            while True:
                self.step()
        except ReturnSignal as r:
            return r.value
        finally:
            out.active_frame = caller

    def step(self):
        inst = self.insts[self.ip]
        self.inst = inst
        self.output.active_frame = self     # whose line a new graph node is
        self.ip += 1
        self.steps += 1
        if self.steps > config.max_instructions:
            raise Unsupported("K0002", f"more than {config.max_instructions} instructions (an unbounded loop?)")
        handler = HANDLERS.get(inst.opname)
        if handler is None:
            raise Unsupported("K0001", f"bytecode {inst.opname} is not supported")
        try:
            handler(self, inst)
        except UserException as e:
            self.raise_user(e)
        except _NOT_KILNS_FAILURES:
            raise
        except Exception as e:  # kiln's own failure: remember the deepest user line
            if getattr(e, "_kiln_stack", None) is None:
                e._kiln_stack = self.user_stack()
            raise

    def raise_user(self, e: UserException):
        """Route an exception raised by the traced program to its handler in this frame,
        or out to the caller frame."""
        entry = None
        for ent in self.exc_table:
            if ent.start <= self.inst.offset <= ent.end:
                entry = ent
                break
        if entry is None:
            raise e
        if e.from_fake:
            raise Unsupported("K0031", f"the program handles {e.value.cls.__name__} raised by an op on fake "
                              "tensors (the real op's error, if any, is eager's to say)")
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(V.ConstantValue(self.inst.offset))
        self.push(e.value)
        self.ip = _index_of(self.insts, entry.target)

    def user_stack(self):
        """file:line and source text of each frame from the root to this one."""
        import linecache

        frames = []
        f = self
        while f is not None:
            line = f.inst.line if f.inst else f.code.co_firstlineno
            text = linecache.getline(f.code.co_filename, line or 0).strip()
            frames.append(f"{f.code.co_filename}:{line} in {f.code.co_name}: {text}")
            f = f.parent
        return list(reversed(frames))

    # --- calls ------------------------------------------------------------------------
    def call(self, fn: V.Value, args, kwargs):
        return fn.call(self, list(args), dict(kwargs))

    def inline_function(self, fnv, args, kwargs):
        """Inline a user function: bind arguments, run its code in a child frame."""
        if self.depth >= config.inline_depth:
            raise Unsupported("K0003", f"inlining deeper than {config.inline_depth} calls")
        if isinstance(fnv, V.UserFunctionValue):
            fn = fnv.fn
            code = fn.__code__
            defaults = fn.__defaults__
            kwdefaults = fn.__kwdefaults__
            f_globals = fn.__globals__
            closure = fn.__closure__
            fsrc = fnv.source
            def_vals = None
            kwdef_vals = None
        else:
            code = fnv.code
            f_globals = fnv.f_globals
            closure = fnv.closure
            fsrc = None
            def_vals = fnv.defaults
            kwdef_vals = fnv.kwdefaults
            defaults = kwdefaults = None
        if code.co_flags & 0x80 or code.co_flags & 0x200:  # coroutine / async generator
            raise Unsupported("K0004", "async functions")
        if defaults is not None:
            def_vals = tuple(_wrap_default(self, d, fsrc, i) for i, d in enumerate(defaults))
        if kwdefaults:
            kwdef_vals = {k: _wrap_default(self, d, fsrc, k) for k, d in kwdefaults.items()}
        bound = bind_args(code, args, kwargs, def_vals, kwdef_vals)
        gsrc = None
        if f_globals is self.f_globals:
            gsrc = self.globals_source
        if gsrc is None:
            gsrc = _globals_dict_source(self.output, f_globals)
        child = Frame(self.output, code, f_globals, bound, parent=self, closure=closure,
                      globals_source=gsrc, fn_value=fnv,
                      is_generator=bool(code.co_flags & _CO_GENERATOR))
        for i, name in enumerate(code.co_freevars):
            cell = closure[i]
            if isinstance(cell, (V.CellValue, RealCell)):  # the caller's cell, shared
                child.cells[name] = cell
            else:
                child.cells[name] = real_cell(self.output, cell, FuncCellSource(fsrc, i) if fsrc is not None else None)
        if child.is_generator:  # runs nothing until its consumer pulls
            return generators.GeneratorValue(child, fnv, args, kwargs)
        try:
            return child.run()
        except Unsupported as e:
            # remember the deepest frame's stack: errors name the line that could not
            # be traced, with every inlined call leading to it
            if getattr(e, "_kiln_stack", None) is None:
                e._kiln_stack = child.user_stack()
            raise

    # --- cells ------------------------------------------------------------------------
    def _cell_names(self):
        return self.code.co_cellvars + self.code.co_freevars

    def load_cell(self, name):
        cell = self.cells.get(name)
        if isinstance(cell, V.CellValue):
            if cell.value is None:
                raise UserException(V.ExceptionValue(NameError, [V.ConstantValue(
                    f"free variable {name!r} referenced before assignment")]))
            return cell.value
        if cell is not None:  # a real cell of a real function
            return cell.read(self)
        raise Unsupported("K0026", f"cell {name}")

    def store_cell(self, name, value):
        cell = self.cells.get(name)
        if isinstance(cell, V.CellValue):
            cell.value = value
            return
        if cell is not None:
            cell.write(self, value)
            return
        raise Unsupported("K0026", f"cell {name}")

    def load_global(self, name):
        if self.f_globals is self.output.root_globals and name in self.output.global_writes:
            return self.output.global_writes[name]
        if name in self.f_globals:
            if self.globals_source is None:
                return wrap(self, self.f_globals[name], None)
            return wrap(self, self.f_globals[name], ItemSource(self.globals_source, name))
        if name in self.f_builtins:
            return wrap(self, self.f_builtins[name], None, module_member=True)
        raise UserException(V.ExceptionValue(NameError, [V.ConstantValue(f"name {name!r} is not defined")]))


def _wrap_default(tx, d, fsrc, key):
    from kiln.capture.sources import DefaultSource

    return wrap(tx, d, DefaultSource(fsrc, key) if fsrc is not None else None) if fsrc is not None or not isinstance(d, torch.Tensor) else wrap(tx, d, None)


def _globals_dict_source(output, f_globals):
    from kiln.capture.sources import RefSource

    return RefSource(output.guards.const(f_globals, "g"))


_decoded = per_code(decode)
_exc_table = per_code(exception_table)


def _index_of(insts, offset):
    for i in insts:
        if i.offset == offset:
            return i.index
    raise Unsupported("K0001", f"no instruction at offset {offset}")


def bind_args(code, args, kwargs, defaults, kwdefaults):
    """Bind Values to a code object's parameters, as CPython does; errors are the user's
    TypeError."""
    nargs = code.co_argcount
    nkwonly = code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kwonly_names = names[nargs:nargs + nkwonly]
    i = nargs + nkwonly
    varargs_name = names[i] if code.co_flags & _CO_VARARGS else None
    if varargs_name:
        i += 1
    varkw_name = names[i] if code.co_flags & _CO_VARKEYWORDS else None
    posonly = code.co_posonlyargcount
    out = {}

    def err(msg):
        raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(f"{code.co_name}() {msg}")]))

    for n, a in zip(pos_names, args):
        out[n] = a
    extra = list(args[nargs:])
    if extra:
        if varargs_name is None:
            err(f"takes {nargs} positional arguments but {len(args)} were given")
    if varargs_name:
        out[varargs_name] = V.TupleValue(extra)
    kw_extra = {}
    for k, v in kwargs.items():
        if k in pos_names[posonly:] or k in kwonly_names:
            if k in out:
                err(f"got multiple values for argument {k!r}")
            out[k] = v
        elif varkw_name is not None:
            kw_extra[k] = v
        else:
            err(f"got an unexpected keyword argument {k!r}")
    if varkw_name:
        out[varkw_name] = V.DictValue(kw_extra)
    ndef = len(defaults) if defaults else 0
    for j, n in enumerate(pos_names):
        if n not in out:
            d = j - (nargs - ndef)
            if d >= 0:
                out[n] = defaults[d]
            else:
                err(f"missing required positional argument: {n!r}")
    for n in kwonly_names:
        if n not in out:
            if kwdefaults and n in kwdefaults:
                out[n] = kwdefaults[n]
            else:
                err(f"missing required keyword-only argument: {n!r}")
    return out


# =====================================================================================
# Instruction handlers: one function per opcode, registered in opcodes.HANDLERS; the
# call, block (with/except/raise/import) and pattern-matching families are in opcodes_*.py.
# =====================================================================================
# control flow of the trace, not failures: passed through Frame.step untouched
_NOT_KILNS_FAILURES = (ReturnSignal, YieldSignal, Unsupported, RestartWithBreak, SkipFrame, StopIteration)


@handles("NOP", "RESUME", "PRECALL", "EXTENDED_ARG", "CACHE", "COPY_FREE_VARS")
def _nop(tx, inst):
    pass


@handles("MAKE_CELL")
def MAKE_CELL(tx, inst):
    name = inst.argval
    if name in tx.locals:
        tx.local(name)
    cell = V.CellValue(tx.locals.pop(name, None))
    tx.cells[name] = cell


@handles("POP_TOP")
def POP_TOP(tx, inst):
    tx.pop()


@handles("PUSH_NULL")
def PUSH_NULL(tx, inst):
    tx.push(V.NULL)


@handles("COPY")
def COPY(tx, inst):
    tx.push(tx.stack[-inst.arg])


@handles("SWAP")
def SWAP(tx, inst):
    s = tx.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


@handles("LOAD_CONST")
def LOAD_CONST(tx, inst):
    tx.push(wrap_static(inst.argval) if type(inst.argval) is not types.CodeType else V.ConstantValue(inst.argval))


@handles("RETURN_CONST")
def RETURN_CONST(tx, inst):
    raise ReturnSignal(wrap_static(inst.argval))


@handles("LOAD_FAST", "LOAD_FAST_CHECK")
def LOAD_FAST(tx, inst):
    name = inst.argval
    try:
        tx.push(tx.local(name))
    except KeyError:
        raise UserException(V.ExceptionValue(UnboundLocalError, [V.ConstantValue(
            f"cannot access local variable {name!r} where it is not associated with a value")]))


@handles("LOAD_FAST_AND_CLEAR")
def LOAD_FAST_AND_CLEAR(tx, inst):
    if inst.argval in tx.locals:
        tx.local(inst.argval)
    tx.push(tx.locals.pop(inst.argval, V.NULL))


@handles("STORE_FAST")
def STORE_FAST(tx, inst):
    v = tx.pop()
    if v is V.NULL:
        tx.locals.pop(inst.argval, None)
    else:
        tx.locals[inst.argval] = v


@handles("DELETE_FAST")
def DELETE_FAST(tx, inst):
    tx.locals.pop(inst.argval, None)


@handles("LOAD_GLOBAL")
def LOAD_GLOBAL(tx, inst):
    if inst.arg & 1:
        tx.push(V.NULL)
    tx.push(tx.load_global(inst.argval))


@handles("STORE_GLOBAL")
def STORE_GLOBAL(tx, inst):
    v = tx.pop()
    if tx.f_globals is not tx.output.root_globals:
        raise Unsupported("K0026", "writing a global of another module")
    tx.output.global_writes[inst.argval] = v
    tx.output.mark_mutated(("global", inst.argval))


@handles("LOAD_DEREF", "LOAD_CLASSDEREF")
def LOAD_DEREF(tx, inst):
    tx.push(tx.load_cell(inst.argval))


@handles("STORE_DEREF")
def STORE_DEREF(tx, inst):
    tx.store_cell(inst.argval, tx.pop())


@handles("LOAD_CLOSURE")
def LOAD_CLOSURE(tx, inst):
    cell = tx.cells.get(inst.argval)
    if cell is None:
        raise Unsupported("K0026", f"closure over {inst.argval}")
    tx.push(cell)


@handles("LOAD_ATTR")
def LOAD_ATTR(tx, inst):
    obj = tx.pop()
    name = inst.argval
    if PY312 and inst.arg & 1:
        tx.push(V.NULL)
        tx.push(obj.getattr(tx, name))
    else:
        tx.push(obj.getattr(tx, name))


@handles("LOAD_METHOD")
def LOAD_METHOD(tx, inst):
    obj = tx.pop()
    tx.push(V.NULL)
    tx.push(obj.getattr(tx, inst.argval))


@handles("LOAD_SUPER_ATTR")
def LOAD_SUPER_ATTR(tx, inst):
    self_v = tx.pop()
    cls_v = tx.pop()
    tx.pop()  # the global `super`
    sup = V.SuperValue(cls_v.const(), self_v)
    if inst.arg & 1:
        tx.push(V.NULL)
    tx.push(sup.getattr(tx, inst.argval))


@handles("STORE_ATTR")
def STORE_ATTR(tx, inst):
    obj = tx.pop()
    val = tx.pop()
    obj.setattr(tx, inst.argval, val)


@handles("DELETE_ATTR")
def DELETE_ATTR(tx, inst):
    obj = tx.pop()
    if not isinstance(obj, V.ObjectValue):
        raise Unsupported("K0025", f"del attribute of {obj}")
    from kiln.capture.objects import object_delattr

    object_delattr(tx, obj, inst.argval)


@handles("BINARY_OP")
def BINARY_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(binary_op(tx, BINARY_OPS[inst.arg], a, b))


@handles("BINARY_SUBSCR")
def BINARY_SUBSCR(tx, inst):
    k = tx.pop()
    o = tx.pop()
    tx.push(subscr(tx, o, k))


@handles("BINARY_SLICE")
def BINARY_SLICE(tx, inst):
    end = tx.pop()
    start = tx.pop()
    o = tx.pop()
    tx.push(subscr(tx, o, _slice(start, end, V.ConstantValue(None))))


@handles("STORE_SUBSCR")
def STORE_SUBSCR(tx, inst):
    k = tx.pop()
    o = tx.pop()
    v = tx.pop()
    from kiln.capture.operators import store_subscr

    store_subscr(tx, o, k, v)


@handles("STORE_SLICE")
def STORE_SLICE(tx, inst):
    end = tx.pop()
    start = tx.pop()
    o = tx.pop()
    v = tx.pop()
    from kiln.capture.operators import store_subscr

    store_subscr(tx, o, _slice(start, end, V.ConstantValue(None)), v)


@handles("DELETE_SUBSCR")
def DELETE_SUBSCR(tx, inst):
    k = tx.pop()
    o = tx.pop()
    o.call_method(tx, "__delitem__", [k], {})


def _slice(a, b, c):
    if all(x.is_const() for x in (a, b, c)):
        return V.ConstantValue(slice(a.const(), b.const(), c.const()))
    if all(x.is_const() or isinstance(x, V.SymIntValue) for x in (a, b, c)):
        return V.SymSliceValue(a, b, c)
    raise Unsupported("K0011", "a slice with non-constant bounds")


@handles("BUILD_SLICE")
def BUILD_SLICE(tx, inst):
    if inst.arg == 3:
        c = tx.pop()
    else:
        c = V.ConstantValue(None)
    b = tx.pop()
    a = tx.pop()
    tx.push(_slice(a, b, c))


@handles("UNARY_NEGATIVE", "UNARY_NOT", "UNARY_INVERT", "UNARY_POSITIVE")
def UNARY(tx, inst):
    tx.push(unary_op(tx, inst.opname, tx.pop()))


@handles("COMPARE_OP")
def COMPARE_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(compare_op(tx, inst.argval, a, b))


@handles("IS_OP")
def IS_OP(tx, inst):
    b = tx.pop()
    a = tx.pop()
    from kiln.capture.operators import is_same

    r = is_same(tx, a, b)
    tx.push(V.ConstantValue(r if not inst.arg else not r))


@handles("CONTAINS_OP")
def CONTAINS_OP(tx, inst):
    container = tx.pop()
    item = tx.pop()
    r = contains_op(tx, item, container)
    tx.push(V.ConstantValue(r if not inst.arg else not r))


@handles("BUILD_TUPLE")
def BUILD_TUPLE(tx, inst):
    tx.push(V.TupleValue(tx.popn(inst.arg)))


@handles("BUILD_LIST")
def BUILD_LIST(tx, inst):
    tx.push(V.ListValue(tx.popn(inst.arg)))


@handles("BUILD_SET")
def BUILD_SET(tx, inst):
    items = tx.popn(inst.arg)
    tx.push(V.SetValue(set(i.const() for i in items)))


@handles("BUILD_MAP")
def BUILD_MAP(tx, inst):
    items = tx.popn(2 * inst.arg)
    d = {}
    for k, v in zip(items[::2], items[1::2]):
        d[k.const()] = v
    tx.push(V.DictValue(d))


@handles("BUILD_CONST_KEY_MAP")
def BUILD_CONST_KEY_MAP(tx, inst):
    keys = tx.pop().const()
    vals = tx.popn(inst.arg)
    tx.push(V.DictValue(dict(zip(keys, vals))))


@handles("BUILD_STRING")
def BUILD_STRING(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(V.ConstantValue("".join(p.const() for p in parts)))


@handles("LIST_APPEND")
def LIST_APPEND(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].items.append(v)


@handles("SET_ADD")
def SET_ADD(tx, inst):
    v = tx.pop()
    s = tx.stack[-inst.arg]
    s.items.add(v.const())


@handles("MAP_ADD")
def MAP_ADD(tx, inst):
    v = tx.pop()
    k = tx.pop()
    tx.stack[-inst.arg].items[k.const()] = v


@handles("LIST_EXTEND")
def LIST_EXTEND(tx, inst):
    v = tx.pop()
    tx.stack[-inst.arg].items.extend(v.unpack(tx))


@handles("SET_UPDATE")
def SET_UPDATE(tx, inst):
    v = tx.pop()
    s = tx.stack[-inst.arg]
    from kiln.capture.containers import set_operand

    s.items.update(set_operand(tx, v))


@handles("DICT_UPDATE", "DICT_MERGE")
def DICT_UPDATE(tx, inst):
    v = tx.pop()
    d = tx.stack[-inst.arg]
    from kiln.capture.containers import dict_items_of

    for k, val in dict_items_of(tx, v):
        if inst.opname == "DICT_MERGE" and k in d.items:
            raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(f"got multiple values for keyword argument {k!r}")]))
        d.items[k] = val


@handles("LIST_TO_TUPLE")
def LIST_TO_TUPLE(tx, inst):
    tx.push(V.TupleValue(tx.pop().items))


# CPython 3.12's numbering (Include/internal/pycore_intrinsics.h); `dis` exposes the
# names only as a private table, and the bytecode package may hand us an enum.
_INTRINSIC1_NAMES = {1: "INTRINSIC_PRINT", 2: "INTRINSIC_IMPORT_STAR",
                     3: "INTRINSIC_STOPITERATION_ERROR", 4: "INTRINSIC_ASYNC_GEN_WRAP",
                     5: "INTRINSIC_UNARY_POSITIVE", 6: "INTRINSIC_LIST_TO_TUPLE"}


def _intrinsic1_name(arg):
    if hasattr(arg, "name"):
        name = arg.name
        return name if name.startswith("INTRINSIC_") else "INTRINSIC_" + name
    descs = getattr(dis, "_intrinsic1_descs", None)
    if descs is not None and 0 <= int(arg) < len(descs):
        return descs[int(arg)]
    return _INTRINSIC1_NAMES.get(int(arg), f"intrinsic {int(arg)}")


@handles("CALL_INTRINSIC_1")
def CALL_INTRINSIC_1(tx, inst):
    kind = _intrinsic1_name(inst.arg)
    if kind == "INTRINSIC_LIST_TO_TUPLE":
        tx.push(V.TupleValue(tx.pop().items))
    elif kind == "INTRINSIC_UNARY_POSITIVE":
        tx.push(unary_op(tx, "UNARY_POSITIVE", tx.pop()))
    elif kind == "INTRINSIC_STOPITERATION_ERROR":
        generators.stopiteration_error(tx)
    else:
        raise Unsupported("K0001", f"intrinsic {kind}")


@handles("UNPACK_SEQUENCE")
def UNPACK_SEQUENCE(tx, inst):
    seq = tx.pop()
    items = iterators.unpack_exactly(tx, seq, inst.arg)
    if len(items) != inst.arg:
        msg = (f"too many values to unpack (expected {inst.arg})" if len(items) > inst.arg
               else f"not enough values to unpack (expected {inst.arg}, got {len(items)})")
        raise UserException(V.ExceptionValue(ValueError, [V.ConstantValue(msg)]))
    for i in reversed(items):
        tx.push(i)


@handles("UNPACK_EX")
def UNPACK_EX(tx, inst):
    seq = tx.pop()
    items = seq.unpack(tx)
    before = inst.arg & 0xFF
    after = inst.arg >> 8
    if len(items) < before + after:
        raise UserException(V.ExceptionValue(ValueError, [V.ConstantValue("not enough values to unpack")]))
    head = items[:before]
    mid = items[before:len(items) - after]
    tail = items[len(items) - after:]
    for i in reversed(tail):
        tx.push(i)
    tx.push(V.ListValue(mid))
    for i in reversed(head):
        tx.push(i)


@handles("FORMAT_VALUE")
def FORMAT_VALUE(tx, inst):
    spec = tx.pop() if (inst.arg & 0x04) else V.ConstantValue("")
    v = tx.pop()
    conv = inst.arg & 0x03
    tx.push(format_value(tx, v, conv, spec.const()))


@handles("GET_ITER")
def GET_ITER(tx, inst):
    tx.push(iterators.get_iter(tx, tx.pop()))


@handles("FOR_ITER")
def FOR_ITER(tx, inst):
    v = iterators.next_of(tx, tx.stack[-1])
    if v is None:
        tx.pop()
        target = inst.target
        if PY312 and tx.insts[target].opname == "END_FOR":
            target += 1
        tx.ip = target
    else:
        tx.push(v)


@handles("END_FOR")
def END_FOR(tx, inst):
    tx.pop()
    tx.pop()


@handles("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP")
def JUMP(tx, inst):
    tx.ip = inst.target


def _truth(tx, v):
    return v.truth(tx)


def _pop_jump(cond_fn):
    def handler(tx, inst):
        v = tx.stack[-1]
        jump = cond_fn(tx, v)  # may raise Unsupported with the stack intact
        tx.pop()
        if jump:
            tx.ip = inst.target

    return handler


_jt = _pop_jump(lambda tx, v: _truth(tx, v))
_jf = _pop_jump(lambda tx, v: not _truth(tx, v))
_jn = _pop_jump(lambda tx, v: isinstance(v, V.ConstantValue) and v.value is None)
_jnn = _pop_jump(lambda tx, v: not (isinstance(v, V.ConstantValue) and v.value is None))
for _n in ("POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE"):
    HANDLERS[_n] = _jt
for _n in ("POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE"):
    HANDLERS[_n] = _jf
for _n in ("POP_JUMP_IF_NONE", "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE"):
    HANDLERS[_n] = _jn
for _n in ("POP_JUMP_IF_NOT_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE"):
    HANDLERS[_n] = _jnn


@handles("JUMP_IF_TRUE_OR_POP")
def JUMP_IF_TRUE_OR_POP(tx, inst):
    if _truth(tx, tx.stack[-1]):
        tx.ip = inst.target
    else:
        tx.pop()


@handles("JUMP_IF_FALSE_OR_POP")
def JUMP_IF_FALSE_OR_POP(tx, inst):
    if not _truth(tx, tx.stack[-1]):
        tx.ip = inst.target
    else:
        tx.pop()


@handles("RETURN_VALUE")
def RETURN_VALUE(tx, inst):
    raise ReturnSignal(tx.pop())


del operator


HANDLERS.update(generators.HANDLERS)
