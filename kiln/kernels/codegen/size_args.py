"""Sizes as kernel arguments: one compiled kernel for every graph that differs only in sizes.

A code generator prints each integer that comes from a size or a stride (a loop bound, an
element count, an index coefficient or offset) through ``size(v)``, which writes a *mark*
holding the value. ``lift`` then gives each distinct marked value a name (``ks0``,
``ks1``… in order of first appearance) and lists the values: the source text names the
arguments, and the launch passes this compile's values. Two compiles whose lifted texts
are equal share one compiled binary (the caches are keyed by the text), each with its
own values.

This is sound without reasoning about sizes: a lifted text with its values substituted
back is, character for character, the text the generator would have written with
literals (``concrete``), so the shared binary computes what a specialised one would.
Every decision that depends on sizes (block sizes, masks, vector widths, fusion, loop
shapes) stays a literal or a structure in the text: each *size class* gets its own
text, hence its own binary. Marks go only where an ``int64`` value may stand (never an
array length, a template argument, a pragma clause or a Triton constexpr); small
magnitudes (``config.kernel_size_args_min``: a 3-channel dim, a stride of 2) stay
literals, which costs few classes and keeps the code the C++ compiler unrolls.
Equal values share a name, so a text also records which of its sizes were equal: a
class is the set of sizes with the same equalities, which is as it must be (the name
stands for one value).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ... import config

_OPEN, _CLOSE = "\x01", "\x02"
_MARK = re.compile("\x01(-?[0-9]+)\x02")


def size(v) -> str:
    """``v`` (an integer from sizes or strides) as generated text: a mark to lift, or the
    literal when lifting is off or ``v`` is small."""
    v = int(v)
    if not config.kernel_size_args or abs(v) <= config.kernel_size_args_min:
        return str(v)
    return f"{_OPEN}{v}{_CLOSE}"


def is_lifted(text: str) -> bool:
    """Does ``text`` (a size printed by ``size``) hold a mark?"""
    return _OPEN in text


def values(text: str, start: list | None = None) -> list:
    """The distinct marked values of ``text`` in order of first appearance, after those
    of ``start``."""
    out = list(start or ())
    seen = set(out)
    for m in _MARK.finditer(text):
        v = int(m.group(1))
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def substitute(text: str, vals: list, spell=lambda i: f"ks{i}") -> str:
    """``text`` with each mark replaced by the name (``spell(index)``) of its value in
    ``vals``."""
    index = {v: i for i, v in enumerate(vals)}
    return _MARK.sub(lambda m: spell(index[int(m.group(1))]), text)


def used(text: str, vals: list) -> list:
    """Indices into ``vals`` of the values ``text`` marks, ascending."""
    index = {v: i for i, v in enumerate(vals)}
    return sorted({index[int(m.group(1))] for m in _MARK.finditer(text)})


def concrete(text: str) -> str:
    """``text`` with every mark replaced by its value: what the lifted text means at the
    values of this compile."""
    return _MARK.sub(lambda m: m.group(1), text)


@dataclass
class SizeArgs:
    """What a plan's launches pass besides tensors: the lifted values (``ks0``…), and
    for Triton each launch's grid (computed from this compile's sizes)."""
    values: list = field(default_factory=list)
    grids: list = field(default_factory=list)
