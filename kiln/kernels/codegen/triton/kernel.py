"""One fused group as a ``@triton.jit`` kernel (``TritonKernel``): pointwise groups
flattened over ``XBLOCK`` elements (or over rows: ``row_tiles``), reduction groups as
the plan of ``heuristics`` says, and split reductions as two kernels (``split_group``)."""

from __future__ import annotations

import torch

from ... import ir
from ...ir import Affine, Load, numel_of
from ...reductions import KINDS
from ...scheduler import Group, Schedule
from .exprs import (TL, TBody, acc_dtype, compute_dtype, decompose, memory_order, pow2,
                    store_value, tindex)
from .heuristics import Plan, plan_reduction
from .. import dim_merge
from . import horizontal, row_tiles
from .unmask import unmask
from ..size_args import is_lifted, names_each_own, size


XBLOCK = 1024
#: Bytes each thread of a large pointwise kernel reads from its widest tensor: 32 (two
#: 16-byte vectors). On the H100 an fp32 sin+cos ran at 101% of copy bandwidth with 8
#: elements a thread (XBLOCK 1024), 90% with 16; a bf16 GELU at 89% with 8 and 96% with
#: 16 (eager's: 95%) — so narrow types get more elements a thread, up to 32.
THREAD_BYTES = 32


#: Kernels over fewer elements keep XBLOCK 1024: more programs than multiprocessors.
WIDE_MIN_NUMEL = 1 << 20
MAX_RBLOCK = 1024
#: A pointwise kernel with more IR ops than this gets 8 warps (see _pointwise_warps).
HEAVY_OPS = 96


