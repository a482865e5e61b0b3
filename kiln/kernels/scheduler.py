"""Fusion and buffer planning: buffers → kernels (groups) → loops, locals, memory slots.

A *group* is one kernel: an outer iteration space ``outer`` (run in parallel) and an
inner one ``red``. Pointwise buffers over ``outer + red`` and reductions from ``outer``
over ``red`` can share a group — pointwise chains, pointwise-into-reduction, reduction
epilogues and unrelated same-shape buffers (horizontal fusion) alike — provided every
read of a buffer made in the group hits the element the same outer iteration made.
Groups are greedy over the topological order, so running them in order is always
correct; a buffer the current group cannot take may still join a recent reduction's
kernel as a per-row epilogue, once everything it reads exists by then.

Inside a group, buffers are split into *loops* run one after another per outer index: a
loop ends where a later buffer needs a reduction it finished. Buffers nobody outside the
group reads become locals (scalars in registers). The rest get memory *slots*; a slot
whose buffer is dead is reused by a later buffer of the same size and dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import ir
from .ir import Affine, Load, loop_vars
from .matmul_fusion import fuse


@dataclass
class Group:
    outer: tuple                  # parallel dims
    red: tuple | None             # inner dims; None while only pointwise (flexible)
    nodes: list = field(default_factory=list)
    extern: ir.Buffer | None = None
    #: a library product computed by this group's kernel itself (matmul_epilogue)
    matmul: ir.Buffer | None = None
    #: a buffer with a kernel of its own (``ir.Scatter``, ``ir.Scan``)
    alone: ir.Buffer | None = None
    loops: list = field(default_factory=list)   # list of ("outer", [nodes]) / ("inner", [nodes])

    @property
    def names(self):
        return {n.name for n in self.nodes}

    def level(self, b) -> str:
        """'outer' for buffers computed once per outer index, else 'inner'."""
        if isinstance(b, ir.Reduction):
            return "reduction"
        red = self.red or ()
        if red and tuple(b.sizes) == tuple(self.outer):
            return "outer"
        return "inner"

    def all_vars(self):
        return loop_vars(tuple(self.outer) + tuple(self.red or ()))

    def outer_vars(self):
        return loop_vars(tuple(self.outer))


def _shape_fits(g: Group, b) -> tuple | None:
    """The (outer, red) the group would have with ``b`` in it, or None."""
    if isinstance(b, ir.Reduction):
        o2, r2 = tuple(b.sizes), tuple(b.red_sizes)
        if g.red is None:
            if tuple(g.outer) in (o2 + r2, o2):
                return o2, r2
            return None
        return (o2, r2) if (o2, r2) == (tuple(g.outer), tuple(g.red)) else None
    s = tuple(b.sizes)
    if g.red is None:
        return (g.outer, None) if s == tuple(g.outer) else None
    if s == tuple(g.outer) + tuple(g.red) or s == tuple(g.outer):
        return g.outer, g.red
    return None


def expected_read(g: Group, producer) -> Affine:
    """The index at which a group member may read ``producer``: its own element."""
    if g.level(producer) == "inner":
        return producer.store_index(g.all_vars())
    return producer.store_index(g.outer_vars())


def _reads_ok(g: Group, b) -> bool:
    names = g.names
    if names.isdisjoint(ir.loaded_buffers(b.body)):   # (cached) reads nothing of the group
        return True
    for e in ir.walk(b.body):
        if isinstance(e, Load) and e.buf in names:
            p = next(n for n in g.nodes if n.name == e.buf)
            if e.mask is not None or e.gather or e.index != expected_read(g, p):
                return False
            if g.level(b) == "outer" and g.level(p) == "inner":
                return False
    return True


def _try_add(g: Group, b) -> bool:
    fit = _shape_fits(g, b)
    if fit is None:
        return False
    trial = Group(fit[0], fit[1], list(g.nodes))
    # re-check earlier members under the new split, then the newcomer
    for i, n in enumerate(trial.nodes):
        if not _reads_ok(Group(trial.outer, trial.red, trial.nodes[:i]), n):
            return False
    if not _reads_ok(trial, b):
        return False
    g.outer, g.red = trial.outer, trial.red
    g.nodes.append(b)
    return True


#: how many kernels back a reduction's epilogue may be fused (``_earlier_reduction``)
LOOKBACK = 8


def _earlier_reduction(groups: list, b, made_in: dict, cur) -> int | None:
    """Fuse ``b`` into a recent reduction kernel as a per-row epilogue, when the greedy
    pass has moved on: BatchNorm's new running statistics read the batch statistics
    but come after the normalised output, so they would be a kernel of their own (a
    launch per layer per step). Only buffers of the reduction's outer shape, and only
    kernels after everything ``b`` reads was made; the index of the group taken."""
    if isinstance(b, ir.Reduction):
        return None
    after = max((made_in.get(r, -1) for r in b.reads()), default=-1)
    for gi in range(len(groups) - 1, max(after, len(groups) - 1 - LOOKBACK, 0) - 1, -1):
        g = groups[gi]
        if (g is cur or g.extern is not None or g.alone is not None or g.matmul is not None
                or not g.red or tuple(b.sizes) != tuple(g.outer)):
            continue
        if _try_add(g, b):
            return gi
    return None


#: how many of the kernels sharing a read with an output it tries to join, latest first
#: (a value read all over a graph would otherwise make each try cost the whole graph)
SIBLING_TRIES = 4


def _sibling_group(groups: list, b, made_in: dict, touched: dict, cur) -> int | None:
    """Fuse an output ``b`` into the latest earlier pointwise kernel that reads or makes
    something ``b`` reads (horizontal fusion across the gap), once everything ``b``
    reads exists by then: an optimizer's list ops make each parameter's new state one
    list op after another (every ``exp_avg``, then every ``exp_avg_sq``, then every
    parameter), and this puts each parameter's whole update back in one kernel that
    reads its gradient and state once. Only outputs, whose memory lives to the end of
    the graph anyway, so computing them earlier costs nothing at the peak."""
    if isinstance(b, ir.Reduction):
        return None
    after = max((made_in.get(r, -1) for r in b.reads()), default=-1)
    near = {gi for r in b.reads() for gi in touched.get(r, ()) if gi >= after}
    for gi in sorted(near, reverse=True)[:SIBLING_TRIES]:
        g = groups[gi]
        if (g is cur or g.extern is not None or g.alone is not None or g.matmul is not None
                or g.red is not None):
            continue
        if _try_add(g, b):
            return gi
    return None


@dataclass
class Schedule:
    groups: list
    locals: set
    slots: dict            # buffer name -> slot index
    slot_specs: list       # (span, dtype, sizes, strides) per slot
    outputs: set


def live_buffers(buffers: list, output_names: set) -> list:
    """``buffers`` without computed ones that nothing needs: a max pool's indices in an
    inference graph, say, whose lowering builds them beside the values. Library calls
    and fallbacks are always kept (they may write to their arguments)."""
    live = set(output_names)
    for b in reversed(buffers):
        if isinstance(b, (ir.Input, ir.Extern, ir.MultiOutput)):
            live.add(b.name)
        if b.name in live:
            live |= b.reads()
    return [b for b in buffers if b.name in live]


def schedule(buffers: list, output_names: set, matmul_epilogues: bool = False,
             loops_apart=None) -> Schedule:
    """``matmul_epilogues``: fuse large library products into their pointwise reader
    (Triton only; ``matmul_fusion``). ``loops_apart(group) -> bool``: a group of several
    reduction loops it holds is cut into one group per loop (``_loops_apart``)."""
    buffers = hoist_scalars(live_buffers(buffers, output_names))
    squeeze_unit_dims(buffers)
    groups: list[Group] = []
    made_in: dict = {}            # buffer name -> index of the group computing it
    touched: dict = {}            # buffer name -> indices of the groups making or reading it
    cur = None

    def place(b, gi):
        made_in[b.name] = gi
        for r in b.reads() | {b.name}:
            touched.setdefault(r, set()).add(gi)

    for b in buffers:
        if isinstance(b, ir.Input):
            continue
        if isinstance(b, (ir.Extern, ir.MultiOutput)):
            if isinstance(b, ir.Extern):
                groups.append(Group((), (), [b], extern=b))
            made_in[b.name] = len(groups) - 1
            cur = None
            continue
        if isinstance(b, (ir.Scatter, ir.Scan)):
            groups.append(Group(tuple(b.sizes), (), [b], alone=b))
            made_in[b.name] = len(groups) - 1
            cur = None
            continue
        if cur is not None and _try_add(cur, b):
            place(b, len(groups) - 1)
            continue
        earlier = _earlier_reduction(groups, b, made_in, cur)
        if earlier is None and b.name in output_names:
            earlier = _sibling_group(groups, b, made_in, touched, cur)
        if earlier is not None:
            place(b, earlier)
            continue
        place(b, len(groups))
        if isinstance(b, ir.Reduction):
            cur = Group(tuple(b.sizes), tuple(b.red_sizes), [b])
        else:
            cur = Group(tuple(b.sizes), None, [b])
        groups.append(cur)
    if matmul_epilogues:
        groups = fuse(groups, buffers, set(output_names))
    if loops_apart is not None:
        groups = _loops_apart(groups, loops_apart)

    # who reads what: by group, and by reading node
    readers, node_readers = {}, {}
    for gi, g in enumerate(groups):
        for n in g.nodes:
            for r in n.reads():
                readers.setdefault(r, set()).add(gi)
                node_readers.setdefault(r, set()).add(n.name)
        if g.matmul is not None:          # the operands live until the fused kernel
            for r in g.matmul.reads():
                readers.setdefault(r, set()).add(gi)

    locals_ = set()
    for g_i, g in enumerate(groups):
        if g.extern is not None or g.alone is not None:
            continue
        if not g.loops:             # (``_loops_apart`` made them already)
            _split_loops(g)
        loop_of = {n.name: li for li, (_, ns) in enumerate(g.loops) for n in ns}
        for n in g.nodes:
            if n.name in output_names or not readers.get(n.name, set()) <= {g_i}:
                continue
            if g.level(n) == "inner":
                # a per-element temporary lives only inside its own loop
                if any(loop_of[r] != loop_of[n.name] for r in node_readers.get(n.name, ())):
                    continue
            locals_.add(n.name)

    # memory slots for stored kernel buffers, reusing dead ones
    last_use = {}
    for name, rs in readers.items():
        last_use[name] = max(rs)
    slots, specs, free = {}, [], []   # free: list of (available_from_group, slot)
    for gi, g in enumerate(groups):
        if g.extern is not None:
            continue
        for n in g.nodes:
            if n.name in locals_:
                continue
            key = (ir.span(n.sizes, n.strides), n.dtype)
            reuse = None
            if n.name not in output_names:
                for k, (avail, s) in enumerate(free):
                    if avail <= gi and specs[s][:2] == key:
                        reuse = k
                        break
            if reuse is not None:
                slot = free.pop(reuse)[1]
            else:
                slot = len(specs)
                specs.append((key[0], key[1], tuple(n.sizes), tuple(n.strides)))
            slots[n.name] = slot
            if n.name not in output_names:
                free.append((last_use.get(n.name, gi) + 1, slot))
    return Schedule(groups, locals_, slots, specs, set(output_names))


def _split_loops(g: Group) -> None:
    """Consecutive members share one inner loop until one needs a finished reduction.
    A member that needs nothing from the group beyond per-element values of the first
    inner loop joins that loop instead (one pass; and on a GPU the loop can be split
    across programs): e.g. the toy example's ``a / (|a| + 1)`` next to ``b.sum() < 0``."""
    loops = []
    cur_inner, cur_reds = None, set()
    first, avail0 = None, set()
    names = g.names
    for n in g.nodes:
        lvl = g.level(n)
        if lvl == "outer":
            loops.append(("outer", [n]))
            cur_inner, cur_reds = None, set()
            continue
        internal = n.reads() & names
        if first is not None and cur_inner is not first and internal <= avail0:
            first.append(n)
            if lvl == "inner":
                avail0.add(n.name)
            continue
        needs = n.reads() & cur_reds
        if cur_inner is None or needs:
            cur_inner, cur_reds = [], set()
            loops.append(("inner", cur_inner))
            if first is None:
                first = cur_inner
        cur_inner.append(n)
        if lvl == "reduction":
            cur_reds.add(n.name)
        elif cur_inner is first:
            avail0.add(n.name)
    g.loops = loops


