"""Kernels of one C++ source that are the same function up to buffer names are emitted once.

A model of N identical blocks (transformer layers) lowers to N copies of each block's
kernels, which differ only in the names of the buffers they read and write (``buf12`` in
one layer, ``buf52`` in the next). g++'s time grows with the functions it optimises, so
the copies made a 24-layer graph's C++ compile ~5x a 2-layer one's. Here each kernel's
text is put in a canonical form — every buffer name it mentions (its parameters, and its
group's own buffers inside local names such as ``acc_buf28``) renamed in order of first
use — and kernels with the same canonical form share the first one's function: the
others' calls in the entry points pass their own buffers in the first one's parameter
order. Sound by construction: equal canonical texts are the same function under a
renaming of its parameters, and the call binds each parameter to the buffer the
duplicate would have used. A shared function is marked ``noinline``: inlined into each
of its N call sites, g++ would optimise it N times again (the 24-layer backward's
compile took 1.6x as long). ``config.regional`` (``KILN_REGIONAL``) turns it off.

With sharing on, the entry points (``kiln_segN``: one call per kernel of the graph, so
their text grows with the depth where the kernels' no longer do) are compiled without
optimisation (``entry_points``): optimised, they were most of a 24-layer backward's
compile time left (0.3 of 1.2 s), for calls that run once per segment. The kernels they
call keep every optimisation; a kernel called from one entry point is then a call
rather than inlined there, which costs a few nanoseconds per call.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: a buffer name the lowering makes (``buf12``, ``in3``), alone or as a part of a local
#: name between underscores (``acc_buf28_c``); a name of another form leaves its kernel
#: unshared rather than risk renaming a part of some other identifier
_NAME = re.compile(r"[A-Za-z]+[0-9]+")
_PART = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]+[0-9]+(?![A-Za-z0-9])")


@dataclass(frozen=True)
class Shared:
    """Where a kernel's call goes: the function ``kernel{gi}`` and its arguments (buffer
    names, in that function's parameter order)."""
    gi: int
    args: tuple


def _canonical(src: str, params: list, names: set) -> tuple[str, list] | None:
    """``src`` (a kernel's text from its signature on; the comment above it dropped)
    with the buffer names renamed ``kiln_b0, kiln_b1…`` by first use, its parameters
    listed in canonical order; and the names in that order. None when a name does not
    look like a buffer name."""
    if not all(_NAME.fullmatch(n) for n in names | set(params)):
        return None
    lines = src.split("\n")
    at = next(i for i, l in enumerate(lines) if l.startswith("static void kernel"))
    head, body = lines[at], "\n".join(lines[at + 1:])
    order: dict = {}
    for m in _PART.finditer(body):
        p = m.group(0)
        if p in names and p not in order:
            order[p] = len(order)
    for p in params:
        order.setdefault(p, len(order))

    def rename(m):
        p = m.group(0)
        return f"kiln_b{order[p]}" if p in order else p

    inside = head[head.index("(") + 1:head.rindex(")")]
    decls = [d for d in inside.split(", ") if d]
    typed = {}
    for d in decls:
        name = d.rsplit(" ", 1)[-1]
        typed[name] = d[:-len(name)]
    if set(typed) != set(params):
        return None
    sig = ", ".join(typed[p] + f"kiln_b{order[p]}" for p in sorted(params, key=order.get))
    text = f"static void KERNEL({sig}) {{\n" + _PART.sub(rename, body)
    return text, sorted(order, key=order.get)


def share(kernels: list) -> dict:
    """``kernels``: (gi, source, params, group buffer names) per kernel, in order. Returns,
    for each kernel whose function an earlier one already is, its ``Shared`` call."""
    first: dict = {}            # canonical text -> (gi, params, canonical names)
    out: dict = {}
    for gi, src, params, names in kernels:
        c = _canonical(src, params, set(names) | set(params))
        if c is None:
            continue
        text, canon = c
        if text not in first:
            first[text] = (gi, params, canon)
            continue
        gi0, params0, canon0 = first[text]
        mine = dict(zip(canon0, canon))       # the first one's name -> this kernel's
        out[gi] = Shared(gi0, tuple(mine[p] for p in params0))
    return out


def callees(calls_to: dict) -> set:
    """The kernels whose function other kernels' calls run."""
    return {s.gi for s in calls_to.values()}


def not_inlined(src: str) -> str:
    """A kernel's text with its function marked ``noinline``."""
    return src.replace("\nstatic void kernel", "\n__attribute__((noinline))\nstatic void kernel", 1)


#: around the entry points: g++ compiles them at -O0 (other compilers ignore it)
_PLAIN_BEGIN = ('#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n'
                '#pragma GCC optimize ("O0")\n#endif')
_PLAIN_END = '#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC pop_options\n#endif'


def entry_points(parts: list) -> list:
    """The entry points' texts, to be compiled without optimisation (module doc)."""
    return [_PLAIN_BEGIN, *parts, _PLAIN_END] if parts else []
