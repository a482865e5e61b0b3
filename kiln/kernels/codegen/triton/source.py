"""Triton code generation: one ``@triton.jit`` kernel per group, readable, with masks.

* A pointwise group is flattened: each program owns ``XBLOCK`` consecutive elements,
  recovers the dims with ``//`` and ``%``, and masks the tail with ``xmask``.
* A group with inner dims runs one program per outer index; each loop walks the inner
  dims ``RBLOCK`` at a time under ``rmask``, accumulating reductions lane-wise and
  combining the lanes at the end (``tl.sum``/``tl.reduce``).

The module (kernels + one launcher per segment) is written to the cache directory and
imported, since ``triton.jit`` reads its source from a file. On CPU tensors it runs under
``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import torch

from .... import config
from ....debug.timing import timed
from ... import ir
from ...toolchain import cxx_build as cache
from ...ir import Affine, Const, Index, Load
from ...ops import OPS
from ...scheduler import Group, Schedule

TL = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
      torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
      torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
      torch.bool: "tl.int1"}
XBLOCK = 1024
#: Bytes each thread of a large pointwise kernel reads from its widest tensor: 32 (two
#: 16-byte vectors). On the H100 an fp32 sin+cos ran at 101% of copy bandwidth with 8
#: elements a thread (XBLOCK 1024), 90% with 16; a bf16 GELU at 89% with 8 and 96% with
#: 16 (eager's: 95%) — so narrow types get more elements a thread, up to 32.
THREAD_BYTES = 32
#: the integer type of each float's width, for constants written as bits
_BITS = {torch.float64: "tl.int64", torch.float32: "tl.int32", torch.float16: "tl.int16",
         torch.bfloat16: "tl.int16"}


def _negative_zero(dtype) -> str:
    """-0.0 of ``dtype``: the integer with only the sign bit set, bit-cast."""
    width = dtype.itemsize * 8
    return f"tl.full([], {-(1 << (width - 1))}, {_BITS[dtype]}).to({TL[dtype]}, bitcast=True)"
#: Kernels over fewer elements keep XBLOCK 1024: more programs than multiprocessors.
WIDE_MIN_NUMEL = 1 << 20
#: Ops only libdevice provides: Triton's interpreter cannot run them (no extern calls),
#: so under TRITON_INTERPRET=1 the lowering sends them to aten instead.
LIBDEVICE_ONLY = {"atan2", "asin", "acos", "atan", "asinh", "acosh", "atanh"}
MAX_RBLOCK = 1024
#: A pointwise kernel with more IR ops than this gets 8 warps (see _pointwise_warps).
HEAVY_OPS = 96

from .prelude import INTERPRETER_SHIMS, PRELUDE  # noqa: E402  (helpers of every kernel module)

# Triton spells a few ops differently from C++ (``and``/``or`` on int1 are bitwise).
_TRITON_OVERRIDES = {
    "expm1": "kiln_expm1({0})", "log1p": "kiln_log1p({0})", "tanh": "kiln_tanh({0})",
    "sinh": "kiln_sinh({0})", "cosh": "kiln_cosh({0})", "tan": "kiln_tan({0})",
    "log10": "kiln_log10({0})", "trunc": "kiln_trunc({0})", "round": "kiln_round({0})",
    "reciprocal": "(1.0 / {0})",
    "rsqrt": "(1.0 / tl.sqrt({0}))",
    "not": "({0} == 0)",
    "cast": "{0}.to({t})",
}


_IEEE = {"truediv": "tl.math.div_rn({0}, {1})", "sqrt": "tl.math.sqrt_rn({0})",
         "rsqrt": "tl.math.div_rn(1.0, tl.math.sqrt_rn({0}))",
         "reciprocal": "tl.math.div_rn(1.0, {0})"}


def tconst(value, dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return f'float("{"-" if v < 0 else ""}inf")'
        return repr(v)
    return repr(int(value))


def tindex(a: Affine) -> str:
    parts = [(v if k == 1 else f"{k}*{v}") for v, k in a.terms]
    if a.const or not parts:
        parts.append(str(a.const))
    return "(" + " + ".join(parts) + ")"


#: Low-precision floats are loaded into float32, computed in float32 and rounded once at
#: the store (what libraries do; Triton's math functions have no bf16/fp16 versions).
_COMPUTE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return _COMPUTE.get(dtype, dtype)


def acc_dtype(n) -> torch.dtype:
    """The dtype of a reduction's accumulator: fixed for the whole loop."""
    if n.red_type == "any":
        return torch.int8
    return compute_dtype(n.dtype)


