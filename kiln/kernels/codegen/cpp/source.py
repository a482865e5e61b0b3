"""C++/OpenMP code generation: one source file per graph, one function per kernel group.

Each group becomes a loop nest: the outer dims ``#pragma omp parallel for collapse(k)``,
then, per outer index, its loops one after another, each innermost loop ``#pragma omp
simd`` (with ``reduction(...)`` clauses for the accumulators) when it has no guarded
loads. ``float`` ``exp`` is a vectorisable polynomial (``kiln_exp``) since glibc's is
scalar without -ffast-math (``kiln_tanh`` likewise). fp32 outputs of STREAM_BYTES or more
are written with streaming stores (from a small block buffer) and madvised for huge pages
before the first touch: on a fresh 64 MiB output the 4 KiB page faults otherwise cost as
much as the softmax itself. Consecutive groups between library calls share one exported
entry point ``kiln_segN`` so one ctypes call runs them all.
"""
from __future__ import annotations

import math
import os

import torch

from .... import config
from ... import ir
from ...ir import Affine, Const, Index, Load, Op, numel_of
from ...ops import OPS
from ...reductions import KINDS
from ...scheduler import Group, Schedule
from .. import dim_merge
from ..size_args import constant, each_own, is_lifted, size
from . import shared

CTYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
          torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
          torch.uint8: "uint8_t", torch.bool: "bool"}
PARALLEL_WORK = 32768


#: The helpers every generated C++ file starts with (NaN-exact math, sums, the fence):
#: C++ text, kept as a C++ file beside this one.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "prelude.h")) as _f:
    PRELUDE = _f.read()


#: C++ spellings that differ from ops.py's: the prelude's float tanh (Cephes, inlined)
#: beats libmvec's tanhf; the double overload calls libm's tanh. The other
#: transcendentals stay libm spellings (std::sin…): the prelude declares them ``simd``
#: when the build has libmvec (toolchain/cxx_vecmath.py), so simd loops call its vector
#: variants, and scalar libm otherwise.
_CPP_OVERRIDES = {"tanh": "kiln_tanh({0})"}


def ctype(dtype: torch.dtype) -> str:
    return CTYPES[dtype]


def cconst(value, dtype) -> str:
    t = ctype(dtype)
    lifted = constant(value, dtype)
    if lifted is not None:
        return f"{t}({lifted})"
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return f"{t}({v!r})"
    return f"{t}({int(value)}LL)" if dtype == torch.int64 else f"{t}({int(value)})"


def cindex(a: Affine) -> str:
    """An affine index as C++; its coefficients and offset are sizes (``size_args``)."""
    parts = [(v if k == 1 else f"{size(k)}*{v}") for v, k in a.terms]
    if a.const or not parts:
        parts.append(size(a.const))
    return " + ".join(parts)


def _sizes(dims) -> str:
    """A list of sizes as a comment shows it."""
    return "[" + ", ".join(size(d) for d in dims) + "]"


class Body:
    """One scope's lines with common-subexpression reuse."""

    def __init__(self, values: dict, indent: str, counter: list, hoist: list | None = None):
        self.lines: list[str] = []
        self.memo: dict = {}
        self.values = values        # buffer name -> C variable holding this element
        self.indent = indent
        self.counter = counter      # shared by a kernel's scopes: unique, deterministic names
        self.hoist = hoist          # lines run once before the loop (None: not in a loop)
        self.invariant = set(values.values())

    def tmp(self, t, rhs) -> str:
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(f"{self.indent}{t} {name} = {rhs};")
        return name

    def element(self, e: Load) -> str:
        """The C element ``e`` addresses: ``buf[affine index + value * stride...]``."""
        ind = "".join(f" + (int64_t)({self.render(v)}) * {size(st)}" for v, st in e.gather)
        return f"{e.buf}[{cindex(e.index)}{ind}]"

    def render(self, e: ir.Expr) -> str:
        if e in self.memo:
            return self.memo[e]
        if isinstance(e, Const):
            s = cconst(e.value, e.dtype)
        elif isinstance(e, Index):
            s = f"((int64_t)({cindex(e.index)}))"
        elif isinstance(e, Load):
            if e.buf in self.values and e.mask is None and not e.gather:
                s = self.values[e.buf]
            else:
                ld = self.element(e)
                if e.mask is not None:
                    ld = f"({self.render(e.mask)} ? {ld} : {ctype(e.dtype)}(0))"
                s = self.tmp(ctype(e.dtype), ld)
        else:
            args = [self.render(a) for a in e.args]
            if (e.name == "truediv" and e.dtype.is_floating_point and self.hoist is not None
                    and args[1] in self.invariant):
                # a loop-invariant divisor: one division per row, a multiply per element
                inv = f"inv_{args[1]}"
                line = f"{ctype(e.dtype)} {inv} = {ctype(e.dtype)}(1) / {args[1]};"
                if line not in self.hoist:
                    self.hoist.append(line)
                s = self.tmp(ctype(e.dtype), f"({args[0]} * {inv})")
            else:
                tpl = _CPP_OVERRIDES.get(e.name, OPS[e.name][0])
                s = self.tmp(ctype(e.dtype), tpl.format(*args, t=ctype(e.dtype)))
        self.memo[e] = s
        return s


