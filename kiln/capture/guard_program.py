"""Runs of an entry's guards evaluated by one call into kiln's C++ library.

A model's entry guards its module tree: each submodule's type, that it has no hooks,
its constant attributes (a convolution's stride, a norm's eps), its ``_modules`` keys,
the class attributes a trace inlined. mobilenet_v3_small has about 950 such guards,
~80 us a call in Python, each an attribute read and a comparison. The library reads
the same paths and makes the same comparisons without the interpreter.

``GuardSet`` records, beside the Python text of each guard it can express so, the guard
as checks on access paths (``path_of``): a root (an argument of the entry, or an object
of the entry's namespace) followed by attribute reads, item reads and calls with no
arguments. ``build`` turns each run of consecutive such guards in the entry's chain into
one guard ``__gprogN((args,))``: order is kept (a run stands where its guards stood, and
inside it they run in order and stop at the first failure); a path is read at its first
use and kept, as ``guard_cse`` keeps it in a local; an exception is a miss. The Python
guards stay in ``entry.guards``: a miss is explained guard by guard as before.
``KILN_NATIVE_GUARDS_VERIFY`` (tests) evaluates each run both ways on every call and
raises where they differ.
"""
from __future__ import annotations

import functools

from kiln import config
from kiln.capture.sources import (AttrSource, BuiltinSource, ClosureSource, DefaultSource,
                                  FuncCellSource, GlobalSource, ItemSource, LocalSource,
                                  RefSource)

# path steps (native_guards.cpp: StepKind)
ROOT_ARG, ROOT_OBJ, ATTR, ITEM, CALL0 = range(5)
# checks (native_guards.cpp: CheckOp)
(TYPE_IS, IS, EQ, TYPED_EQ, IS_OR_CALL, CALL, TYPED_CALL, LEN, KEYS, KEYS_CALL,
 FALSY) = range(11)
#: shorter runs stay Python: a call and its argument tuple cost about two guards
MIN_RUN = 3
NAME = "__gprog"


def path_of(src) -> tuple | None:
    """``src`` as a path: (root, step, ...), root ("arg", name) or ("ns", name), steps
    ("attr", name), ("item", key), ("call",); None where it is not one (a source that
    calls a function, converts, or reads through a method)."""
    t = type(src)
    if t is LocalSource:
        return (("arg", src.name),)
    if t is RefSource:
        return (("ns", src.name),)
    if t is GlobalSource:
        return (("ns", "__G"), ("item", src.name))
    if t is BuiltinSource:
        return (("ns", "__B"), ("item", src.name))
    if t is ClosureSource:
        return (("ns", "__closure"), ("item", src.index), ("attr", "cell_contents"))
    if t is AttrSource or t is ItemSource or t is FuncCellSource or t is DefaultSource:
        base = path_of(src.fn if t in (FuncCellSource, DefaultSource) else src.base)
        if base is None:
            return None
        if t is AttrSource:
            return base + (("attr", src.attr),)
        if t is ItemSource:
            try:
                hash(src.key)
            except TypeError:
                return None
            return base + (("item", src.key),)
        if t is FuncCellSource:
            return base + (("attr", "__closure__"), ("item", src.index), ("attr", "cell_contents"))
        if isinstance(src.index, int):
            return base + (("attr", "__defaults__"), ("item", src.index))
        return base + (("attr", "__kwdefaults__"), ("item", src.index))
    return None


def build(codes: list[str], records: dict, ns: dict, module, argnames: set) -> list[str]:
    """``codes`` with each run of at least ``MIN_RUN`` recorded guards (``records``:
    code -> ((path, op, a, b), ...)) made one call of a program of ``module``, which
    ``ns`` then holds."""
    out, run, k = [], [], 0

    def flush():
        nonlocal k
        if len(run) >= MIN_RUN:
            name = f"{NAME}{k}"
            while name in ns:
                k += 1
                name = f"{NAME}{k}"
            out.append(_program(name, run, records, ns, module))
            k += 1
        else:
            out.extend(run)
        run.clear()
    for code in codes:
        if _usable(records.get(code), ns, argnames):
            run.append(code)
        else:
            flush()
            out.append(code)
    flush()
    return out


def _usable(rec, ns, argnames) -> bool:
    if not rec:
        return False
    for path, *_ in rec:
        kind, name = path[0]
        if (kind == "ns" and name not in ns) or (kind == "arg" and name not in argnames):
            return False
    return True


def _program(name: str, run: list[str], records: dict, ns: dict, module) -> str:
    index: dict = {}
    steps: list = []
    args: list[str] = []

    def step_of(path) -> int:
        i = index.get(path)
        if i is not None:
            return i
        if len(path) == 1:
            kind, root = path[0]
            if kind == "arg":
                if root not in args:
                    args.append(root)
                steps.append((ROOT_ARG, args.index(root), None))
            else:
                steps.append((ROOT_OBJ, 0, ns[root]))
        else:
            parent = step_of(path[:-1])
            last = path[-1]
            if last[0] == "attr":
                steps.append((ATTR, parent, last[1]))
            elif last[0] == "item":
                steps.append((ITEM, parent, last[1]))
            else:
                steps.append((CALL0, parent, None))
        i = index[path] = len(steps) - 1
        return i
    checks, ends = [], []
    for code in run:
        for path, op, a, b in records[code]:
            checks.append((step_of(path), op, a, b))
        ends.append(len(checks))
    program = module.make_program(steps, checks, ends)
    call = functools.partial(module.run_program, program)
    if config.native_guards_verify:
        call = functools.partial(_verified, call, _python_run(run, args, ns), run)
    ns[name] = call
    return f"{name}(({''.join(a + ', ' for a in args)}))"


def _python_run(run: list[str], args: list[str], ns: dict):
    """The run's Python guards as one function of the program's arguments."""
    src = [f"def __run({', '.join(args)}):", "    try:"]
    src += [f"        if not ({c}):\n            return False" for c in run]
    src += ["    except Exception:", "        return False", "    return True"]
    scope: dict = {}
    exec("\n".join(src), ns, scope)
    return scope["__run"]


class GuardProgramMismatch(BaseException):
    """A program and its Python guards disagreed (``KILN_NATIVE_GUARDS_VERIFY``). Not an
    Exception: the entry's ``except Exception`` (a failed guard is a miss) lets it by."""


def _verified(call, python, run, args):
    got, want = call(args), python(*args)
    if got is not want:
        raise GuardProgramMismatch(f"kiln: a native guard program said {got}, its Python "
                                   f"guards {want}; the guards: {run}")
    return got