def _loops_apart(groups: list, wanted) -> list:
    """Each group of several inner loops that ``wanted`` says so of, cut into one group
    per inner loop (with the per-output code after it). A group's loops run in sequence
    per outer index, so groups run in the same sequence compute the same; what a later
    loop read from an earlier one's reductions (a batch norm's mean, in its variance
    loop) it now loads from memory. Why: the Triton generator splits one loop of
    reductions over many programs, not several in sequence; a batch norm's statistics
    over 64 channels of 400k values each, kept in one group, run on 64 programs (or one,
    channels-last) walking all their values twice."""
    out = []
    for g in groups:
        if g.extern is not None or g.alone is not None or g.matmul is not None or not g.red:
            out.append(g)
            continue
        _split_loops(g)
        cuts = [i for i, (kind, _) in enumerate(g.loops) if kind == "inner"][1:]
        if not cuts or not wanted(g):
            out.append(g)
            continue
        bounds = [0] + cuts + [len(g.loops)]
        for a, b in zip(bounds, bounds[1:]):
            part = Group(g.outer, g.red, [n for _, ns in g.loops[a:b] for n in ns])
            part.loops = [(kind, list(ns)) for kind, ns in g.loops[a:b]]
            out.append(part)
    return out


def format_schedule(s: Schedule) -> str:
    lines = []
    for i, g in enumerate(s.groups):
        if g.extern is not None:
            lines.append(f"kernel {i}: extern {g.extern.op} -> {g.extern.name}")
            continue
        if g.alone is not None:
            b = g.alone
            what = (f"scatter over {list(b.iter_sizes)}" if isinstance(b, ir.Scatter)
                    else f"{b.scan_type} scan along dim {b.dim}")
            lines.append(f"kernel {i}: {what} -> {b.name} (slot {s.slots.get(b.name)})")
            continue
        lines.append(f"kernel {i}: outer={list(g.outer)} inner={list(g.red or ())}")
        if g.matmul is not None:
            lines.append(f"  epilogue of {g.matmul.op} -> {g.matmul.name} (fused)")
        for kind, nodes in g.loops:
            lines.append(f"  {kind} loop: " + ", ".join(
                n.name + (" (local)" if n.name in s.locals else f" (slot {s.slots.get(n.name)})")
                for n in nodes))
    return "\n".join(lines)