def identity(kind: str, t: str, dt: torch.dtype) -> str:
    """The start value of a reduction kind (``reductions.KINDS``) in C++ type ``t``."""
    i = KINDS[kind].identity
    if i is False:
        return "false"
    if i == "lowest":
        return (f"-std::numeric_limits<{t}>::infinity()" if dt.is_floating_point
                else f"std::numeric_limits<{t}>::lowest()")
    if i == "highest":
        return (f"std::numeric_limits<{t}>::infinity()" if dt.is_floating_point
                else f"std::numeric_limits<{t}>::max()")
    return cconst(i, dt)


def _tracks_nan(n) -> bool:
    return KINDS[n.red_type].tracks_nan and n.dtype.is_floating_point


def _compensated(n) -> bool:
    return KINDS[n.red_type].compensated and n.dtype == torch.float32


def _acc_ctype(n) -> str:
    """The C type a short reduction (one not summed in blocks) accumulates in: fp32 sums
    in double, rounded to float once at the end. A float accumulator loses digits along
    its chain, and in a BatchNorm backward (sums of the gradient and of its product with
    the centred input, which cancel to a small weight gradient) those digits are what
    is left: kiln's fp32 gradients were 2-3x further from float64 than eager's, whose
    sums cascade. Long sums keep float block partials (added compensated): a double
    partial doubled the time of a BatchNorm training step's long reductions."""
    return "double" if _compensated(n) else ctype(n.dtype)


SCRATCH_BYTES = 64 * 1024
#: Outputs of at least this many bytes (far beyond the last-level cache; and glibc always
#: gives them their own mmap) are written with streaming stores and get huge pages.
STREAM_BYTES = 32 << 20
STREAM_BLOCK = 256
COLUMN_BLOCK = 256
#: A column reduction (sum over rows) with fewer blocks of outputs than this (the CPUs:
#: some would idle), each reducing at least LONG_REDUCTION rows, splits the rows across
#: threads (OpenMP array-section reductions): a bias gradient over a large batch. (Row
#: reductions already run one output per thread, full reductions split their loop.)
FEW_OUTER = os.cpu_count() or 1
LONG_REDUCTION = 16384


#: fp32 sums over more than this many elements (rows, for column reductions) are
#: accumulated in blocks: each block's partial sum (its loop nest as before, vectorised)
#: is added into the total with a compensated (Neumaier) add, once per block. One fp32
#: accumulator over a long reduction (a BatchNorm mean over N*H*W) loses digits as the
#: total grows; eager PyTorch sums in cascades for the same reason.
SUM_BLOCK = 256
#: The same for column reductions, in rows: each column's partial is one scalar chain.
COLUMN_SUM_ROWS = 64


def _sum_blocks(red, block=SUM_BLOCK):
    """Where a long fp32 sum over the loops ``red`` restarts its partial sum: (level,
    chunk). The partial covers loops level..end (the largest such suffix of at most
    ``block`` elements); chunk: the innermost loop alone is longer and is strip-mined
    into chunks of ``block``, one partial per chunk (level is then len(red) - 1). None:
    the whole reduction is one block, summed as before."""
    red = [int(s_) for s_ in red]
    if not red or numel_of(red) <= block:
        return None
    for j in range(1, len(red)):
        if numel_of(red[j:]) <= block:
            return j, None
    return len(red) - 1, block


def _column_reduction(g) -> bool:
    """A group of plain reductions that reads memory contiguously along the last kept dim
    and not along the innermost reduced one: worth the column loop order."""
    if not g.red or not g.outer or len(g.loops) != 1 or int(g.outer[-1]) < 8:
        return False
    if not all(isinstance(n, ir.Reduction) and not KINDS[n.red_type].is_arg for n in g.nodes):
        return False
    k = len(g.outer)
    last, inner = f"x{k - 1}", f"x{k + len(g.red) - 1}"
    loads = [e for n in g.nodes for e in ir.walk(n.body) if isinstance(e, Load)]
    if not loads or any(e.mask is not None for e in loads):
        return False
    return (any(e.index.coef(last) == 1 for e in loads)
            and not any(e.index.coef(inner) == 1 for e in loads))
_EXPENSIVE = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "sigmoid", "erf",
              "pow", "sin", "cos", "tan", "sinh", "cosh", "atan", "asin", "acos", "atan2"}


def _expensive(e) -> bool:
    return any(isinstance(x, Op) and x.name in _EXPENSIVE for x in ir.walk(e))


