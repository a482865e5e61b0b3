"""Pointwise kernels over rows (``KILN_TRITON_ROW_TILES``): a group whose iteration space
is [rows, C] (the innermost dim in memory C, long) and that reads values indexed by the
row alone (a cross-entropy gradient's row max, row sum and target; LayerNorm's mean and
rstd) runs on a 2-D grid — rows on axis 0, column blocks on axis 1 — over a
[ROWS, XBLOCK] block. A row's values are then one [ROWS, 1] load per program, not a
gather per element, and columns are ``program_id(1) * XBLOCK + arange``: no element
divides its flat index by the row length. The row index alone is split into the outer
dims (ROWS divisions a program). With one row a program (long rows) the row index and
its values are scalars and the columns a 1-D block. Other kernels keep the flat form of
``kernel.py``."""

from __future__ import annotations

from dataclasses import dataclass

from .... import config
from ... import ir
from ...ir import Load, numel_of
from ..size_args import is_lifted, size
from .exprs import FAST_DIV_LIMIT, TBody, declared_multiple, decompose, store_value, tindex
from .heuristics import ROW_TILE_MIN_COLS, RowTiles, plan_row_tiles
from .unmask import unmask


@dataclass
class RowShape:
    row_dims: list           # dims (positions in the group's sizes) the row index covers,
                             # outermost in memory first; size-1 dims left out
    col: int                 # the dim along a row: innermost in memory
    rows: int                # elements of the row dims together (R)
    cols: int                # the row length (C)
    tiles: RowTiles


def shape_of(g, sizes, perm, writes, xblock) -> RowShape | None:
    """The row form of pointwise group ``g`` (``perm``: its dims outermost to innermost
    in memory; ``writes``: the buffers it stores; ``xblock(loads)``: the flat kernel's
    XBLOCK counting those loads), or None where the flat form stays: row tiles off, one
    dim, a short row, no load indexed by the row alone, rows not 16-byte aligned, or
    indices the int32 lanes cannot hold."""
    if not config.triton_row_tiles:
        return None
    vars_ = ir.loop_vars(sizes)
    live = [i for i in perm if vars_[i].terms]
    if len(live) < 2:
        return None
    col = live[-1]
    c, numel = int(sizes[col]), numel_of(sizes)
    if c < ROW_TILE_MIN_COLS or numel >= FAST_DIV_LIMIT:
        return None
    cv = f"x{col}"
    loads = [e for n in g.nodes for e in ir.walk(n.body) if isinstance(e, Load)]
    if not any(e.index.vars() and cv not in e.index.vars() for e in loads):
        return None
    if not _rows_aligned(g, vars_, cv, c, loads, writes):
        return None
    streamed = [e for e in loads if cv in e.index.vars() or e.gather]
    tiles = plan_row_tiles(numel // c, c, xblock(streamed))
    if tiles is None:
        return None
    return RowShape(live[:-1], col, numel // c, c, tiles)


#: Bytes of the vector accesses a row's columns should make (Triton's widest).
VECTOR_BYTES = 16


def _rows_aligned(g, vars_, cv: str, c: int, loads, writes) -> bool:
    """Does every access that walks the row contiguously (column coefficient 1) start
    each row on a ``VECTOR_BYTES`` boundary, as Triton sees the sizes (a literal whole,
    a size argument by its declared multiple)? Otherwise its columns in row form are
    narrow accesses, where the flat form's contiguous flat index (which Triton's
    folding recovers through the divisions) keeps vectors: the flat form stays. The row
    length is checked too (the column mask against it)."""
    def ok(v, itemsize):
        v = int(v)
        return v == 0 or declared_multiple(v, is_lifted(size(v))) * itemsize % VECTOR_BYTES == 0

    accesses = [(e.index, [st for _, st in e.gather], e.dtype) for e in loads]
    accesses += [(n.store_index(vars_), [], n.dtype) for n in g.nodes if n.name in writes]
    for index, strides, dtype in accesses:
        if index.coef(cv) != 1:
            continue
        steps = [k for v, k in index.terms if v != cv] + strides + [index.const, c]
        if not all(ok(v, dtype.itemsize) for v in steps):
            return False
    return True


def source(k, params, writes, shape: RowShape):
    """(lines, grid, constexprs) of kernel ``k`` (a ``TritonKernel``) in row form."""
    g, t = k.g, shape.tiles
    sizes = tuple(g.outer)
    vars_ = ir.loop_vars(sizes)
    out = [f"def {k.name}({', '.join(params)}, ROWS: tl.constexpr, XBLOCK: tl.constexpr):"]
    if t.rows == 1:
        # one row a program: its values are scalars (a [1, 1] block is loaded again for
        # each element a thread holds)
        out += ["    rows = tl.program_id(0)",
                "    cols = tl.program_id(1) * XBLOCK + tl.arange(0, XBLOCK)"]
    else:
        out += ["    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]",
                "    cols = tl.program_id(1) * XBLOCK + tl.arange(0, XBLOCK)[None, :]"]
    # a lifted size is masked in every size class (another size shares the text), except
    # rows one a program: any number of rows fills those
    rowmask = colmask = None
    if t.rows > 1 and (shape.rows % t.rows or is_lifted(size(shape.rows))):
        out.append(f"    rowmask = rows < {size(shape.rows)}")
        rowmask = "rowmask"
    if shape.cols % t.cblock or is_lifted(size(shape.cols)):
        out.append(f"    colmask = cols < {size(shape.cols)}")
        colmask = "colmask"
    full = rowmask or colmask
    if rowmask and colmask:
        out.append("    xmask = rowmask & colmask")
        full = "xmask"
    rdims = shape.row_dims
    # a scalar row index divides once a program: plainly, not by a magic number that
    # costs more to compute than that one division (``bound`` None)
    bound = None if t.rows == 1 else -(-shape.rows // t.rows) * t.rows
    out += ["    " + l for l in decompose([vars_[i] for i in rdims], [sizes[i] for i in rdims],
                                          "rows", bound=bound)]
    out.append(f"    x{shape.col} = cols")
    out.append("    xzero = rows * 0 + cols * 0")
    row_vars = {f"x{i}" for i in rdims}
    cv = f"x{shape.col}"

    def mask_of(used: set):
        r = rowmask if used & row_vars else None
        c = colmask if cv in used else None
        return full if r and c else r or c

    body = TBody({}, "    ", k.counter, full, row_vars | {cv}, "xzero", mask_of=mask_of)
    mk = f", mask={full}" if full else ""
    for n in g.nodes:
        v = body.render(unmask(n.body, sizes))
        body.values[n.name] = v
        if n.name in writes:
            idx = n.store_index(vars_)
            ptr = f"{n.name} + {tindex(idx)}"
            if not (idx.vars() & row_vars and cv in idx.vars()):
                ptr += " + xzero"          # a store's pointers cover the whole block
            body.lines.append(f"    tl.store({ptr}, {store_value(v, n.dtype)}{mk})")
    out += body.lines
    grid = f"({-(-shape.rows // t.rows)}, {-(-shape.cols // t.cblock)})"
    return out, grid, {"ROWS": t.rows, "XBLOCK": t.cblock}