def _rename(e, mapping: dict, memo: dict):
    """``e`` with loop variables renamed (``mapping``: old name -> new name)."""
    if e in memo:
        return memo[e]

    def ra(a: Affine) -> Affine:
        return Affine(tuple(sorted((mapping[v], c) for v, c in a.terms)), a.const)
    if isinstance(e, Load):
        r = Load(e.buf, ra(e.index), e.dtype,
                 None if e.mask is None else _rename(e.mask, mapping, memo),
                 tuple((_rename(v, mapping, memo), st) for v, st in e.gather))
    elif isinstance(e, ir.Index):
        r = ir.Index(ra(e.index), e.dtype)
    elif isinstance(e, ir.Op):
        r = ir.Op(e.name, tuple(_rename(a, mapping, memo) for a in e.args), e.dtype)
    else:
        r = e
    memo[e] = r
    return r


def hoist_scalars(buffers: list) -> list:
    """``buffers`` with each one-element pointwise buffer moved up to just after the
    last buffer it reads (never past a library call). An optimizer's step counters
    (``step + 1``, read by every parameter's update) then come before the updates'
    kernels rather than between them, where they would keep ``_sibling_group`` from
    completing each parameter's kernel. One element: the move costs no memory. So do
    library calls that say they may (``op.hoistable``: the host copies of the counters'
    new values, which would otherwise split each parameter's update in two kernels)."""
    primary: dict = {}         # buffer name -> the position it is placed after
    keys = []
    floor = 0                  # nothing moves above the last library call
    for i, b in enumerate(buffers):
        hoistable = isinstance(b, ir.Extern) and getattr(b.op, "hoistable", False)
        if hoistable or (isinstance(b, ir.Pointwise) and ir.numel_of(b.sizes) == 1):
            primary[b.name] = max([floor] + [primary[r] for r in b.reads() if r in primary])
            keys.append((primary[b.name], 1, i))
        else:
            primary[b.name] = i
            keys.append((i, 0, 0))
        if isinstance(b, (ir.Extern, ir.MultiOutput, ir.Scatter, ir.Scan)) and not hoistable:
            floor = i
    return [b for _, b in sorted(zip(keys, buffers), key=lambda kb: kb[0])]


def squeeze_unit_dims(buffers: list) -> None:
    """Drop size-1 dims from computed buffers' iteration spaces, in place: (N, 1) stats
    then fuse with the (N,)-outer reductions that make them (LayerNorm's mean and rstd).
    Their bodies never use a size-1 dim's variable (``loop_vars`` makes it 0); readers
    keep their own views' strides, so only the store side changes."""
    for b in buffers:
        if not isinstance(b, (ir.Pointwise, ir.Reduction)):
            continue
        keep = [i for i, s in enumerate(b.sizes) if int(s) != 1]
        if len(keep) == len(b.sizes):
            continue
        mapping = {f"x{i}": f"x{j}" for j, i in enumerate(keep)}
        k, k2 = len(b.sizes), len(keep)
        if isinstance(b, ir.Reduction):
            mapping.update({f"x{k + j}": f"x{k2 + j}" for j in range(len(b.red_sizes))})
        b.body = _rename(b.body, mapping, {})
        b.sizes = tuple(b.sizes[i] for i in keep)
        b.strides = tuple(b.strides[i] for i in keep)