class TritonKernel:
    def __init__(self, gi, g: Group, sched: Schedule, name=None, plan=None, partials=None,
                 interpret=False):
        self.gi, self.g, self.s = gi, g, sched
        self.name = name or f"kernel{gi}"
        self.counter = [0]
        self.interpret = interpret
        self.plan = plan
        self.partials = partials or {}     # reduction name -> workspace name (split stage 1)

    def params(self):
        names = self.g.names
        reads, writes = set(), set()
        for n in self.g.nodes:
            reads |= {r for r in n.reads() if r not in names}
            if n.name in self.partials:
                writes.add(self.partials[n.name])
            elif n.name not in self.s.locals:
                writes.add(n.name)
        return sorted(reads) + sorted(writes), writes

    def source(self):
        """(source, params, grid, constexprs, num_warps, autotune candidates)."""
        params, writes = self.params()
        origin = ", ".join(n.origin for n in self.g.nodes if getattr(n, "origin", ""))
        head = [f"# {self.name}: outer {_sizes(self.g.outer)}, inner "
                f"{_sizes(self.g.red or ())}; from {origin}"]
        if self.g.red is None:
            src, grid, consts = self._pointwise(params, writes)
            return "\n".join(head + ["@triton.jit"] + src), params, grid, consts, \
                self._pointwise_warps(), ()
        p = self.plan or plan_reduction(self.g, self.interpret)
        self.plan = p
        src, grid, consts = self._reduction(params, writes)
        deco = ["@triton.jit"]
        if p.tune:
            cfgs = ", ".join(f"triton.Config({{}}, num_warps={w})" for w in p.tune)
            deco = [f"@triton.autotune(configs=[{cfgs}], key=[], do_bench=kiln_bench)"] + deco
        return "\n".join(head + deco + src), params, grid, consts, p.num_warps, p.tune

    def _pointwise_warps(self) -> int:
        """4 warps (8 elements a thread at XBLOCK=1024); 8 for kernels with many ops
        (a pool's taps over a fused BatchNorm): half the elements a thread halves the
        unrolled code LLVM and ptxas see, and the compile time with it (resnet18's stem
        pool 1.1 s -> 0.7 s), at no cost to a memory-bound kernel's speed."""
        ops = sum(ir.op_count(n.body) for n in self.g.nodes)
        return 8 if ops > HEAVY_OPS else 4

    def _xblock(self, numel: int, writes, loads=None) -> int:
        """XBLOCK of a pointwise kernel: 1024, or for a large one over narrow types as
        many elements a thread (4 warps) as make ``THREAD_BYTES`` of its widest tensor
        (of its stores and ``loads``, all of its loads by default)."""
        if numel < WIDE_MIN_NUMEL or self._pointwise_warps() != 4:
            return XBLOCK
        if loads is None:
            loads = [e for n in self.g.nodes for e in ir.walk(n.body) if isinstance(e, Load)]
        widths = [n.dtype.itemsize for n in self.g.nodes if n.name in writes]
        widths += [e.dtype.itemsize for e in loads]
        per_thread = THREAD_BYTES // max(widths, default=4)
        return max(XBLOCK, min(4 * XBLOCK, 128 * per_thread))

    def _pointwise(self, params, writes):
        g = self.g
        sizes = tuple(g.outer)
        numel = numel_of(sizes)
        perm = memory_order(g, sizes, writes)
        rows = row_tiles.shape_of(g, sizes, perm, writes,
                                   lambda ls: self._xblock(numel, writes, ls))
        if rows is not None:
            return row_tiles.source(self, params, writes, rows)
        xb = self._xblock(numel, writes)
        if not names_each_own():
            # a small kernel's block shrinks to it; not in a symbolic graph's kernels,
            # whose sizes vary: each power of two would be a text and a binary of its own
            xb = min(xb, pow2(max(numel, 16)))
        out = [f"def {self.name}({', '.join(params)}, XBLOCK: tl.constexpr):",
               "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)"]
        mask = None
        if numel % xb or is_lifted(size(numel)):     # lifted: masked in every size class
            out.append(f"    xmask = xindex < {size(numel)}")
            mask = "xmask"
        vars_ = ir.loop_vars(sizes)
        bodies = {n.name: unmask(n.body, sizes) for n in g.nodes}
        stores = {n.name: n.store_index(vars_) for n in g.nodes if n.name in writes}
        merged = dim_merge.runs(dim_merge.affines(bodies.values(), stores.values()),
                                sizes, perm)
        drop = dim_merge.dropper(merged)
        if drop is not None:        # contiguous dims walked as one index (dim_merge)
            bodies = {k: ir.map_affines(e, drop) for k, e in bodies.items()}
            stores = {k: drop(a) for k, a in stores.items()}
        out += ["    " + l for l in decompose([vars_[r[-1]] for r in merged],
                                               dim_merge.run_sizes(merged, sizes), "xindex",
                                               bound=-(-numel // xb) * xb)]
        out.append("    xzero = xindex * 0")
        mk = f", mask={mask}" if mask else ""
        programs = -(-numel // xb)
        chunks = horizontal.chunks(g.nodes, g.names, writes, programs, sizes)
        if len(chunks) > 1:
            out.append("    part = tl.program_id(1)")
        for ci, nodes in enumerate(chunks):
            ind = "    " if len(chunks) == 1 else "        "
            if len(chunks) > 1:
                out.append(f"    if part == {ci}:")
            body = TBody({}, ind, self.counter, mask,
                         {f"x{i}" for i in range(len(sizes))}, "xzero")
            for n in nodes:
                v = body.render(bodies[n.name])
                body.values[n.name] = v
                if n.name in writes:
                    body.lines.append(f"{ind}tl.store({body.ptr(n.name, stores[n.name])}, "
                                      f"{store_value(v, n.dtype)}{mk})")
            out += body.lines
        # a literal: triton.cdiv costs ~5 us per call
        grid = f"({programs},)" if len(chunks) == 1 else f"({programs}, {len(chunks)})"
        return out, grid, {"XBLOCK": xb}

    def _reduction(self, params, writes):
        g, p = self.g, self.plan
        outer, red = tuple(g.outer), tuple(g.red)
        k = len(outer)
        onum, rnum = numel_of(outer), numel_of(red)
        ind = "    "
        # a column reduction's block is [RBLOCK, XBLOCK], reduced over axis 0: lanes
        # along the outputs, the contiguous dim, in Triton's default layout (each row
        # of the block one run of memory, the accumulator in the loads' own layout),
        # not left to its coalescing pass to reorder an [XBLOCK, RBLOCK] block by
        # contiguity (which it does for 16-byte loads, with a layout of its own)
        xs, rs, raxis = ("[None, :]", "[:, None]", 0) if p.column else ("[:, None]", "[None, :]", 1)
        shape = "[RBLOCK, XBLOCK]" if p.column else "[XBLOCK, RBLOCK]"
        out = [f"def {self.name}({', '.join(params)}, XBLOCK: tl.constexpr, "
               "RBLOCK: tl.constexpr):",
               f"{ind}xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK){xs}"]
        xmask = None
        if onum % p.xb or is_lifted(size(onum)):
            out.append(f"{ind}xmask = xindex < {size(onum)}")
            xmask = "xmask"
        all_vars = g.all_vars()
        sizes = outer + red
        self.bodies = {n.name: n.body for n in g.nodes}
        merged = dim_merge.runs(dim_merge.affines(
            self.bodies.values(),
            [n.store_index(all_vars) for n in g.nodes if n.name in writes]
            + [n.store_index(g.outer_vars()) for n in g.nodes if n.name in writes]),
            sizes, range(len(sizes)))
        # runs never cross from kept to reduced dims
        merged = [part for r in merged
                  for part in ([x for x in r if x < k], [x for x in r if x >= k]) if part]
        self.drop = dim_merge.dropper(merged)
        if self.drop is not None:   # contiguous dims walked as one index (dim_merge)
            self.bodies = {n: ir.map_affines(e, self.drop) for n, e in self.bodies.items()}
        outer_runs = [r for r in merged if r[0] < k]
        red_runs = [r for r in merged if r[0] >= k]
        out += [ind + l for l in decompose([all_vars[r[-1]] for r in outer_runs],
                                           dim_merge.run_sizes(outer_runs, sizes), "xindex",
                                           bound=-(-onum // p.xb) * p.xb)]
        out.append(f"{ind}xzero = xindex * 0")
        out.append(f"{ind}rbase = tl.arange(0, RBLOCK){rs}")
        out.append(f"{ind}xrzero = xzero + rbase * 0")
        if p.split > 1:
            out.append(f"{ind}rstart = tl.program_id(1) * {size(p.chunk)}")
            rmask_needed = rnum % p.chunk != 0
        else:
            rmask_needed = rnum % p.rb != 0 or rnum == 0    # empty: reduce nothing
        rmask_needed = rmask_needed or is_lifted(size(rnum))
        rvars = {f"x{i}" for i in range(k, k + len(red))}
        full = " & ".join(m for m in (xmask, "rmask" if rmask_needed else None) if m) or None
        if xmask and rmask_needed:
            full = "xrmask"
        two_d = (xmask, full, rvars)
        top = TBody({}, ind, self.counter, xmask, two_d=two_d)
        scope = top.values

        def r_lines(bi, start):
            ls = [f"{bi}rindex = {start} + rbase"]
            if rmask_needed:
                ls.append(f"{bi}rmask = rindex < {size(rnum)}")
                if xmask:
                    ls.append(f"{bi}xrmask = xmask & rmask")
            ls += [bi + l for l in decompose([all_vars[r[-1]] for r in red_runs],
                                             dim_merge.run_sizes(red_runs, sizes), "rindex")]
            return ls

        if p.persistent:
            out += r_lines(ind, "0")
        for li, (kind, nodes) in enumerate(g.loops):
            if li and not p.persistent:
                out.append(f"{ind}tl.debug_barrier()")   # earlier loops' stores, visible
            if kind == "outer":
                top.lines = []
                for n in nodes:
                    v = top.render(self.bodies[n.name])
                    scope[n.name] = v
                    if n.name in writes:
                        top.lines.append(f"{ind}tl.store({self._optr(n, g)}, "
                                         f"{store_value(v, n.dtype)}{_mk(xmask)})")
                out += top.lines
                continue
            reds = [n for n in nodes if isinstance(n, ir.Reduction)]
            for n in reds:
                a = f"acc_{n.name}"
                at = TL[acc_dtype(n)]
                if KINDS[n.red_type].is_arg:
                    vt = compute_dtype(n.body.dtype)
                    init = identity(n.red_type, vt)
                    out.append(f"{ind}{a}_v = tl.full({shape}, {init}, {TL[vt]})")
                    out.append(f"{ind}{a}_i = tl.zeros({shape}, tl.int64)")
                else:
                    out.append(f"{ind}{a} = tl.full({shape}, "
                               f"{identity(n.red_type, n.dtype)}, {at})")
            if p.persistent:
                bi = ind
                body = top
                body.lines = []
            else:
                # bounds that are no program ids: Triton 3.6's interpreter cannot loop
                # over such a range (a size argument, a loaded value, it can)
                out.append(f"{ind}for roffset in range(0, "
                           f"{size(p.chunk if p.split > 1 else rnum)}, RBLOCK):")
                bi = ind + "    "
                out += r_lines(bi, "rstart + roffset" if p.split > 1 else "roffset")
                body = TBody(dict(scope), bi, self.counter, xmask, two_d=two_d, memo=top.memo)
            fm = full
            for n in nodes:
                v = body.render(self.bodies[n.name])
                a = f"acc_{n.name}"
                rt = getattr(n, "red_type", None)
                L = body.lines.append
                if rt is None:
                    body.values[n.name] = v
                    if n.name in writes:
                        idx = self._merged(n.store_index(all_vars))
                        zero = "" if (idx.vars() & rvars and (idx.vars() - rvars or k == 0)) \
                            else " + xrzero"
                        L(f"{bi}tl.store({n.name} + {tindex(idx)}{zero}, "
                          f"{store_value(v, n.dtype)}{_mk(fm)})")
                    continue
                at = TL[acc_dtype(n)]
                kind = KINDS[rt]
                if kind.triton_fill is not None:
                    upd = kind.triton_update.format(a=a, v=_where(fm, v, kind.triton_fill))
                elif not kind.is_arg:
                    upd = _where(fm, kind.triton_update.format(a=a, v=v), a)
                else:
                    cmp = kind.arg_cmp
                    vt = TL[compute_dtype(n.body.dtype)]
                    nan = (f" | (({v} != {v}) & ({a}_v == {a}_v))"
                           if n.body.dtype.is_floating_point else "")
                    take = f"(({v} {cmp} {a}_v){nan})"
                    L(f"{bi}take = {fm} & {take}" if fm else f"{bi}take = {take}")
                    L(f"{bi}{a}_v = tl.where(take, {v}, {a}_v).to({vt})")
                    L(f"{bi}{a}_i = tl.where(take, rindex.to(tl.int64), {a}_i)")
                    continue
                L(f"{bi}{a} = ({upd}).to({at})")
            out += body.lines
            if p.persistent:
                top.lines = []
            for n in reds:
                a = f"acc_{n.name}"
                kind = KINDS[n.red_type]
                if not kind.is_arg:
                    fin = kind.triton_finish.format(a=a, axis=raxis)
                else:
                    out.append(f"{ind}_, {a}_r = tl.reduce(({a}_v, {a}_i), {raxis}, "
                               f"{kind.triton_arg_combine})")
                    fin = f"{a}_r"
                if kind.widens and acc_dtype(n) != compute_dtype(n.dtype):
                    fin = f"{fin}.to({TL[compute_dtype(n.dtype)]})"
                out.append(f"{ind}{a}_s = ({fin}){xs}")
                scope[n.name] = f"{a}_s"
                if n.name in self.partials:
                    out.append(f"{ind}tl.store({self.partials[n.name]} + {_partial(p, onum)}, "
                               f"{a}_s{_mk(xmask)})")
                elif n.name in writes:
                    out.append(f"{ind}tl.store({self._optr(n, g)}, "
                               f"{store_value(f'{a}_s', n.dtype)}{_mk(xmask)})")
        grid = f"({-(-onum // p.xb)}, {p.split})" if p.split > 1 else f"({-(-onum // p.xb)},)"
        return out, grid, {"XBLOCK": p.xb, "RBLOCK": p.rb}

    def _merged(self, idx: Affine) -> Affine:
        return idx if self.drop is None else self.drop(idx)

    def _optr(self, n, g):
        idx = self._merged(n.store_index(g.outer_vars()))
        return f"{n.name} + {tindex(idx)}" + ("" if idx.vars() else " + xzero")


def _partial(p: Plan, onum: int) -> str:
    """Where a split program's partial result goes: [outputs, split] for a row
    reduction (the second stage reads each output's partials in a row); [split,
    outputs] for a column one (stored and read along the contiguous outputs)."""
    if p.column:
        return f"tl.program_id(1) * {size(onum)} + xindex"
    return f"xindex * {size(p.split)} + tl.program_id(1)"


def _sizes(dims) -> str:
    """A list of sizes as a comment shows it."""
    return "[" + ", ".join(size(d) for d in dims) + "]"


def _mk(mask):
    return f", mask={mask}" if mask else ""


def _where(mask, v, other):
    return f"tl.where({mask}, {v}, {other})" if mask else v


def identity(kind: str, dtype) -> str:
    """The start value of a reduction kind (``reductions.KINDS``) for ``dtype``."""
    i = KINDS[kind].identity
    if i not in ("lowest", "highest"):
        return str(int(i))
    low = i == "lowest"
    if dtype.is_floating_point:
        return 'float("-inf")' if low else 'float("inf")'
    if dtype == torch.bool:
        return "0" if low else "1"
    info = torch.iinfo(dtype)
    return str(info.min if low else info.max)


def split_group(gi, g: Group, sched: Schedule, plan: Plan):
    """Stage 1: the group's first loop over ``plan.split`` chunks per output, reductions
    storing partial results to workspaces; stage 2: the partials combined, then the
    group's per-output code. Returns [(kernel, workspace allocations)]."""
    inner = g.loops[0][1]
    reds = [n for n in inner if isinstance(n, ir.Reduction)]
    outer = tuple(g.outer)
    onum = numel_of(outer)
    s = plan.split
    partials, allocs, stage2 = {}, [], []
    ovars = ir.loop_vars(outer)
    flat = ir.linear_index(ovars, ir.contiguous_strides(outer))
    rvar = Affine.var(f"x{len(outer)}") if s > 1 else Affine.c(0)
    part = flat + rvar * onum if plan.column else flat * s + rvar
    for n in reds:
        ws = f"ws{gi}_{n.name}"
        pdt = acc_dtype(n) if KINDS[n.red_type].triton_acc is None else torch.bool
        partials[n.name] = ws
        allocs.append((ws, onum * s, pdt))
        stage2.append(ir.Reduction(n.name, n.sizes, n.strides, n.dtype, red_sizes=(s,),
                                   red_type=KINDS[n.red_type].combine,
                                   body=Load(ws, part, pdt), origin=n.origin))
    g1 = Group(outer, tuple(g.red), list(inner), loops=[("inner", list(inner))])
    rest = [n for _, ns in g.loops[1:] for n in ns]
    g2 = Group(outer, (s,), stage2 + rest, loops=[("inner", stage2)] + list(g.loops[1:]))
    k1 = TritonKernel(gi, g1, sched, name=f"kernel{gi}_split", plan=plan, partials=partials)
    if plan.column:     # partials [split, outputs]: itself a column reduction
        p2 = plan_reduction(g2, allow_split=False)
        p2.tune = ()    # as a split's first stage: fixed warps, not autotuned
    else:
        p2 = Plan(min(pow2(onum), max(1, 1024 // pow2(s))), pow2(s), True, False)
        p2.num_warps = max(2, min(8, p2.xb * p2.rb // 256))
    k2 = TritonKernel(gi, g2, sched, name=f"kernel{gi}", plan=p2)
    return [(k1, allocs), (k2, [])]
