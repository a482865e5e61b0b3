"""New values of mutated inputs written straight into the inputs' memory.

A functional graph returns the new value of each input it mutates (an optimizer's
parameters and moments, BatchNorm's running statistics), and the autograd stage copies
it into the input after the call (``autograd.runtime._copy_mutations``). For AdamW
over a GPT-2 that copy moves three model-sized tensors every step (~1 ms on an H100,
and the graph holds a second copy of them). When the kernel computing the new value
reads the old value only at the element it writes, and nothing after that kernel reads
the old value, the kernel can store into the input itself: ``outputs`` finds those
outputs, the ``Runtime`` binds their buffers to the inputs, and the graph returns the
input as the output (the copy then has nothing to do).

Sound by these rules, checked on the schedule:
- the output is one whole kernel buffer (not a view, not a library result), stored in
  the input's exact sizes, strides and dtype, the input dense (no element twice);
- every kernel or library call reading the input runs no later than the kernel
  writing the new value, and that kernel is pointwise (no reduction, scatter or scan),
  reads the input only at the index it stores (no gather, no other offset) and only in
  members emitted up to the writing one, so each element is read before it is
  overwritten, by the same thread;
- the kernel is a Triton kernel (the caller's choice: C++ kernels take their buffers
  ``__restrict__``, which an aliased pair would break);
- neither the input nor the buffer is another output of the graph;
- the plan is not one loaded from the graph cache (its loop bodies are not kept).
The caller passes which outputs are new values of which inputs
(``gm.meta[MUTATIONS]``, positions in that very graph: a pass that drops placeholders
or outputs builds a new module without the key, as ``autograd.specialize`` does); only
its inference path does (no autograd history to record), and only for inputs that
share no storage with another input (checked per call before the graph runs).
"""
from __future__ import annotations

import collections

from .. import ir

#: ``aten_gm.meta[MUTATIONS] = [(input position, output position), ...]``: output k is
#: the new value of input i, which the caller copies into the input after the call.
MUTATIONS = "kiln_input_mutations"


def outputs(rt, mutations) -> dict:
    """{output position: input buffer name} of the mutations whose new value the kernel
    can write into the input itself."""
    if not mutations or not rt.plain_tuple:
        return {}
    sched = rt.sched
    if _bodies_dropped(sched):
        return {}
    input_of = {pos: name for pos, name in rt.inputs}
    group_of, readers_of = {}, {}       # buffer -> its group; buffer -> groups reading it
    for gi, g in enumerate(sched.groups):
        for n in g.nodes:
            group_of[n.name] = gi
        for m in _members(g):
            for r in m.reads():
                readers_of.setdefault(r, set()).add(gi)
    slot_users = collections.Counter(sched.slots.values())
    used = {}                  # buffer name -> how many outputs name it
    for kind, v in rt.out_plan:
        if kind != "const":
            name = v if kind == "buf" else v.buf
            used[name] = used.get(name, 0) + 1
    found = {}
    for i, k in mutations:
        p_name = input_of.get(i)
        if p_name is None or not (0 <= k < len(rt.out_plan)):
            continue
        kind, b_name = rt.out_plan[k]
        if kind != "buf" or used.get(b_name) != 1 or used.get(p_name) or p_name in found.values():
            continue
        if _writable_into(rt, group_of, sorted(readers_of.get(p_name, ())), slot_users,
                          rt.buffers[p_name], rt.buffers[b_name]):
            found[k] = p_name
    return found


def _bodies_dropped(sched) -> bool:
    """A plan loaded from the graph cache keeps no loop bodies (``graph_cache`` drops
    them: they went into the generated source), so nothing here can be checked: such a
    graph keeps the copy after the call."""
    return any(isinstance(m, (ir.Pointwise, ir.Reduction)) and m.body is None
               for g in sched.groups for m in _members(g))


def _members(g) -> list:
    """The buffers a group's kernel or library call computes."""
    members = [g.extern] if g.extern is not None else list(g.nodes)
    if g.alone is not None and g.alone not in members:
        members.append(g.alone)
    return members


def _writable_into(rt, group_of, reader_groups, slot_users, p, b) -> bool:
    if not isinstance(p, ir.Input) or not isinstance(b, ir.Pointwise):
        return False
    slot = rt.sched.slots.get(b.name)
    if slot is None or b.name not in group_of:
        return False
    sizes, strides, dtype = rt.slot_specs[slot]
    if (tuple(sizes), tuple(strides), dtype) != (tuple(p.sizes), tuple(p.strides), p.dtype) or \
            (tuple(b.sizes), tuple(b.strides)) != (tuple(p.sizes), tuple(p.strides)):
        return False
    if ir.numel_of(p.sizes) == 0 or ir.span(p.sizes, p.strides) != ir.numel_of(p.sizes):
        return False
    if slot_users[slot] != 1:
        return False
    gb = group_of[b.name]
    want = b.store_index(ir.loop_vars(b.sizes))
    for gi in reader_groups:
        g = rt.sched.groups[gi]
        if gi > gb:
            return False
        if gi < gb:
            continue
        if g.extern is not None or g.alone is not None or g.matmul is not None or g.red:
            return False
        after_b = False
        for n in g.nodes:
            if not isinstance(n, ir.Pointwise):
                return False
            if p.name not in n.reads():
                after_b = after_b or n.name == b.name
                continue
            if after_b:            # emitted after the store: it would read the new value
                return False
            after_b = n.name == b.name
            if tuple(n.sizes) != tuple(b.sizes):
                return False
            for x in ir.walk(n.body):
                if isinstance(x, ir.Load) and x.buf == p.name and (x.gather or x.index != want):
                    return False
    return True
