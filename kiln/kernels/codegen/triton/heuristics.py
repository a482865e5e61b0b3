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
#: Split a reduction into partial results when it would have fewer programs than this...
SPLIT_MAX_PROGRAMS = 256
#: ...and each output reduces at least this many elements.
SPLIT_MIN_RNUM = 32768
#: Programs a split reduction aims at (an H100 has 132 multiprocessors).
SPLIT_TARGET_PROGRAMS = 1024
#: Column reductions (the kept dim is the contiguous one: LayerNorm's weight gradient, a
#: Linear's bias gradient, sums over rows): outputs per program, the block's fast
#: (contiguous) axis — 64 fp32 is 256 contiguous bytes a row, 16 lanes of 16-byte
#: vectors; bf16 half of it, a whole 128-byte line...
COLUMN_XBLOCK = 64
#: ...and reduced rows per step of the [RBLOCK, XBLOCK] block (8 warps of 8 values).
COLUMN_RBLOCK = 32
#: A column reduction splits from this many reduced rows on (768 outputs of 4096 rows
#: unsplit are 12 programs each walking all rows: 12 of an H100's 132 multiprocessors).
COLUMN_SPLIT_MIN_RNUM = 1024
#: Reduced rows each program of a split column reduction walks, at least, in steps.
COLUMN_SPLIT_MIN_STEPS = 2
#: A column reduction too short to split, over too few outputs to give this many
#: programs at COLUMN_XBLOCK outputs each, narrows its block instead (a squeeze-
#: excitation block's mean over 14x14 of 16x96 channels-last values: 24 programs of 64
#: outputs left 108 of 132 multiprocessors idle, 11 us; at 8 outputs, 192 programs)...
COLUMN_MIN_PROGRAMS = 128
#: ...down to this many outputs a program (8 bf16 values: one 16-byte vector a row).
COLUMN_MIN_XBLOCK = 8
#: Kernels over at least this many elements try a few num_warps on first use (GPU only).
AUTOTUNE_MIN_NUMEL = 1 << 24


@dataclass
class Plan:
    xb: int                  # outputs per program (XBLOCK)
    rb: int                  # reduced elements per step (RBLOCK)
    persistent: bool         # the whole reduced extent in one block, no loop
    column: bool             # the kept dim is the contiguous one: an [RBLOCK, XBLOCK]
                             # block reduced over axis 0, partials laid [split, outputs]
    split: int = 1           # programs per output (partial results), 1: none
    chunk: int = 0           # reduced elements per split program
    num_warps: int = 4
    tune: tuple = ()         # num_warps candidates for the autotuner


def _column(g) -> bool:
    """Loads contiguous along the last kept dim and not along the innermost reduced one
    (sum over rows, over channels of NCHW): lanes should walk the kept dim. Loads that
    vary with no kept dim (a row's mean and rstd recomputing LayerNorm's normalised
    input) are one value per reduced row whatever the block's orientation: not counted."""
    if not g.outer or not g.red or int(g.outer[-1]) < 8:
        return False
    k = len(g.outer)
    last, inner = f"x{k - 1}", f"x{k + len(g.red) - 1}"
    kept = {f"x{i}" for i in range(k)}
    loads = [e for n in g.nodes for e in ir.walk(n.body)
             if isinstance(e, Load) and e.index.vars() & kept]
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