class TBody:
    """One scope's lines. ``two_d``: a reduction kernel's [XBLOCK, RBLOCK] block, where
    loads broadcast naturally (an index without reduced variables loads [XBLOCK, 1])."""

    def __init__(self, values, indent, counter, mask, block_vars=(), zero="", two_d=None,
                 memo=None):
        self.lines, self.memo = [], dict(memo or {})
        self.values, self.indent, self.counter, self.mask = values, indent, counter, mask
        self.block_vars, self.zero = set(block_vars), zero
        self.two_d = two_d          # None, or (xmask, full mask, reduced var names)

    def ptr(self, buf, index: Affine) -> str:
        """``buf + index``, broadcast to the block when the index is the same for all lanes."""
        p = f"{buf} + {tindex(index)}"
        if self.zero and not (index.vars() & self.block_vars):
            p += f" + {self.zero}"
        return p

    def tmp(self, rhs):
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(f"{self.indent}{name} = {rhs}")
        return name

    def load_mask(self, index: Affine):
        if self.two_d is None:
            return self.mask
        xmask, full, rvars = self.two_d
        return full if index.vars() & rvars else xmask

    def address(self, e: Load) -> str:
        """The pointers ``e`` addresses: its buffer plus its affine index plus its
        indirect terms (an int64 value times a stride each)."""
        p = f"{e.buf} + {tindex(e.index)}" if self.two_d else self.ptr(e.buf, e.index)
        for v, st in e.gather:
            p += f" + {self.render(v)}.to(tl.int64) * {st}"
        return p

    def render(self, e) -> str:
        if e in self.memo:
            return self.memo[e]
        cdt = compute_dtype(e.dtype)
        if isinstance(e, Const):
            # Triton makes any constant equal to 0 a +0.0, and negates by subtracting
            # from 0 (+0.0 again): -0.0 is written as its bits, the sign bit alone
            neg0 = cdt.is_floating_point and e.value == 0 and math.copysign(1, e.value) < 0
            s = self.tmp(_negative_zero(cdt) if neg0 else
                         f"tl.full([], {tconst(e.value, cdt)}, {TL[cdt]})")
        elif isinstance(e, Index):
            if e.index.terms:
                s = self.tmp(f"{tindex(e.index)}.to(tl.int64)")
            else:
                s = self.tmp(f"tl.full([], {e.index.const}, tl.int64)")
        elif isinstance(e, Load):
            if e.buf in self.values and e.mask is None and not e.gather:
                s = self.values[e.buf]
            else:
                masks = [m for m in (self.load_mask(e.index),
                                     self.render(e.mask) if e.mask is not None else None) if m]
                mk = f", mask={' & '.join(masks)}, other=0" if masks else ""
                s = self.tmp(f"tl.load({self.address(e)}{mk})")
                if e.dtype == torch.bool:
                    s = self.tmp(f"{s} != 0")
                elif cdt != e.dtype:
                    s = self.tmp(f"{s}.to({TL[cdt]})")
        else:
            tpl = _TRITON_OVERRIDES.get(e.name, OPS[e.name][1])
            if cdt == torch.float32 and e.name in _IEEE:
                tpl = _IEEE[e.name]      # fp32 / and sqrt are approximate on GPUs; fp64 is IEEE
            src = e.args[0].dtype if e.name == "cast" else None
            if e.name == "cast" and cdt != e.dtype:
                tpl = "{0}.to({t}).to(tl.float32)"     # round to the narrow type, then widen
                s = self.tmp(tpl.format(self.render(e.args[0]), t=TL[e.dtype]))
            elif e.name == "cast" and src.is_floating_point and compute_dtype(src) != src:
                # a narrow value is held unrounded in its compute type (ops between
                # loads and stores round once, at the store); an explicit cast out of
                # the narrow type (autocast's ``.float()``) reads it rounded, as eager
                s = self.tmp(f"{self.render(e.args[0])}.to({TL[src]}).to({TL[cdt]})")
            else:
                args = [self.render(a) for a in e.args]
                s = self.tmp(tpl.format(*args, t=TL[cdt]))
        self.memo[e] = s
        return s


def store_value(v: str, dtype) -> str:
    return f"{v}.to({TL[dtype]})" if compute_dtype(dtype) != dtype else v


def _decompose(vars_, sizes, flat: str) -> list:
    """Lines recovering each dim's index from a flat one (contiguous order)."""
    lines, stride = [], 1
    strides = []
    for s in reversed(sizes):
        strides.append(stride)
        stride *= int(s)
    strides.reverse()
    for i, (v, s, st) in enumerate(zip(vars_, sizes, strides)):
        if v.terms:
            q = flat if st == 1 else f"({flat} // {st})"
            lines.append(f"{v.terms[0][0]} = {q}" if i == 0 else f"{v.terms[0][0]} = {q} % {int(s)}")
    return lines


def _memory_order(g, sizes, writes) -> list:
    """Dims from outermost to innermost in memory of the group's first stored buffer
    (a channels-last result walks channels fastest, so lanes stay coalesced)."""
    n = len(sizes)
    for node in g.nodes:
        if node.name in writes and tuple(node.sizes) == tuple(sizes):
            st = [int(s) for s in node.strides]
            if st == list(ir.contiguous_strides(sizes)):
                break
            return sorted(range(n), key=lambda i: (-st[i] if int(sizes[i]) != 1 else 0, i))
    return list(range(n))


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= int(s)
    return n


