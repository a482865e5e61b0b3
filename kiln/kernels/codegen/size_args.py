"""Sizes as kernel arguments: one compiled kernel for every graph that differs only in sizes.

A code generator prints each integer that comes from a size or a stride (a loop bound, an
element count, an index coefficient or offset) through ``size(v)``, which writes a *mark*
holding the value. Each distinct marked value then gets a name (``ks0``, ``ks1``… in
order of first appearance: ``values``, ``substitute``) and the values are listed: the
source text names the arguments, and the launch passes this compile's values. Two
compiles whose lifted texts are equal share one compiled binary (the caches are keyed by
the text), each with its own values. C++ names them across its module; a Triton kernel
names its own (``codegen/triton/source.py``), so kernels of one graph differing only in
sizes are one kernel too, each launch reading its own values.

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

import contextlib
import re
from dataclasses import dataclass, field

import torch

from ... import config

_OPEN, _CLOSE = "\x01", "\x02"
_MARK = re.compile("\x01(-?[0-9]+)\x02")


#: values lifted however small (``lifting``)
_ALWAYS: frozenset = frozenset()
#: every value but -1, 0 and 1 lifted (``lifting(..., every=True)``)
_EVERY = False
#: divisors stay literals (``lifting(..., literal_divisors=True)``) but these values
_LITERAL_DIVISORS = False
_SYMBOLIC: frozenset = frozenset()


@contextlib.contextmanager
def lifting(values, every: bool = False, literal_divisors: bool = False,
            symbolic=()):
    """Lift ``values`` however small while generating: the values of a symbolic graph's
    size symbols at this compile, so that a batch of 3 and one of 20 make one text.

    ``every``: lift every value but -1, 0 and 1, for a generator that names each mark
    on its own (``each_own``; Triton's kernels of a symbolic graph). Lifting a symbol's
    small value lifts every size equal to it by chance (a batch of 3 and an image's 3
    channels, a batch of 2 and a pooling stride), so with the other small sizes kept
    literal, each small batch made a text of its own (resnet18 over batches 2..64: 18
    texts, 6 of them batches 2..7). Lifted all, and named each on its own, the text no
    longer depends on which sizes happen to be equal.

    ``literal_divisors``: ``divisor`` writes literals (``config.triton_literal_divisors``)
    but for the values in ``symbolic``: those of a symbolic graph's symbolic sizes and
    strides at this compile (``compile.SYMBOLIC_SIZES``), the divisors that
    may change with its symbols. Every other divisor is the same at every size of the
    stream (a channel count, an image's width under a dynamic batch)."""
    global _ALWAYS, _EVERY, _LITERAL_DIVISORS, _SYMBOLIC
    old = _ALWAYS, _EVERY, _LITERAL_DIVISORS, _SYMBOLIC
    _ALWAYS, _EVERY = frozenset(int(v) for v in values), every
    _LITERAL_DIVISORS, _SYMBOLIC = literal_divisors, frozenset(int(v) for v in symbolic)
    try:
        yield
    finally:
        _ALWAYS, _EVERY, _LITERAL_DIVISORS, _SYMBOLIC = old


def names_each_own() -> bool:
    """Is a generator to name each mark on its own (``lifting(..., every=True)``)?"""
    return _EVERY


def size(v) -> str:
    """``v`` (an integer from sizes or strides) as generated text: a mark to lift, or the
    literal when lifting is off or ``v`` is small (and not a symbol's value: ``lifting``)."""
    v = int(v)
    if not config.kernel_size_args:
        return str(v)
    if _EVERY:
        return str(v) if -1 <= v <= 1 else f"{_OPEN}{v}{_CLOSE}"
    if abs(v) <= config.kernel_size_args_min and v not in _ALWAYS:
        return str(v)
    return f"{_OPEN}{v}{_CLOSE}"


def divisor(v) -> str:
    """``v``, a divisor of an index (a size or a product of sizes), as generated text: the
    literal under ``lifting(..., literal_divisors=True)`` unless a symbolic size has its
    value, else as ``size`` writes it. A literal makes a text per divisor, which is
    sound as any literal is (the text is the key of its binary, and is what the
    generator writes at these sizes): a wrong guess (a divisor that changes with the
    symbols though no symbolic size of the graph has its value) costs a text per size,
    not a wrong result; a right one costs only the sharing of a binary between kernels
    that differ in their divisors."""
    v = int(v)
    return str(v) if _LITERAL_DIVISORS and v not in _SYMBOLIC else size(v)


#: integers a float type holds exactly: a lifted one converts to the same float
_EXACT = {"float32": 1 << 24, "float16": 1 << 11, "bfloat16": 1 << 8, "float64": 1 << 53}


def constant(value, dtype) -> str | None:
    """A graph constant that is a whole number (a mean's divisor, an ``arange`` end: a
    size as the graph spells it) as a mark, when its type holds it exactly and it is
    not small; None otherwise (written as a literal). The generator converts the
    integer argument to ``dtype``, which gives the literal's value bit for bit."""
    if isinstance(value, bool) or dtype.is_complex or dtype == torch.bool:
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    if not isinstance(value, int):
        return None
    limit = _EXACT.get(str(dtype).replace("torch.", ""), 1 << 62) if dtype.is_floating_point \
        else 1 << 62
    if abs(value) > limit:
        return None
    text = size(value)
    return text if is_lifted(text) else None


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


def each_own(text: str, start: int, spell=lambda i: f"ks{i}") -> tuple[str, list]:
    """``text`` with every mark its own argument, numbered from ``start``, and their
    values in order: unlike ``substitute``, values that happen to be equal at these sizes
    (a batch of 17 and a padded row's offset of 17) get separate names, so the text is
    the same at sizes where they differ."""
    vals = []

    def name(m):
        vals.append(int(m.group(1)))
        return spell(start + len(vals) - 1)
    return _MARK.sub(name, text), vals


def concrete(text: str) -> str:
    """``text`` with every mark replaced by its value: what the lifted text means at the
    values of this compile."""
    return _MARK.sub(lambda m: m.group(1), text)


@dataclass
class SizeArgs:
    """What a plan's launches pass besides tensors: the lifted values (C++: ``ks0``…,
    every kernel indexing them; Triton: ``S``, the segment launchers' host values,
    first), and for Triton each launch's grid (computed from this compile's sizes) and
    where its kernel's sizes lie in the device array (``device``: each launch's values
    in its kernel's own order, ``ks0`` first; ``slots``: per launch (offset, length) or
    None). A new size of the same text changes these values, never the text."""
    values: list = field(default_factory=list)
    grids: list = field(default_factory=list)
    device: list = field(default_factory=list)
    slots: list = field(default_factory=list)
