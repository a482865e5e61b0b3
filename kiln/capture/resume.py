"""Resume functions: the rest of a frame after a graph break, as a new code object.

``resume_code(code, index, stack_layout, local_names)`` copies ``code`` and puts a
prologue in front: it pushes the saved stack (arguments named ``__stack<i>``, or NULL
where CPython had one) and jumps to instruction ``index``. The frame's live locals come
in as ordinary arguments. Everything after the jump is the original bytecode, so line
numbers, exception tables and loops stay as they were. Built with the ``bytecode``
package; cached so that one break point always maps to one code object (and one cache).
"""
from __future__ import annotations

import weakref

import bytecode as bc
from bytecode import Bytecode, Instr, Label

from kiln.capture.bytecode_info import PY312
from kiln.capture.errors import Unsupported

_CO_VARARGS = 0x04
_CO_VARKEYWORDS = 0x08
_CO_GENERATOR = 0x20
_CO_NEWLOCALS = 0x02

#: code object -> {(index, stack_nulls, local_names): resume code}; weak keys, so the
#: user's code (and what is built from it) is not kept alive by kiln
_cache = weakref.WeakKeyDictionary()


def resume_code(code, index: int, stack_nulls: tuple, local_names: tuple):
    """``stack_nulls[i]`` is True where stack slot i holds NULL (not passed in)."""
    key = (index, stack_nulls, local_names)
    per_code = _cache.get(code)
    if per_code is None:
        per_code = _cache[code] = {}
    hit = per_code.get(key)
    if hit is not None:
        return hit
    if code.co_flags & (_CO_GENERATOR | 0x80 | 0x200):
        raise Unsupported("K0004", "a graph break in a generator or coroutine")
    b = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    instrs = [x for x in b if isinstance(x, Instr)]
    target = instrs[index]
    label = Label()
    body = []
    for x in b:
        if x is target:
            body.append(label)
        body.append(x)
    lineno = target.lineno if target.lineno is not None else code.co_firstlineno
    prologue = []
    for x in b:
        if isinstance(x, Instr) and x.name in ("COPY_FREE_VARS", "MAKE_CELL"):
            prologue.append(Instr(x.name, x.arg, lineno=lineno))
        elif isinstance(x, Instr):
            break
    prologue.append(Instr("RESUME", 0, lineno=lineno))
    stack_args = []
    prefix = "__stack"
    while any(n.startswith(prefix) for n in code.co_varnames):
        prefix = "_" + prefix
    for i, is_null in enumerate(stack_nulls):
        if is_null:
            prologue.append(Instr("PUSH_NULL", lineno=lineno))
        else:
            name = f"{prefix}{i}"
            stack_args.append(name)
            prologue.append(Instr("LOAD_FAST", name, lineno=lineno))
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    # drop the original prefix (COPY_FREE_VARS / MAKE_CELL / RESUME): unreachable now
    new = Bytecode(prologue + _without_prefix(body))
    new._copy_attr_from(b)
    new.argnames = list(stack_args) + list(local_names)
    new.argcount = len(new.argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    new.flags = (b.flags & ~(_CO_VARARGS | _CO_VARKEYWORDS)) | _CO_NEWLOCALS
    new.name = f"__resume_at_{index}_{code.co_name}"
    if PY312 or hasattr(new, "qualname"):
        new.qualname = new.name
    try:
        # the original code's exception-table depths and stack size hold as they are:
        # the prologue rebuilds the stack the target had, and the code before the target
        # is unreachable now, which the bytecode package's own depth analysis (starting
        # at the entry) cannot see through (it wrote a with-block's handler depth as
        # 32768: CPython then crashed unwinding an exception raised in the block)
        out = new.to_code(stacksize=code.co_stacksize, compute_exception_stack_depths=False)
    except Exception as e:  # the bytecode package cannot lay this jump out
        raise Unsupported("K0048", f"cannot build a resume function here ({e})") from None
    per_code[key] = out
    return out


def _without_prefix(body):
    out = []
    in_prefix = True
    for x in body:
        if in_prefix and isinstance(x, Instr) and x.name in ("COPY_FREE_VARS", "MAKE_CELL", "RESUME"):
            continue
        if isinstance(x, Instr):
            in_prefix = False
        out.append(x)
    return out


del bc