# --- how a reduction group maps onto programs ------------------------------------------
#: A reduced extent up to this (rounded to a power of two) stays whole in registers: one
#: pass over memory however many loops the group has (softmax, LayerNorm).
PERSISTENT_MAX = 8192
#: Reduced elements per step of a looped (non-persistent) row reduction.
LOOP_RBLOCK = 2048
#: Elements per program block the heuristics aim at.
BLOCK_ELEMS = 4096
#: Split a reduction into partial results when it would have fewer programs than this...
SPLIT_MAX_PROGRAMS = 256
#: ...and each output reduces at least this many elements.
SPLIT_MIN_RNUM = 32768
#: Programs a split reduction aims at (an H100 has 132 multiprocessors).
SPLIT_TARGET_PROGRAMS = 1024
#: Kernels over at least this many elements try a few num_warps on first use (GPU only).
AUTOTUNE_MIN_NUMEL = 1 << 24
_COMBINE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "any": "any"}


@dataclass
class Plan:
    xb: int                  # outputs per program (XBLOCK)
    rb: int                  # reduced elements per step (RBLOCK)
    persistent: bool         # the whole reduced extent in one block, no loop
    column: bool             # the kept dim is the contiguous one
    split: int = 1           # programs per output (partial results), 1: none
    chunk: int = 0           # reduced elements per split program
    num_warps: int = 4
    tune: tuple = ()         # num_warps candidates for the autotuner


def _column(g) -> bool:
    """Loads contiguous along the last kept dim and not along the innermost reduced one
    (sum over rows, over channels of NCHW): lanes should walk the kept dim."""
    if not g.outer or not g.red or int(g.outer[-1]) < 8:
        return False
    k = len(g.outer)
    last, inner = f"x{k - 1}", f"x{k + len(g.red) - 1}"
    loads = [e for n in g.nodes for e in ir.walk(n.body) if isinstance(e, Load)]
    return (any(e.index.coef(last) == 1 for e in loads)
            and not any(e.index.coef(inner) == 1 for e in loads))


def _splittable(g) -> bool:
    """One loop of plain reductions (and stored pointwise values), then per-output code."""
    if not g.loops or g.loops[0][0] != "inner":
        return False
    if any(kind != "outer" for kind, _ in g.loops[1:]):
        return False
    reds = [n for n in g.loops[0][1] if isinstance(n, ir.Reduction)]
    return bool(reds) and all(n.red_type in _COMBINE for n in reds)


