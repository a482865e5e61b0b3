"""Decoded instructions and per-version facts about CPython bytecode (3.11, 3.12)."""
from __future__ import annotations

import dis
import sys
import weakref
from dataclasses import dataclass

PY312 = sys.version_info >= (3, 12)
PY313 = sys.version_info >= (3, 13)

BINARY_OPS = [name for name, _ in dis._nb_ops]  # e.g. NB_ADD, NB_INPLACE_ADD


@dataclass
class Inst:
    opname: str
    arg: int | None
    argval: object
    offset: int
    line: int | None
    index: int = 0
    target: int | None = None  # instruction index a jump goes to


JUMP_OPS = set(dis.hasjrel) | set(dis.hasjabs)


def decode(code) -> list[Inst]:
    insts = []
    line = code.co_firstlineno
    pending_ext = []  # offsets of EXTENDED_ARGs: a jump there lands on the next instruction
    alias = {}
    for ins in dis.get_instructions(code):
        if ins.opname == "EXTENDED_ARG":
            pending_ext.append(ins.offset)
            continue
        for o in pending_ext:
            alias[o] = ins.offset
        pending_ext = []
        ln = ins.positions.lineno if ins.positions and ins.positions.lineno else None
        if ln is None:
            ln = getattr(ins, "starts_line", None) if isinstance(getattr(ins, "starts_line", None), int) and not isinstance(getattr(ins, "starts_line", None), bool) else line
        line = ln or line
        insts.append(Inst(ins.opname, ins.arg, ins.argval, ins.offset, line))
    by_offset = {i.offset: n for n, i in enumerate(insts)}
    for n, i in enumerate(insts):
        i.index = n
        if dis.opmap.get(i.opname, -1) in JUMP_OPS and isinstance(i.argval, int):
            i.target = by_offset.get(alias.get(i.argval, i.argval))
    return insts


@dataclass
class ExcEntry:
    start: int
    end: int
    target: int
    depth: int
    lasti: bool


def exception_table(code) -> list[ExcEntry]:
    out = []
    for e in dis._parse_exception_table(code):
        out.append(ExcEntry(e.start, e.end, e.target, e.depth, e.lasti))
    return out


def per_code(compute):
    """``compute(code)`` remembered while ``code`` lives: code objects are immutable, so
    each is decoded once, and the cache (weak keys) never keeps one alive, nor what
    generated it (resume functions of dropped compiled functions)."""
    cache = weakref.WeakKeyDictionary()

    def get(code):
        try:
            return cache[code]
        except KeyError:
            value = cache[code] = compute(code)
            return value

    return get