def plan_reduction(g, interpret: bool = False, allow_split: bool = True) -> Plan:
    """The plan of group ``g``. Every decision is made from the sizes at compile time and
    shows in the kernel text (block sizes are constexprs, a split is a second kernel and
    a program axis), so a size class has its own text; the chunk and split counts are
    printed as sizes. ``allow_split=False``: the plan of a split's second stage."""
    p, onum, rnum = _blocks(g)
    nprog = -(-onum // p.xb)
    if allow_split and _split_wanted(p, rnum, nprog) and _splittable(g):
        _split(p, rnum, nprog, COLUMN_SPLIT_MIN_STEPS if p.column else 4)
    elems = p.xb * p.rb
    p.num_warps = max(2, min(16, elems // 256))
    if not interpret and onum * rnum >= min(AUTOTUNE_MIN_NUMEL, config.autotune_min_numel) \
            and p.split == 1:
        p.tune = (4, 8, 16) if elems >= 2048 else (2, 4, 8)
    return p


def _blocks(g):
    """(the unsplit Plan, outputs, reduced elements) of group ``g``."""
    onum, rnum = numel_of(g.outer), numel_of(g.red)
    r2 = pow2(max(rnum, 1))
    if _column(g):
        xb = min(pow2(onum), COLUMN_XBLOCK)
        rb = max(1, min(r2, COLUMN_RBLOCK * COLUMN_XBLOCK // xb))
        if rnum < COLUMN_SPLIT_MIN_RNUM and -(-onum // xb) < COLUMN_MIN_PROGRAMS:
            while xb > COLUMN_MIN_XBLOCK and -(-onum // xb) < COLUMN_MIN_PROGRAMS:
                xb //= 2
            # the block keeps its number of elements whatever the reduced extent, so
            # short column reductions of one size class share a text (rows past the
            # extent are masked)
            rb = COLUMN_RBLOCK * COLUMN_XBLOCK // xb
        return Plan(xb, rb, rb >= rnum, True), onum, rnum
    persistent = r2 <= PERSISTENT_MAX
    rb = r2 if persistent else LOOP_RBLOCK
    xb = 1
    if rb < 1024:
        xb = max(1, min(pow2(onum), 1024 // rb, 64))
    return Plan(xb, rb, persistent, False), onum, rnum


def _split_wanted(p: Plan, rnum: int, nprog: int) -> bool:
    """Few programs, each looping over a long reduction."""
    return (not p.persistent and nprog < SPLIT_MAX_PROGRAMS
            and rnum >= (COLUMN_SPLIT_MIN_RNUM if p.column else SPLIT_MIN_RNUM))


def loops_apart(g) -> bool:
    """Should the scheduler cut group ``g`` (several inner loops in sequence) into a
    group per loop? When a split is wanted (few programs over long reductions) but the
    group, of several loops, is not splittable: a batch norm's mean and variance over
    few channels. A reduction kept whole in registers (persistent) reads memory once
    however many loops there are: those stay together."""
    p, onum, rnum = _blocks(g)
    if not _split_wanted(p, rnum, -(-onum // p.xb)):
        return False
    reds = [n for n in g.nodes if isinstance(n, ir.Reduction)]
    return bool(reds) and all(KINDS[n.red_type].combine for n in reds)


def _split(p: Plan, rnum: int, nprog: int, min_steps: int):
    """Programs per output (``p.split``) so that all programs number about
    SPLIT_TARGET_PROGRAMS, each walking a chunk of at least ``min_steps`` blocks."""
    s = max(2, SPLIT_TARGET_PROGRAMS // nprog)
    s = min(s, max(2, rnum // (min_steps * p.rb)))
    chunk = -(-(-(-rnum // s)) // p.rb) * p.rb
    p.split, p.chunk = -(-rnum // chunk), chunk


# --- pointwise kernels over rows (row_tiles.py) ----------------------------------------
#: A pointwise kernel runs as row tiles when its innermost dim has at least this many
#: elements: each row then spans whole column blocks, and the values it reads once per
#: row are few against the elements it streams.
ROW_TILE_MIN_COLS = 1024
#: The narrowest column block (elements a program covers along a row)...
ROW_TILE_MIN_CBLOCK = 128
#: ...halved from the pointwise XBLOCK while the blocks of a row would leave more than
#: this share of its columns masked off (a row of 1025 in blocks of 1024 wastes half).
ROW_TILE_MAX_WASTE = 0.125
#: CUDA's limit on grid axis 1, where the column blocks go (rows go on axis 0: 2**31-1).
GRID_Y_MAX = 65535


@dataclass
class RowTiles:
    rows: int                # rows per program (ROWS), a power of two
    cblock: int              # columns per program (XBLOCK), a power of two


def plan_row_tiles(rows: int, cols: int, xb: int) -> RowTiles | None:
    """The [ROWS, XBLOCK] block of a row-tiled kernel over ``rows`` x ``cols`` whose
    flat form would take ``xb`` elements a program: the widest column block leaving
    at most ``ROW_TILE_MAX_WASTE`` of a row masked, and as many rows as keep the block
    at ``xb`` elements (no more than there are). None: too many column blocks for the
    grid."""
    cb = xb
    while cb > ROW_TILE_MIN_CBLOCK and (-(-cols // cb) * cb - cols) > ROW_TILE_MAX_WASTE * cols:
        cb //= 2
    if -(-cols // cb) > GRID_Y_MAX:
        return None
    return RowTiles(max(1, min(xb // cb, pow2(rows))), cb)