def _has_masks(nodes) -> bool:
    return any(isinstance(e, Load) and e.mask is not None for n in nodes for e in ir.walk(n.body))


def _parallel(work: int) -> tuple[bool, str]:
    """(open a parallel region over ``work`` elements?, its ``if`` clause): a lifted work
    size decides at run time (OpenMP's ``if``), so sizes either side of PARALLEL_WORK
    share one text (one library for a stream of sizes)."""
    w = size(work)
    if is_lifted(w):
        return True, f" if({w} >= {PARALLEL_WORK})"
    return work >= PARALLEL_WORK, ""


def _open_loops(out: list, dims: list, parallel: bool, ind: str = "  ") -> str:
    """``for`` headers over ``dims`` [(variable number, size)], OpenMP-parallel over all
    of them when ``parallel``; returns the body's indent."""
    if parallel and dims:
        out.append(f"{ind}#pragma omp parallel for collapse({len(dims)})")
    for i, n in dims:
        out.append(f"{ind}for (int64_t x{i} = 0; x{i} < {size(n)}; ++x{i}) {{")
        ind += "  "
    return ind


def _close_loops(out: list, count: int, ind: str) -> None:
    """Closing braces for the innermost ``count`` open loops, whose body is at ``ind``."""
    for k in range(1, count + 1):
        out.append(ind[:-2 * k] + "}")