def plan_reduction(g, interpret: bool = False) -> Plan:
    onum, rnum = _numel(g.outer), _numel(g.red)
    r2 = _pow2(max(rnum, 1))
    if _column(g):
        xb = min(_pow2(onum), 128)
        rb = max(1, min(r2, BLOCK_ELEMS // xb))
        p = Plan(xb, rb, rb >= rnum, True)
    else:
        persistent = r2 <= PERSISTENT_MAX
        rb = r2 if persistent else LOOP_RBLOCK
        xb = 1
        if rb < 1024:
            xb = max(1, min(_pow2(onum), 1024 // rb, 64))
        p = Plan(xb, rb, persistent, False)
    nprog = -(-onum // p.xb)
    if (not p.persistent and rnum >= SPLIT_MIN_RNUM and nprog < SPLIT_MAX_PROGRAMS
            and _splittable(g)):
        s = max(2, SPLIT_TARGET_PROGRAMS // nprog)
        s = min(s, max(2, rnum // (4 * p.rb)))
        chunk = -(-(-(-rnum // s)) // p.rb) * p.rb
        p.split, p.chunk = -(-rnum // chunk), chunk
    elems = p.xb * p.rb
    p.num_warps = max(2, min(16, elems // 256))
    if not interpret and onum * rnum >= min(AUTOTUNE_MIN_NUMEL, config.autotune_min_numel) \
            and p.split == 1:
        p.tune = (4, 8, 16) if elems >= 2048 else (2, 4, 8)
    return p


class AloneKernel:
    """Base of the kernel of a buffer computed by a kernel of its own (``Group.alone``:
    ``triton_scatter``, ``triton_scan``): its name and its parameters — the buffers it
    reads, then the one it writes."""

    def __init__(self, gi: int, b):
        self.name, self.b, self.counter = f"kernel{gi}", b, [0]

    def params(self):
        b = self.b
        return sorted(b.reads() - {b.name}) + [b.name], {b.name}


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
        head = [f"# {self.name}: outer {list(self.g.outer)}, inner "
                f"{list(self.g.red or ())}; from {origin}"]
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

    def _xblock(self, numel: int, writes) -> int:
        """XBLOCK of a pointwise kernel: 1024, or for a large one over narrow types as
        many elements a thread (4 warps) as make ``THREAD_BYTES`` of its widest tensor."""
        if numel < WIDE_MIN_NUMEL or self._pointwise_warps() != 4:
            return XBLOCK
        widths = [n.dtype.itemsize for n in self.g.nodes if n.name in writes]
        widths += [e.dtype.itemsize for n in self.g.nodes for e in ir.walk(n.body)
                   if isinstance(e, Load)]
        per_thread = THREAD_BYTES // max(widths, default=4)
        return max(XBLOCK, min(4 * XBLOCK, 128 * per_thread))

    def _pointwise(self, params, writes):
        g = self.g
        sizes = tuple(g.outer)
        numel = _numel(sizes)
        xb = min(self._xblock(numel, writes), _pow2(max(numel, 16)))
        out = [f"def {self.name}({', '.join(params)}, XBLOCK: tl.constexpr):",
               "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)"]
        mask = None
        if numel % xb:
            out.append(f"    xmask = xindex < {numel}")
            mask = "xmask"
        vars_ = ir.loop_vars(sizes)
        perm = _memory_order(g, sizes, writes)
        out += ["    " + l for l in _decompose([vars_[i] for i in perm],
                                               [sizes[i] for i in perm], "xindex")]
        body = TBody({}, "    ", self.counter, mask,
                     {f"x{i}" for i in range(len(sizes))}, "xzero")
        out.append("    xzero = xindex * 0")
        mk = f", mask={mask}" if mask else ""
        for n in g.nodes:
            v = body.render(n.body)
            body.values[n.name] = v
            if n.name in writes:
                body.lines.append(f"    tl.store({body.ptr(n.name, n.store_index(vars_))}, "
                                  f"{store_value(v, n.dtype)}{mk})")
        out += body.lines
        grid = f"({-(-numel // xb)},)"     # a literal: triton.cdiv costs ~5 us per call
        return out, grid, {"XBLOCK": xb}

    def _reduction(self, params, writes):
        g, p = self.g, self.plan
        outer, red = tuple(g.outer), tuple(g.red)
        k = len(outer)
        onum, rnum = _numel(outer), _numel(red)
        ind = "    "
        out = [f"def {self.name}({', '.join(params)}, XBLOCK: tl.constexpr, "
               "RBLOCK: tl.constexpr):",
               f"{ind}xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]"]
        xmask = None
        if onum % p.xb:
            out.append(f"{ind}xmask = xindex < {onum}")
            xmask = "xmask"
        all_vars = g.all_vars()
        out += [ind + l for l in _decompose(all_vars[:k], outer, "xindex")]
        out.append(f"{ind}xzero = xindex * 0")
        out.append(f"{ind}rbase = tl.arange(0, RBLOCK)[None, :]")
        out.append(f"{ind}xrzero = xzero + rbase * 0")
        if p.split > 1:
            out.append(f"{ind}rstart = tl.program_id(1) * {p.chunk}")
            rmask_needed = rnum % p.chunk != 0
        else:
            rmask_needed = rnum % p.rb != 0 or rnum == 0    # empty: reduce nothing
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
                ls.append(f"{bi}rmask = rindex < {rnum}")
                if xmask:
                    ls.append(f"{bi}xrmask = xmask & rmask")
            ls += [bi + l for l in _decompose(all_vars[k:], red, "rindex")]
            return ls

        if p.persistent:
            out += r_lines(ind, "0")
        for li, (kind, nodes) in enumerate(g.loops):
            if li and not p.persistent:
                out.append(f"{ind}tl.debug_barrier()")   # earlier loops' stores, visible
            if kind == "outer":
                top.lines = []
                for n in nodes:
                    v = top.render(n.body)
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
                if n.red_type in ("argmax", "argmin"):
                    vt = compute_dtype(n.body.dtype)
                    init = _init("max" if n.red_type == "argmax" else "min", vt)
                    out.append(f"{ind}{a}_v = tl.full([XBLOCK, RBLOCK], {init}, {TL[vt]})")
                    out.append(f"{ind}{a}_i = tl.zeros([XBLOCK, RBLOCK], tl.int64)")
                else:
                    out.append(f"{ind}{a} = tl.full([XBLOCK, RBLOCK], "
                               f"{_init(n.red_type, n.dtype)}, {at})")
            if p.persistent:
                bi = ind
                body = top
                body.lines = []
            else:
                # constant loop bounds: Triton 3.6's interpreter cannot loop over a
                # range whose bounds are program ids
                out.append(f"{ind}for roffset in range(0, {p.chunk if p.split > 1 else rnum}, RBLOCK):")
                bi = ind + "    "
                out += r_lines(bi, "rstart + roffset" if p.split > 1 else "roffset")
                body = TBody(dict(scope), bi, self.counter, xmask, two_d=two_d, memo=top.memo)
            fm = full
            for n in nodes:
                v = body.render(n.body)
                a = f"acc_{n.name}"
                rt = getattr(n, "red_type", None)
                L = body.lines.append
                if rt is None:
                    body.values[n.name] = v
                    if n.name in writes:
                        idx = n.store_index(all_vars)
                        zero = "" if (idx.vars() & rvars and (idx.vars() - rvars or k == 0)) \
                            else " + xrzero"
                        L(f"{bi}tl.store({n.name} + {tindex(idx)}{zero}, "
                          f"{store_value(v, n.dtype)}{_mk(fm)})")
                    continue
                at = TL[acc_dtype(n)]
                if rt == "sum":
                    upd = f"{a} + {_where(fm, v, '0')}"
                elif rt == "prod":
                    upd = f"{a} * {_where(fm, v, '1')}"
                elif rt == "any":
                    upd = f"{a} | {_where(fm, v, '0')}.to(tl.int8)"
                elif rt in ("max", "min"):
                    fn = "kiln_maximum" if rt == "max" else "kiln_minimum"
                    upd = _where(fm, f"{fn}({a}, {v})", a)
                else:
                    cmp = ">" if rt == "argmax" else "<"
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
                rt = n.red_type
                if rt == "sum":
                    fin = f"tl.sum({a}, 1)"
                elif rt == "prod":
                    fin = f"tl.reduce({a}, 1, kiln_prod_combine)"
                elif rt == "any":
                    fin = f"tl.max({a}, 1) != 0"
                elif rt in ("max", "min"):
                    fin = f"tl.reduce({a}, 1, kiln_{'maximum' if rt == 'max' else 'minimum'})"
                else:
                    out.append(f"{ind}_, {a}_r = tl.reduce(({a}_v, {a}_i), 1, kiln_{rt}_combine)")
                    fin = f"{a}_r"
                if rt in ("sum", "prod") and acc_dtype(n) != compute_dtype(n.dtype):
                    fin = f"{fin}.to({TL[compute_dtype(n.dtype)]})"
                out.append(f"{ind}{a}_s = ({fin})[:, None]")
                scope[n.name] = f"{a}_s"
                if n.name in self.partials:
                    out.append(f"{ind}tl.store({self.partials[n.name]} + xindex * {p.split} + "
                               f"tl.program_id(1), {a}_s{_mk(xmask)})")
                elif n.name in writes:
                    out.append(f"{ind}tl.store({self._optr(n, g)}, "
                               f"{store_value(f'{a}_s', n.dtype)}{_mk(xmask)})")
        grid = f"({-(-onum // p.xb)}, {p.split})" if p.split > 1 else f"({-(-onum // p.xb)},)"
        return out, grid, {"XBLOCK": p.xb, "RBLOCK": p.rb}

    def _optr(self, n, g):
        idx = n.store_index(g.outer_vars())
        return f"{n.name} + {tindex(idx)}" + ("" if idx.vars() else " + xzero")


def _mk(mask):
    return f", mask={mask}" if mask else ""


def _where(mask, v, other):
    return f"tl.where({mask}, {v}, {other})" if mask else v


def _init(red_type, dtype) -> str:
    if red_type == "sum" or red_type == "any":
        return "0"
    if red_type == "prod":
        return "1"
    if dtype.is_floating_point:
        return 'float("-inf")' if red_type == "max" else 'float("inf")'
    if dtype == torch.bool:
        return "0" if red_type == "max" else "1"
    info = torch.iinfo(dtype)
    return str(info.min if red_type == "max" else info.max)


def split_group(gi, g: Group, sched: Schedule, plan: Plan):
    """Stage 1: the group's first loop over ``plan.split`` chunks per output, reductions
    storing partial results to workspaces; stage 2: the partials combined, then the
    group's per-output code. Returns [(kernel, workspace allocations)]."""
    inner = g.loops[0][1]
    reds = [n for n in inner if isinstance(n, ir.Reduction)]
    outer = tuple(g.outer)
    onum = _numel(outer)
    s = plan.split
    partials, allocs, stage2 = {}, [], []
    ovars = ir.loop_vars(outer)
    flat = ir.linear_index(ovars, ir.contiguous_strides(outer))
    rvar = Affine.var(f"x{len(outer)}") if s > 1 else Affine.c(0)
    for n in reds:
        ws = f"ws{gi}_{n.name}"
        pdt = acc_dtype(n) if n.red_type != "any" else torch.bool
        partials[n.name] = ws
        allocs.append((ws, onum * s, pdt))
        stage2.append(ir.Reduction(n.name, n.sizes, n.strides, n.dtype, red_sizes=(s,),
                                   red_type=_COMBINE[n.red_type],
                                   body=Load(ws, flat * s + rvar, pdt), origin=n.origin))
    g1 = Group(outer, tuple(g.red), list(inner), loops=[("inner", list(inner))])
    rest = [n for _, ns in g.loops[1:] for n in ns]
    g2 = Group(outer, (s,), stage2 + rest, loops=[("inner", stage2)] + list(g.loops[1:]))
    k1 = TritonKernel(gi, g1, sched, name=f"kernel{gi}_split", plan=plan, partials=partials)
    p2 = Plan(min(_pow2(onum), max(1, 1024 // _pow2(s))), _pow2(s), True, False)
    p2.num_warps = max(2, min(8, p2.xb * p2.rb // 256))
    k2 = TritonKernel(gi, g2, sched, name=f"kernel{gi}", plan=p2)
    return [(k1, allocs), (k2, [])]


def _interpreting() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def _canonical(src: str, name: str, params: list) -> str:
    """A kernel's text with its name and parameter names made positional and comments
    dropped: kernels equal under this (the same block of a network repeated) are
    compiled once."""
    names = {name: "KERNEL", **{p: f"P{i}" for i, p in enumerate(params)}}
    pat = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
    body = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith("#"))
    return pat.sub(lambda m: names[m.group(1)], body)


def generate(sched: Schedule, buffers: list):
    """The module source, and per segment (launcher name, params)."""
    source, entries, _ = generate_detailed(sched, buffers)
    return source, entries


def generate_detailed(sched: Schedule, buffers: list, interpret: bool | None = None):
    """``generate`` plus, per kernel, (name, params, param dtypes, constexprs, num_warps):
    what compiling a kernel ahead of time needs (``tests/kernels/test_triton_compile.py``)."""
    interpret = _interpreting() if interpret is None else interpret
    dtypes = {b.name: b.dtype for b in buffers}
    parts = [PRELUDE] + ([INTERPRETER_SHIMS] if interpret else [])
    segments, cur, kinfo = [], None, []
    seen = {}        # canonical text -> the kernel that has it (repeated layers share one)
    for gi, g in enumerate(sched.groups):
        if g.extern is not None:
            cur = None
            continue
        kernels = [(TritonKernel(gi, g, sched, interpret=interpret), [])]
        if isinstance(g.alone, ir.Scatter):
            from .scatter import scatter_kernels
            kernels = scatter_kernels(gi, g, sched, interpret)
        elif isinstance(g.alone, ir.Scan):
            from .scan import ScanKernel
            kernels = [(ScanKernel(gi, g.alone), [])]
        elif g.red is not None:
            plan = plan_reduction(g, interpret)
            if plan.split > 1:
                kernels = split_group(gi, g, sched, plan)
        if cur is None:
            cur = (f"kiln_seg{len(segments)}", [])
            segments.append(cur)
        for kern, allocs in kernels:
            src, params, grid, consts, nw, tune = kern.source()
            pd = dict(dtypes)
            pd.update({ws: dt for ws, _, dt in allocs})
            for k2, a2 in kernels:
                pd.update({ws: dt for ws, _, dt in a2})
            key = (_canonical(src, kern.name, params), tuple(pd[q] for q in params),
                   tuple(sorted(consts.items())), nw, tune)
            name = seen.get(key)
            if name is None:          # the first kernel of this text: emitted, compiled
                name = seen[key] = kern.name
                parts.append(src)
                kinfo.append((kern.name, params, [pd[q] for q in params], consts, nw, tune))
            fused = _fused(gi, g, sched, kern, dtypes, interpret, parts, seen) \
                if g.matmul is not None else None
            cur[1].append((name, params, grid, consts, nw, tune, allocs, fused))
    entries = []
    for name, kernels in segments:
        params = []
        local = {ws for *_, allocs, _ in kernels for ws, _, _ in allocs}
        for _, ps, *_, fused in kernels:
            ps = ps if fused is None else fused[1]
            params += [q for q in ps if q not in params and q not in local]
        lines = []
        for kname, ps, grid, consts, nw, tune, allocs, fused in kernels:
            for ws, numel, dt in allocs:
                lines.append(f"    {ws} = torch.empty({numel}, dtype={dt}, "
                             f"device={params[0]}.device)")
            kw = ", ".join(f"{k}={v}" for k, v in consts.items())
            if not tune:
                kw += f", num_warps={nw}"
            call = f"    launch(rt, {kname}, {grid}, ({', '.join(ps)},), dict({kw}))"
            lines += [call] if fused is None else fused[0](call)
        parts.append(f"def {name}(rt, launch, {', '.join(params)}):\n" + "\n".join(lines))
        entries.append((name, params))
    return "\n\n\n".join(parts) + "\n", entries, kinfo


def _fused(gi, g, sched, kern, dtypes, interpret, parts, seen):
    """A group with a library product fused in (``matmul_epilogue``): its fused kernel
    emitted beside the plain one (which reads the product from memory, for the library
    tier); returns (the launcher lines as a function of the plain kernel's launch
    line, the segment parameters this group needs)."""
    from . import matmul_epilogue as me
    lay = me.layout(g.matmul, dtypes)
    own, writes = kern.params()
    own = [q for q in own if q != g.matmul.name]
    bias = lay["bias"]
    if bias is not None and bias.buf not in own:
        own.append(bias.buf)
    fname = f"kernel{gi}_mm"
    src, fparams, consts, options, stores = me.source(fname, g, own, writes, lay, dtypes,
                                                      interpret)
    key = ("matmul", _canonical(src, fname, fparams), tuple(sorted(consts.items())))
    name = seen.get(key)
    if name is None:
        name = seen[key] = fname
        parts.append(src)
    needs = sorted(g.matmul.reads() - set(own)) + own
    return (lambda call: me.launcher_lines(name, call, g, lay, own, consts, options, stores)), \
        needs


def _hook_set(h) -> bool:
    """Triton's launch hooks: None, or (3.5+) a HookChain that may be empty."""
    if h is None:
        return False
    calls = getattr(h, "calls", None)
    return calls is None or len(calls) > 0


class Launcher:
    """Launches one kernel. The first launch goes through Triton (compiling, autotuning)
    unless ``load`` handed the kernel over compiled; later ones call the compiled kernel
    directly while the arguments' 16-byte alignment (what Triton specialises pointers
    on) is unchanged: Triton's own dispatch costs tens of microseconds of Python per
    launch. Where ``cuda_launch`` can launch a kernel it does so (no C launcher to
    build), and it also times the candidates of an autotuned kernel at its first launch.
    ``why``: reasons the direct path was not taken (diagnostics)."""

    why: dict = {}
    #: the generated module's file (what a compile worker reads a fused kernel from)
    path: str | None = None

    def __init__(self, source=None, kinfo=None, mod=None):
        # id(kernel) -> (alignment, compiled, grid, constexprs, DriverKernel | None) | None
        self.fast = {}
        self.tuned = {}         # id(kernel) -> [(compiled, DriverKernel)], one per config
        self.disabled = False
        # for triton_binaries: each kernel's compiled form, once all have one
        self.source, self.kinfo = source, kinfo
        self.names = {id(getattr(mod, k[0])): k[0] for k in kinfo} if kinfo else {}
        self.compiled = {}

    def _keep(self, key, ck):
        """Note ``ck`` as what kernel ``key`` runs (after autotuning: the winner); when
        every kernel of the module has one, keep them for later processes."""
        name = self.names.get(key)
        if name is None or name in self.compiled:
            return
        self.compiled[name] = ck
        if len(self.compiled) == len(self.names):
            from ...toolchain import triton_binaries
            triton_binaries.save(self.source, self.kinfo, self.compiled)
            self.names = {}

    def preload(self, kernel, ck, n_args, consts, drv=None):
        """Launch ``kernel`` through ``ck`` (compiled for aligned pointers; ``drv``: its
        driver launch, if any) from the first call on, without Triton's JIT."""
        names = list(getattr(kernel, "arg_names", None) or kernel.fn.arg_names)
        self.fast[id(kernel)] = ((True,) * n_args, ck, None,
                                 tuple(consts[n] for n in names[n_args:]), drv)
        self._keep(id(kernel), ck)

    def preload_candidates(self, kernel, candidates):
        """An autotuned ``kernel`` whose every config is compiled and driver-launchable
        (``candidates``: (compiled, DriverKernel) in config order): its first aligned
        launch times them and keeps the fastest."""
        self.tuned[id(kernel)] = candidates

    def _note(self, reason):
        Launcher.why[reason] = Launcher.why.get(reason, 0) + 1

    @staticmethod
    def _fastest(candidates, gx, gy, stream, ptrs):
        """The candidate with the least time for a few launches (after two warm ones),
        timed with CUDA events on the launch stream; the kernels only write their
        outputs, so running them again is harmless (as in Triton's autotuner)."""
        spans = []
        for _, drv in candidates:
            for _ in range(2):
                drv.launch(gx, gy, stream, ptrs)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                drv.launch(gx, gy, stream, ptrs)
            end.record()
            spans.append((start, end))
        end.synchronize()
        times = [a.elapsed_time(b) for a, b in spans]
        return candidates[times.index(min(times))]

    def matmul(self, kernel, spec, a, b, args) -> bool:
        """A fused matmul kernel's launch if its tier is up (``matmul_epilogue``)."""
        from . import matmul_epilogue
        return matmul_epilogue.launch(kernel, spec, a, b, args, self.path)

    def __call__(self, rt, kernel, grid, args, kw):
        key = id(kernel)
        ent = self.fast.get(key)
        if ent is not None or key in self.tuned:
            ptrs = [a.data_ptr() for a in args]
            align = tuple(p % 16 == 0 for p in ptrs)
            gx, gy = grid[0], grid[1] if len(grid) > 1 else 1
            dev = args[0].device.index if args else 0
            stream = torch._C._cuda_getCurrentRawStream(dev)
            if ent is None and all(align):
                with timed("kernels.triton_autotune"):
                    ck, drv = self._fastest(self.tuned.pop(key), gx, gy, stream, ptrs)
                ent = self.fast[key] = (align, ck, None, (), drv)
                self._keep(key, ck)
            if ent is not None and align == ent[0]:
                ck, consts, drv = ent[1], ent[3], ent[4]
                try:
                    if drv is not None:
                        drv.launch(gx, gy, stream, ptrs)
                    else:
                        ck.run(gx, gy, 1, stream, ck.function, ck.packed_metadata, None, None,
                               None, *args, *consts)
                    return
                except Exception as e:       # noqa: BLE001
                    self._note(f"direct launch failed: {type(e).__name__}: {e}")
                    self.disabled = True
                    self.fast.clear()
            else:
                self._note("alignment changed")
        if not _interpreting():
            from ...toolchain import triton_setup
            triton_setup.wait_for("driver")   # Triton's JIT from here
        if key in self.fast:
            ck = kernel[grid](*args, **kw)
        else:
            with timed("kernels.triton_first_launch"):
                ck = kernel[grid](*args, **kw)
        if self.disabled or key in self.fast or _interpreting():
            return
        self.fast[key] = None           # one attempt per kernel
        try:
            from triton import knobs
            if _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook):
                self._note("launch hooks installed")
                return
            if ck is None or not hasattr(ck, "packed_metadata"):
                self._note(f"no compiled kernel returned ({type(ck).__name__})")
                return
            names = list(getattr(kernel, "arg_names", None) or kernel.fn.arg_names)
            consts = tuple(kw[n] for n in names[len(args):])
            ck.run   # initialises the handles
            from ...runtime import cuda_launch
            self.fast[key] = (tuple(a.data_ptr() % 16 == 0 for a in args), ck, grid, consts,
                              cuda_launch.prepare(ck, len(args)))
            if all(a.data_ptr() % 16 == 0 for a in args):
                self._keep(key, ck)
        except Exception as e:        # an unexpected Triton version: keep its own dispatch
            self._note(f"setup failed: {type(e).__name__}: {e}")
            self.disabled = True


def precompile(mod, kinfo, path: str) -> tuple:
    """Compile every kernel of ``mod`` (the module at ``path``) now, for the device's
    target (``triton_compile``; Triton's ``warmup`` where kiln cannot name the
    signature), each autotuning candidate separately, shared between the compile
    workers and this process (``compile_pool``), and load each for launching
    (``ready``). Returns (kernel name -> (CompiledKernel, DriverKernel | None) for
    kernels that are not autotuned, kernel name -> [one such pair per config] for those
    that are); failures are left to the first launch."""
    if _interpreting() or not kinfo or not torch.cuda.is_available():
        return {}, {}
    from ...toolchain import triton_pool as compile_pool
    from ...toolchain import triton_binaries
    from ...toolchain import triton_build as triton_compile
    from ...toolchain import triton_setup
    from ...runtime.cuda_launch import ready
    dev = torch.cuda.current_device()
    done, tuned, jobs, specs = {}, {}, [], []
    for name, params, dtypes, consts, nw, tune in kinfo:
        kernel = getattr(mod, name)
        if tune:
            tuned[name] = [None] * len(kernel.configs)
            # one candidate of an autotuned kernel: the options its autotuner will pass
            cands = [(kernel.fn, cfg.all_kwargs(), i) for i, cfg in enumerate(kernel.configs)]
        else:
            cands = [(kernel, {"num_warps": nw}, None)]
        for fn, opts, i in cands:
            jobs.append((name, len(params), dtypes, consts, fn, opts, i))
            sig = triton_compile.signature(fn, dtypes, consts)
            specs.append(None if sig is None else {
                "path": path, "name": name, "signature": sig, "consts": dict(consts),
                "options": opts})

    def keep(k, compiled):
        name, n_args, *_, i = jobs[k]
        compiled = ready(compiled, n_args)
        if i is None:
            done[name] = compiled
        else:
            tuned[name][i] = compiled

    def local(k):
        name, n_args, dtypes, consts, fn, opts, i = jobs[k]
        try:
            triton_setup.wait_for("warmup")     # LLVM's one-time set-up, done meanwhile
            compiled = triton_compile.compile_kernel(fn, dtypes, consts, opts)
            if compiled is None:          # through the JIT, which needs Triton's driver
                triton_setup.wait_for("driver")
                compiled = fn.warmup(*dtypes, grid=(1,), **dict(consts), **opts)
            keep(k, compiled)
        except Exception:         # noqa: BLE001  (compiled at its first launch instead)
            pass
    with timed("kernels.triton_compile"):    # (Triton's own set-up: triton_setup)
        torch.cuda.set_device(dev)
        replies = compile_pool.run(specs, local)
        for k, reply in enumerate(replies):
            if reply is not None:
                try:
                    keep(k, triton_binaries.compiled_kernel(reply, jobs[k][4].arg_names))
                except Exception:     # noqa: BLE001  (compiled at its first launch instead)
                    pass
    return done, {n: c for n, c in tuned.items() if all(x is not None for x in c)}


def load(source: str, entries, kinfo=None):
    """Import the module from the cache directory; one step callable per segment."""
    with timed("kernels.triton_setup"):      # once per process; mostly done meanwhile
        import triton  # noqa: F401
        from ...toolchain import triton_setup
        if _interpreting() or not torch.cuda.is_available():
            triton_setup.install()
        else:
            triton_setup.wait()
    with timed("kernels.triton_module"):
        mod, path = cache.load_module("triton", source)
    launch = Launcher()
    if kinfo and not _interpreting() and torch.cuda.is_available():
        from ...toolchain import triton_binaries
        with timed("kernels.triton_load"):
            ready_ = triton_binaries.load(source, kinfo)
        tuned = {}
        if ready_ is None:
            launch = Launcher(source, kinfo, mod)
            ready_, tuned = precompile(mod, kinfo, path)
        for name, params, _, consts, _, _ in kinfo:
            if name in ready_:
                ck, drv = ready_[name]
                launch.preload(getattr(mod, name), ck, len(params), consts, drv)
            elif name in tuned and all(drv is not None for _, drv in tuned[name]):
                launch.preload_candidates(getattr(mod, name), tuned[name])
    launch.path = path
    steps = []
    for name, params in entries:
        fn = getattr(mod, name)

        def step(rt, tensors, fn=fn, params=params):
            fn(rt, launch, *[tensors[p] for p in params])
        step.params = params
        steps.append(step)
    return steps
