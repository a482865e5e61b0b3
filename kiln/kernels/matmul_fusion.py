"""Which library products fuse into their pointwise reader (``config.matmul_epilogue``).

The scheduler's half of the matmul epilogue: a large bf16/fp16 ``mm``/``addmm`` whose
result only one pointwise group reads moves into that group (``Group.matmul``);
``codegen.triton.matmul_epilogue`` writes and launches the fused kernel.
"""
from __future__ import annotations

import torch

from . import ir
from .ir import Affine, Load

aten = torch.ops.aten

#: Products smaller than this (M*N*K) stay library calls: the fused kernel's compile
#: pays only where the pointwise pass it saves is large.
MIN_MNK = 1 << 33
_DTYPES = (torch.bfloat16, torch.float16)


# --- which products fuse ---------------------------------------------------------------
def operands(ext) -> tuple | None:
    """(bias or None, mat1, mat2) of a plain ``mm``/``addmm`` library call."""
    if ext.op is aten.mm.default and len(ext.args) == 2 and not ext.kwargs:
        bias, (a, b) = None, ext.args
    elif (ext.op is aten.addmm.default and len(ext.args) == 3
          and set(ext.kwargs) <= {"beta", "alpha"}
          and all(ext.kwargs.get(k, 1) == 1 for k in ("beta", "alpha"))):
        bias, a, b = ext.args
    else:
        return None
    if not all(isinstance(x, ir.ExternArg) for x in (a, b) + ((bias,) if bias else ())):
        return None
    return bias, a, b


def _rows(arg, rows, cols) -> int | None:
    """The row stride of ``arg`` if it is a row-major [rows, cols] view whose rows a
    TMA descriptor can address (16-byte aligned start and stride), else None."""
    if tuple(arg.sizes) != (rows, cols) or arg.offset % 8:
        return None
    s0, s1 = (int(s) for s in arg.strides)
    if s1 == 1 and s0 % 8 == 0 and s0 >= cols:
        return s0
    return None


def layout(ext, dtypes: dict) -> dict | None:
    """The fused kernel's view of a product: sizes, operand layouts, bias; None when it
    does not qualify (dtype, layout, size)."""
    ops = operands(ext)
    if ops is None or ext.dtype not in _DTYPES:
        return None
    bias, a, b = ops
    if any(dtypes.get(x.buf) != ext.dtype for x in (a, b)):
        return None
    if len(a.sizes) != 2 or len(b.sizes) != 2:
        return None
    (m, k), n = (int(s) for s in a.sizes), int(b.sizes[1])
    if tuple(ext.sizes) != (m, n) or tuple(ext.strides) != (n, 1) or min(m, n, k) < 16 \
            or m * n * k < MIN_MNK:
        return None
    sa = _rows(a, m, k)
    sb_t = _rows(ir.ExternArg(b.buf, (n, k), tuple(reversed(b.strides)), b.offset), n, k)
    sb = _rows(b, k, n)
    if sa is None or (sb_t is None and sb is None):
        return None
    out = {"m": m, "n": n, "k": k, "a": a, "b": b, "a_stride": sa,
           "b_kmajor": sb_t is not None, "b_stride": sb_t if sb_t is not None else sb,
           "bias": None}
    if bias is not None:
        if len(bias.sizes) > 2 or dtypes.get(bias.buf) is None:
            return None
        sizes = (1,) * (2 - len(bias.sizes)) + tuple(int(s) for s in bias.sizes)
        strides = (0,) * (2 - len(bias.strides)) + tuple(int(s) for s in bias.strides)
        if any(s not in (1, full) for s, full in zip(sizes, (m, n))):
            return None
        index = Affine.c(bias.offset)
        for var, s, st in zip(("x0", "x1"), sizes, strides):
            if s != 1:
                index = index + Affine.var(var) * st
        out["bias"] = Load(bias.buf, index, dtypes[bias.buf])
    return out


def _epilogue_ok(ext, g) -> bool:
    """``g`` is a pointwise group over the product's [M, N] that reads it only at the
    element it computes (so the accumulator tile stands in for the load)."""
    if g.red is not None or g.extern is not None or g.matmul is not None:
        return False
    if tuple(g.outer) != tuple(ext.sizes):
        return False
    own = ir.linear_index(ir.loop_vars(ext.sizes), ext.strides)
    for n in g.nodes:
        if not isinstance(n, ir.Pointwise):
            return False
        for e in ir.walk(n.body):
            if isinstance(e, Load) and e.buf == ext.name and (
                    e.mask is not None or e.gather or e.index != own):
                return False
    return True


def fuse(groups: list, buffers: list, output_names: set) -> list:
    """``groups`` with each qualifying library product moved into the pointwise group
    that alone reads it. Between the two there must be no other library call (it could
    write to an operand); the operands' memory stays live until the fused group (the
    scheduler counts ``Group.matmul``'s reads as the group's)."""
    dtypes = {b.name: b.dtype for b in buffers}
    readers = {}
    for gi, g in enumerate(groups):
        reads = g.extern.reads() if g.extern is not None else set().union(
            *(n.reads() for n in g.nodes))
        for r in reads:
            readers.setdefault(r, set()).add(gi)
    fused = set()
    for gi, g in enumerate(groups):
        ext = g.extern
        if ext is None or ext.name in output_names or ext.outputs:
            continue
        rs = readers.get(ext.name, set())
        if len(rs) != 1:
            continue
        (gj,) = rs
        if gj <= gi or not _epilogue_ok(ext, groups[gj]) or layout(ext, dtypes) is None:
            continue
        if any(groups[k].extern is not None for k in range(gi + 1, gj)):
            continue
        groups[gj].matmul = ext
        fused.add(gi)
    return [g for i, g in enumerate(groups) if i not in fused]
