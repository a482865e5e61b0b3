"""A pointwise group of many independent outputs over few elements, spread over programs.

The scheduler fuses pointwise work of one iteration space into one kernel, including
work with no data in common: an optimizer's update of every small parameter (GPT-2's
biases and LayerNorm weights, about a hundred tensors of 768) is one group. Over 768
elements that kernel had one program, which walked every tensor in turn on one
multiprocessor while the rest of the GPU idled (0.26 ms of GPT-2's step). Here the
group's independent parts (nodes joined by what they read of each other) are dealt
into chunks, and axis 1 of the grid picks a chunk (``if part == k:``), so the parts run
side by side; a group with programs enough, or one part, keeps its single body.
"""
from __future__ import annotations

from ... import ir

#: below this many programs along the elements, a group's independent parts are spread
SPREAD_BELOW = 32
#: at most this many chunks (programs along axis 1)
MAX_CHUNKS = 64


def parts(nodes, names, writes, sizes) -> list:
    """The group's nodes cut into independent parts (in order). One part holds nodes
    that read one another's values, and nodes that read one buffer from outside the
    group element for element: an output may be stored into the memory of an input it
    reads at its own element (``runtime/in_place``), which is sound only while every
    reader of that input is the same thread, before the store. (A broadcast read, a 0-d
    learning rate, cannot be such an input: those outputs are the group's full size.)"""
    parent = {n.name: n.name for n in nodes}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def join(a, b):
        parent[find(a)] = find(b)
    reader_of: dict = {}
    for n in nodes:
        for r in n.reads():
            if r in names and r in parent:
                join(r, n.name)
        for e in ir.walk(n.body):
            if isinstance(e, ir.Load) and e.buf not in names and _whole(e, sizes):
                if e.buf in reader_of:
                    join(reader_of[e.buf], n.name)
                reader_of[e.buf] = n.name
    groups: dict = {}
    for n in nodes:
        groups.setdefault(find(n.name), []).append(n)
    out = list(groups.values())
    # a part that stores nothing computes for nobody else's store: it cannot be, but a
    # group is kept whole rather than trusting that
    if any(not any(n.name in writes for n in p) for p in out):
        return [list(nodes)]
    return out


def chunks(nodes, names, writes, programs: int, sizes) -> list:
    """The node lists each program along axis 1 runs: one list (the whole group) unless
    the group has fewer than ``SPREAD_BELOW`` programs and several independent parts."""
    if programs >= SPREAD_BELOW:
        return [list(nodes)]
    ps = parts(nodes, names, writes, sizes)
    if len(ps) < 2:
        return [list(nodes)]
    k = min(len(ps), MAX_CHUNKS)
    out = [[] for _ in range(k)]
    for i, p in enumerate(ps):
        out[i * k // len(ps)] += p          # contiguous runs of parts, in order
    return out


def _whole(load, sizes) -> bool:
    """Does ``load`` read element for element along every dim of the group's ``sizes``
    (more than one element, not a broadcast)?"""
    live = {f"x{i}" for i, s in enumerate(sizes) if int(s) != 1}
    return bool(live) and live <= load.index.vars()
