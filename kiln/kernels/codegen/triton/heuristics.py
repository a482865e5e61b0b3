"""How a reduction group maps onto Triton programs (``plan_reduction``): whole rows
in registers, looped rows, lanes along a kept contiguous dim, or a two-stage split;
the block sizes and the few num_warps autotuning tries. Tests patch the constants."""

from __future__ import annotations

from dataclasses import dataclass

from .... import config
from ... import ir
from ...ir import Load, numel_of
from ...reductions import KINDS
from .exprs import pow2


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
    return bool(reds) and all(KINDS[n.red_type].combine for n in reds)


def plan_reduction(g, interpret: bool = False) -> Plan:
    onum, rnum = numel_of(g.outer), numel_of(g.red)
    r2 = pow2(max(rnum, 1))
    if _column(g):
        xb = min(pow2(onum), 128)
        rb = max(1, min(r2, BLOCK_ELEMS // xb))
        p = Plan(xb, rb, rb >= rnum, True)
    else:
        persistent = r2 <= PERSISTENT_MAX
        rb = r2 if persistent else LOOP_RBLOCK
        xb = 1
        if rb < 1024:
            xb = max(1, min(pow2(onum), 1024 // rb, 64))
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