class CppKernel:
    """Source of one group's function."""

    def __init__(self, gi: int, g: Group, sched: Schedule):
        self.gi, self.g, self.s = gi, g, sched
        self.counter = [0]

    def params(self) -> list:
        names = self.g.names
        reads, writes = set(), set()
        for n in self.g.nodes:
            reads |= {r for r in n.reads() if r not in names}
            if n.name not in self.s.locals:
                writes.add(n.name)
        return sorted(reads) + sorted(writes)

    def source(self, dtypes: dict) -> tuple[str, list]:
        g = self.g
        if isinstance(g.alone, ir.Scatter):
            return self._scatter_source(dtypes)
        if isinstance(g.alone, ir.Scan):
            return self._scan_source(dtypes)
        if g.red is None:           # pure pointwise: vectorise the last (merged) dim
            shape, nodes = dim_merge.merged_pointwise(
                g.nodes, tuple(g.outer), {n.name for n in g.nodes if n.name not in self.s.locals})
            g = Group(shape[:-1], shape[-1:], nodes, loops=[("inner", list(nodes))])
        elif g.alone is None and g.matmul is None:
            g = dim_merge.merged_group(g, {n.name for n in g.nodes if n.name not in self.s.locals})
        params = self.params()
        writes = {n.name for n in g.nodes if n.name not in self.s.locals}
        sig = ", ".join(
            f"{ctype(dtypes[p])}* __restrict__ {p}" if p in writes
            else f"const {ctype(dtypes[p])}* __restrict__ {p}" for p in params)
        origin = ", ".join(n.origin for n in g.nodes if getattr(n, "origin", ""))
        out = [f"// kernel {self.gi}: outer {_sizes(g.outer)}, inner {_sizes(g.red)}; from {origin}",
               f"static void kernel{self.gi}({sig}) {{"]
        if _column_reduction(g):
            return "\n".join(out + self._column_body(g, writes) + ["}"]), params
        k = len(g.outer)
        work = numel_of(tuple(g.outer) + tuple(g.red))
        ind = "  "
        outer_par, clause = _parallel(work)
        if k > 0 and outer_par:
            out.append(f"{ind}#pragma omp parallel for collapse({k}){clause}")
        for i, s in enumerate(g.outer):
            out.append(f"{ind}for (int64_t x{i} = 0; x{i} < {size(s)}; ++x{i}) {{")
            ind += "  "
        scope_values: dict[str, str] = {}
        plan = self._plan_scratch(g) if k > 0 else {}
        rnum = numel_of(g.red or ())
        if plan and is_lifted(size(rnum)):
            rnum = 1 << (rnum - 1).bit_length()    # an array length: one per power of two
        for e, (_, name) in plan.items():
            out.append(f"{ind}alignas(64) {ctype(e.dtype)} {name}[{rnum}];")
        for li, (kind, nodes) in enumerate(g.loops):
            if kind == "outer":
                body = Body(dict(scope_values), ind, self.counter)
                for n in nodes:
                    v = body.render(n.body)
                    out.extend(body.lines)
                    body.lines = []
                    scope_values[n.name] = v
                    if n.name in writes:
                        out.append(f"{ind}{n.name}[{cindex(n.store_index(g.outer_vars()))}] = {v};")
                continue
            out.extend(self._inner_loop(g, nodes, scope_values, writes, ind,
                                        parallel=(k == 0 and work >= PARALLEL_WORK),
                                        loop_index=li, plan=plan))
        for _ in g.outer:
            ind = ind[:-2]
            out.append(f"{ind}}}")
        out.append("}")
        return "\n".join(out), params

    def _alone_head(self, dtypes: dict, what: str) -> tuple[list, list]:
        """Comment and signature of a kernel that holds one buffer (``Group.alone``)."""
        b = self.g.alone
        params = self.params()
        sig = ", ".join(
            f"{ctype(dtypes[p])}* __restrict__ {p}" if p == b.name
            else f"const {ctype(dtypes[p])}* __restrict__ {p}" for p in params)
        return [f"// kernel {self.gi}: {what}; from {b.origin}",
                f"static void kernel{self.gi}({sig}) {{"], params

    def _scatter_source(self, dtypes: dict) -> tuple[str, list]:
        """An ``ir.Scatter``: its initial value in a (parallel) loop over the buffer,
        then the writes by computed position in index order — in parallel over the
        leading ``parallel_dims`` — so repeated positions accumulate in eager's order,
        and no two threads write one element."""
        b = self.g.alone
        out, params = self._alone_head(dtypes, f"scatter over {_sizes(b.iter_sizes)}")
        dims = list(enumerate(b.sizes))
        ind = _open_loops(out, dims, numel_of(b.sizes) >= PARALLEL_WORK)
        body = Body({}, ind, self.counter)
        v = body.render(b.init)
        out.extend(body.lines)
        out.append(f"{ind}{b.name}[{cindex(b.store_index(ir.loop_vars(tuple(b.sizes))))}] = {v};")
        _close_loops(out, len(dims), ind)
        # the parallel dims go outside only when they lead the index order already: a
        # trailing one (an embedding's feature dim) stays inside, where it is contiguous
        k = 0
        while k in b.parallel_dims:
            k += 1
        par = list(enumerate(b.iter_sizes))[:k]
        ser = list(enumerate(b.iter_sizes))[k:]
        ind = _open_loops(out, par, numel_of(b.iter_sizes) >= PARALLEL_WORK)
        ind = _open_loops(out, ser, False, ind)
        body = Body({}, ind, self.counter)
        v = body.render(b.value)
        dest = body.element(b.dest)
        mask = body.render(b.dest.mask) if b.dest.mask is not None else None
        out.extend(body.lines)
        stmt = f"{dest} {'+=' if b.accumulate else '='} {v};"
        out.append(f"{ind}if ({mask}) {stmt}" if mask else f"{ind}{stmt}")
        _close_loops(out, len(b.iter_sizes), ind)
        out.append("}")
        return "\n".join(out), params

    def _scan_source(self, dtypes: dict) -> tuple[str, list]:
        """An ``ir.Scan``: the other dims in (parallel) loops, the scanned dim in a serial
        inner loop that carries the running sum and stores it at every position."""
        b = self.g.alone
        out, params = self._alone_head(dtypes, f"{b.scan_type} scan along dim {b.dim}")
        d = b.dim
        others = [(i, n) for i, n in enumerate(b.sizes) if i != d]
        ind = _open_loops(out, others, numel_of(b.sizes) >= PARALLEL_WORK)
        acc = ctype(b.acc_dtype)
        out.append(f"{ind}{acc} acc = {acc}(0);")
        ind2 = _open_loops(out, [(d, b.sizes[d])], False, ind)
        body = Body({}, ind2, self.counter)
        v = body.render(b.body)
        out.extend(body.lines)
        out.append(f"{ind2}acc += ({acc})({v});")
        out.append(f"{ind2}{b.name}[{cindex(b.store_index(ir.loop_vars(tuple(b.sizes))))}] = "
                   f"({ctype(b.dtype)})(acc);")
        _close_loops(out, len(others) + 1, ind2)
        out.append("}")
        return "\n".join(out), params

    def _column_body(self, g, writes) -> list:
        """Reductions whose input is contiguous along the last *kept* dim (sum over rows,
        bias gradients): a block of COLUMN_BLOCK outputs is accumulated side by side, so
        the innermost loop walks memory with stride 1 and vectorises."""
        nodes = g.nodes
        k, red = len(g.outer), tuple(g.red)
        last = int(g.outer[-1])
        # an array length: a lifted width gets one per power of two
        B = min(COLUMN_BLOCK, 1 << (last - 1).bit_length() if is_lifted(size(last)) else last)
        all_vars = g.all_vars()
        out, ind = [], "  "
        work = numel_of(tuple(g.outer) + red)
        blocks = numel_of(g.outer[:-1]) * -(-last // B)
        split = blocks < FEW_OUTER and numel_of(red) >= LONG_REDUCTION and work >= PARALLEL_WORK
        if work >= PARALLEL_WORK and not split:
            out.append(f"{ind}#pragma omp parallel for collapse({k})")
        for i, s_ in enumerate(g.outer[:-1]):
            out.append(f"{ind}for (int64_t x{i} = 0; x{i} < {size(s_)}; ++x{i}) {{")
            ind += "  "
        xv = f"x{k - 1}"
        out.append(f"{ind}for (int64_t xb = 0; xb < {size(last)}; xb += {B}) {{")
        ind += "  "
        out.append(f"{ind}const int64_t xn = std::min<int64_t>({B}, {size(last)} - xb);")
        # long fp32 sums: each column's partial over a block of rows (acc_X_p), added
        # compensated into acc_X / acc_X_c once per block
        cut = _sum_blocks(red, COLUMN_SUM_ROWS)
        casc = [n for n in nodes if _compensated(n)] if cut else []
        level, chunk = cut if casc else (None, None)
        casc_names = {n.name for n in casc}
        for n in nodes:
            t = _acc_ctype(n) if n.name not in casc_names else ctype(n.dtype)
            init = identity(n.red_type, t, n.dtype)
            out.append(f"{ind}{t} acc_{n.name}[{B}];")
            if _tracks_nan(n):
                out.append(f"{ind}int nan_{n.name}[{B}];")
                out.append(f"{ind}for (int64_t i = 0; i < {B}; ++i) nan_{n.name}[i] = 0;")
            out.append(f"{ind}for (int64_t i = 0; i < {B}; ++i) acc_{n.name}[i] = {init};")
        for n in casc:
            out.append(f"{ind}float acc_{n.name}_c[{B}];")
            out.append(f"{ind}for (int64_t i = 0; i < {B}; ++i) acc_{n.name}_c[i] = 0.0f;")
        li = ind
        if split:
            # few blocks of outputs: threads share the reduced rows, each with private
            # accumulator arrays combined at the end (OpenMP array-section reductions)
            cl = []
            for n in nodes:
                cl.append(f"reduction({KINDS[n.red_type].cpp_clause}:acc_{n.name}[:{B}])")
                if n.name in casc_names:
                    cl.append(f"reduction(+:acc_{n.name}_c[:{B}])")
                if _tracks_nan(n):
                    cl.append(f"reduction(|:nan_{n.name}[:{B}])")
            coll = level + bool(chunk) if casc else len(red)
            out.append(f"{li}#pragma omp parallel for collapse({coll}) " + " ".join(cl))
        flush_at = None
        for j, s_ in enumerate(red):
            if j == level and chunk:
                out.append(f"{li}for (int64_t xc = 0; xc < {size(s_)}; xc += {chunk}) {{")
                li += "  "
            if j == level:
                flush_at = li
                for n in casc:
                    out.append(f"{li}float acc_{n.name}_p[{B}];")
                    out.append(f"{li}for (int64_t i = 0; i < {B}; ++i) acc_{n.name}_p[i] = 0.0f;")
            if j == level and chunk:
                out.append(f"{li}for (int64_t x{k + j} = xc; x{k + j} < "
                           f"std::min<int64_t>(xc + {chunk}, {size(s_)}); ++x{k + j}) {{")
            else:
                out.append(f"{li}for (int64_t x{k + j} = 0; x{k + j} < {size(s_)}; ++x{k + j}) {{")
            li += "  "
        out.append(f"{li}#pragma omp simd")
        out.append(f"{li}for (int64_t xi = 0; xi < xn; ++xi) {{")
        bi = li + "  "
        out.append(f"{bi}const int64_t {xv} = xb + xi;")
        body = Body({}, bi, self.counter)
        for n in nodes:
            v = body.render(n.body)
            a = f"acc_{n.name}{'_p' if n.name in casc_names else ''}[xi]"
            body.lines.append(bi + KINDS[n.red_type].cpp_update.format(a=a, v=v))
            if _tracks_nan(n):
                body.lines.append(f"{bi}nan_{n.name}[xi] |= ({v} != {v});")
        out += body.lines
        out.append(f"{li}}}")
        for _ in range(len(red) + (1 if chunk else 0)):
            li = li[:-2]
            out.append(f"{li}}}")
            if li == flush_at and casc:
                out.append(f"{li}#pragma omp simd")
                out.append(f"{li}for (int64_t xi = 0; xi < xn; ++xi) {{")
                out += [f"{li}  kiln_sum_add(acc_{n.name}[xi], acc_{n.name}_c[xi], "
                        f"acc_{n.name}_p[xi]);" for n in casc]
                out.append(f"{li}}}")
        out.append(f"{ind}for (int64_t xi = 0; xi < xn; ++xi) {{")
        out.append(f"{ind}  const int64_t {xv} = xb + xi;")
        for n in nodes:
            a = f"acc_{n.name}[xi]"
            if n.name in casc_names:
                out.append(f"{ind}  {a} = kiln_sum_total({a}, acc_{n.name}_c[xi]);")
            if _tracks_nan(n):
                out.append(f"{ind}  if (nan_{n.name}[xi]) {a} = "
                           f"std::numeric_limits<{ctype(n.dtype)}>::quiet_NaN();")
            if n.name in writes:
                out.append(f"{ind}  {n.name}[{cindex(n.store_index(g.outer_vars()))}] = {a};")
        out.append(f"{ind}}}")
        ind = ind[:-2]
        out.append(f"{ind}}}")
        for _ in g.outer[:-1]:
            ind = ind[:-2]
            out.append(f"{ind}}}")
        return out

    def _plan_scratch(self, g) -> dict:
        """Expensive values a later loop recomputes from an earlier one go to a small
        per-row scratch array (cache-resident) instead: e.g. softmax's exp(x - max),
        computed for the sum and needed again for the output."""
        inner = [(i, ns) for i, (kind, ns) in enumerate(g.loops) if kind == "inner"]
        rnum = numel_of(g.red or ())
        if len(inner) < 2 or not g.red or rnum * 8 > SCRATCH_BYTES:
            return {}
        seen: dict = {}           # expr -> first loop index
        plan: dict = {}           # expr -> (owner loop, scratch name)
        for li, ns in inner:
            exprs = [e for n in ns for e in ir.walk(n.body)]
            if _has_masks(ns):
                continue
            mine = []
            for e in exprs:
                if isinstance(e, Op) and e in seen and seen[e] != li and _expensive(e):
                    mine.append(e)
            # keep maximal ones only
            subs = {c for e in mine for c in ir.walk(e) if c is not e}
            for e in mine:
                if e not in subs and e not in plan:
                    plan[e] = (seen[e], f"scratch{len(plan)}")
            for e in exprs:
                seen.setdefault(e, li)
        return plan

    def _streamed(self, g, nodes, writes) -> dict:
        """fp32 outputs of STREAM_BYTES or more that this (single-dim, reduction-free)
        loop stores contiguously: name -> block buffer name."""
        k = len(g.outer)
        xv = f"x{k}"
        res = {}
        for n in nodes:
            if (n.name not in writes or isinstance(n, ir.Reduction) or n.dtype != torch.float32
                    or numel_of(n.sizes) * 4 < STREAM_BYTES):
                continue
            if n.store_index(g.all_vars()).coef(xv) == 1:
                res[n.name] = f"st_{n.name}"
        return res

    def _inner_loop(self, g, nodes, scope_values, writes, ind, parallel, loop_index=None,
                    plan=None):
        out = []
        plan = plan or {}
        k = len(g.outer)
        red = tuple(g.red)
        all_vars = g.all_vars()
        reds = [n for n in nodes if isinstance(n, ir.Reduction)]
        args_red = any(KINDS[n.red_type].is_arg for n in reds)
        clauses = []
        # long fp32 sums: a partial per block (acc_X_p), added compensated into acc_X/acc_X_c
        blocks = _sum_blocks(red) if red else None
        casc = [n for n in reds if _compensated(n)] if blocks else []
        casc_names = {n.name for n in casc}
        wide = {n.name for n in reds if _compensated(n) and n.name not in casc_names}
        inner_clauses = []
        for n in reds:
            t = ctype(n.dtype)
            a = f"acc_{n.name}"
            if KINDS[n.red_type].is_arg:
                vt = ctype(n.body.dtype)
                init = identity(n.red_type, vt, n.body.dtype)
                out.append(f"{ind}{vt} {a}_v = {init}; int64_t {a} = 0;")
                continue
            if n.name in wide:
                t = _acc_ctype(n)
            out.append(f"{ind}{t} {a} = {identity(n.red_type, t, n.dtype)};")
            if n.name in casc_names:
                out.append(f"{ind}{t} {a}_c = {identity(n.red_type, t, n.dtype)};")
                clauses.append(f"reduction(+:{a}) reduction(+:{a}_c)")
                inner_clauses.append(f"reduction(+:{a}_p)")
                continue
            clauses.append(f"reduction({KINDS[n.red_type].cpp_clause}:{a})")
            inner_clauses.append(clauses[-1])
            if _tracks_nan(n):
                out.append(f"{ind}int nan_{n.name} = 0;")
                clauses.append(f"reduction(|:nan_{n.name})")
        simd = not args_red and not _has_masks(nodes)
        header_at = len(out)
        li = ind
        m = len(red)
        stream = {} if (reds or parallel or m != 1 or not simd) else self._streamed(g, nodes, writes)
        if stream:
            # a block of results goes to a small aligned buffer, then out with stores that
            # skip the cache: the output row is never read back by this kernel
            rn = size(red[0])
            out.append(f"{li}for (int64_t xb = 0; xb < {rn}; xb += {STREAM_BLOCK}) {{")
            li += "  "
            out.append(f"{li}const int64_t xe = std::min<int64_t>(xb + {STREAM_BLOCK}, {rn});")
            for name, st in stream.items():
                out.append(f"{li}alignas(64) float {st}[{STREAM_BLOCK}];")
        if m == 0:
            out.append(f"{li}{{")
        par_done = False
        level, chunk = blocks if casc else (None, None)
        flush_at = None     # the indentation whose loop's end flushes the partials
        for j, s in enumerate(red):
            innermost = j == m - 1
            if casc:
                if parallel and j == 0 and not args_red:
                    # threads share the blocks (and the chunk loop), each with its own totals
                    out.append(f"{li}#pragma omp parallel for collapse({level + bool(chunk)}) "
                               + " ".join(clauses))
                    par_done = True
                if j == level and chunk:
                    out.append(f"{li}for (int64_t xc = 0; xc < {size(s)}; xc += {chunk}) {{")
                    li += "  "
                if j == level:
                    flush_at = li
                    out += [f"{li}float acc_{n.name}_p = 0.0f;" for n in casc]
                if innermost and simd:
                    out.append(f"{li}#pragma omp simd " + " ".join(inner_clauses))
                if j == level and chunk:
                    out.append(f"{li}for (int64_t x{k + j} = xc; x{k + j} < "
                               f"std::min<int64_t>(xc + {chunk}, {size(s)}); ++x{k + j}) {{")
                else:
                    out.append(f"{li}for (int64_t x{k + j} = 0; x{k + j} < {size(s)}; "
                               f"++x{k + j}) {{")
                li += "  "
                continue
            if parallel and j == 0 and not args_red:
                coll = f" collapse({m})" if m > 1 else ""
                out.append(f"{li}#pragma omp parallel for{' simd' if simd else ''}{coll} "
                           + " ".join(clauses))
                par_done = True
            elif innermost and simd and not par_done:
                out.append(f"{li}#pragma omp simd " + " ".join(clauses))
            if stream:
                out.append(f"{li}for (int64_t x{k} = xb; x{k} < xe; ++x{k}) {{")
            else:
                out.append(f"{li}for (int64_t x{k + j} = 0; x{k + j} < {size(s)}; ++x{k + j}) {{")
            li += "  "
        if m == 0:
            li += "  "
        hoist: list = []
        body = Body(dict(scope_values), li, self.counter, hoist)
        ridx = cindex(ir.linear_index(all_vars[k:], ir.contiguous_strides(red)))
        for e, (owner, name) in plan.items():
            if owner != loop_index and any(e in ir.walk(n.body) for n in nodes):
                body.memo[e] = f"{name}[{ridx}]"
        for n in nodes:
            v = body.render(n.body)
            if isinstance(n, ir.Reduction):
                a = f"acc_{n.name}" + ("_p" if n.name in casc_names else "")
                kind = KINDS[n.red_type]
                if not kind.is_arg:
                    body.lines.append(li + kind.cpp_update.format(a=a, v=v))
                    if _tracks_nan(n):
                        body.lines.append(f"{li}nan_{n.name} |= ({v} != {v});")
                else:
                    cmp = kind.arg_cmp
                    ridx = cindex(ir.linear_index(all_vars[k:], ir.contiguous_strides(red)))
                    nan = (f" || ({v} != {v} && {a}_v == {a}_v)" if n.body.dtype.is_floating_point
                           else "")
                    body.lines.append(f"{li}if ({v} {cmp} {a}_v{nan}) {{ {a}_v = {v}; {a} = {ridx}; }}")
            else:
                body.values[n.name] = v
                if n.name in stream:
                    body.lines.append(f"{li}{stream[n.name]}[x{k} - xb] = {v};")
                elif n.name in writes:
                    body.lines.append(f"{li}{n.name}[{cindex(n.store_index(all_vars))}] = {v};")
        for e, (owner, name) in plan.items():
            if owner == loop_index:
                body.lines.append(f"{li}{name}[{ridx}] = {body.render(e)};")
        out.extend(body.lines)
        out[header_at:header_at] = [ind + h for h in hoist]
        for _ in range(max(m, 1) + (1 if chunk else 0)):
            li = li[:-2]
            out.append(f"{li}}}")
            if li == flush_at:
                out += [f"{li}kiln_sum_add(acc_{n.name}, acc_{n.name}_c, acc_{n.name}_p);"
                        for n in casc]
        out += [f"{ind}acc_{n.name} = kiln_sum_total(acc_{n.name}, acc_{n.name}_c);"
                for n in casc]
        if stream:
            for n in nodes:
                if n.name in stream:
                    a = n.store_index(all_vars)
                    base = Affine(tuple(sorted(("xb" if v == f"x{k}" else v, c) for v, c in a.terms)),
                                  a.const)
                    out.append(f"{li}kiln_stream(&{n.name}[{cindex(base)}], {stream[n.name]}, xe - xb);")
            li = li[:-2]
            out.append(f"{li}}}")
            out.append(f"{li}kiln_fence();")
        for n in reds:
            a = f"acc_{n.name}"
            if _tracks_nan(n):
                out.append(f"{ind}if (nan_{n.name}) {a} = std::numeric_limits<{ctype(n.dtype)}>::quiet_NaN();")
            if n.name in wide:
                out.append(f"{ind}float {a}_f = float({a});")
                a = f"{a}_f"
            scope_values[n.name] = a
            if n.name in writes:
                out.append(f"{ind}{n.name}[{cindex(n.store_index(g.outer_vars()))}] = {a};")
        return out


def generate(sched: Schedule, buffers: list) -> tuple[str, list, list]:
    """The whole translation unit, per segment (name, [param buffer names]), and the
    values of its size arguments (``size_args``): every kernel and entry point takes
    them first, as ``const int64_t* kiln_ks``. An entry point takes its buffers as one
    array of pointers (``kiln_args``, in the order of its param names): a call through
    ctypes takes at most 1024 arguments, and an optimizer's segment over a GPT-2's
    parameters and state has more."""
    dtypes = {b.name: b.dtype for b in buffers}
    kernels_src = []
    segments, cur = [], None
    made = []
    for gi, g in enumerate(sched.groups):
        if g.extern is not None:
            cur = None
            continue
        src, params = CppKernel(gi, g, sched).source(dtypes)
        made.append((gi, src, params, [n.name for n in g.nodes]))
        if cur is None:
            cur = (f"kiln_seg{len(segments)}", [], [])
            segments.append(cur)
        cur[1].append((gi, params))
        cur[2].extend(n.name for n in g.nodes if n.name not in sched.locals)
    calls_to = shared.share(made) if config.regional else {}
    called = shared.callees(calls_to)
    kernels_src = [shared.not_inlined(src) if gi in called else src
                   for gi, src, _, _ in made if gi not in calls_to]
    by_name = {b.name: b for b in buffers}
    entries, entry_src = [], []
    for name, kernels, written in segments:
        params = []
        for _, ps in kernels:
            for p in ps:
                if p not in params:
                    params.append(p)
        sig = "const int64_t* kiln_ks, void* const* kiln_args"
        big = [f"  void* {p} = kiln_args[{i}];\n" for i, p in enumerate(params)]
        for p in dict.fromkeys(written):
            b = by_name[p]
            nbytes = ir.span(b.sizes, b.strides) * torch.empty((), dtype=b.dtype).element_size()
            if nbytes >= STREAM_BYTES:
                big.append(f"  kiln_hugepages({p}, {size(nbytes)});\n")
        calls = "\n".join(
            f"  kernel{gi}(" + ", ".join(["kiln_ks"] + [f"({ctype(dtypes[p])}*){p}" for p in ps])
            + ");" for gi, ps in (_callee(gi, ps, calls_to) for gi, ps in kernels))
        entry_src.append(f'extern "C" void {name}({sig}) {{\n{"".join(big)}{calls}\n}}')
        entries.append((name, params))
    # every marked size its own argument (``size_args.each_own``): equal values at these
    # sizes need not be equal at others, and a name shared would make the text differ
    vals, parts = [], [PRELUDE]
    for src in kernels_src:
        text, vs = each_own(src, len(vals))
        parts.append(_take_sizes(text, range(len(vals), len(vals) + len(vs))))
        vals += vs
    entries_text = []
    for src in entry_src:
        text, vs = each_own(src, len(vals), lambda i: f"kiln_ks[{i}]")
        entries_text.append(text)
        vals += vs
    parts += shared.entry_points(entries_text) if config.regional else entries_text
    return "\n\n".join(parts) + "\n", entries, vals


def _callee(gi: int, params: list, calls_to: dict) -> tuple:
    """The function a kernel's call runs and its arguments: its own, or the earlier
    kernel it shares (``shared.py``) with its buffers in that one's parameter order."""
    s = calls_to.get(gi)
    return (gi, params) if s is None else (s.gi, list(s.args))


def _take_sizes(src: str, mine) -> str:
    """A kernel's source (its sizes named ``ksN``) taking the size arguments: ``kiln_ks``
    its first parameter, the indices ``mine`` it uses read at its top (constants to the
    loops and indices)."""
    lines = src.split("\n")
    at = next(i for i, l in enumerate(lines) if l.startswith("static void kernel"))
    head = "(const int64_t* __restrict__ kiln_ks" + (")" if "()" in lines[at] else ", ")
    lines[at] = lines[at].replace("()" if "()" in lines[at] else "(", head, 1)
    decl = [f"  const int64_t ks{i} = kiln_ks[{i}];" for i in mine]
    if mine:
        # each thread its own copy: a shared one is read through memory in the loops
        priv = " firstprivate(" + ", ".join(f"ks{i}" for i in mine) + ")"
        lines = [l + priv if l.lstrip().startswith("#pragma omp parallel") else l
                 for l in lines]
    return "\n".join(lines[:at + 1] + decl + lines[at + 1:])
