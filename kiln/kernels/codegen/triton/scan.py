"""Triton kernel for an ``ir.Scan`` (``cumsum``): one program per line along the scanned
dim, walking it in blocks of RBLOCK — each block's inclusive ``tl.cumsum`` plus the
running total of the blocks before it. Sums accumulate in the compute dtype (float32 for
half precision and float32, as eager's CUDA kernel does; int64 for integers).
"""
from __future__ import annotations

from ... import ir
from ...ir import numel_of
from .exprs import (TL, AloneKernel, TBody, decompose, pow2, compute_dtype,
                         store_value)
from ..size_args import size

#: The largest block a program scans at once (longer lines loop over blocks).
MAX_RBLOCK = 1024


class ScanKernel(AloneKernel):
    """The prefix sums of an ``ir.Scan``, one line along its dim a program."""

    def source(self):
        """As ``TritonKernel.source``: (source, params, grid, constexprs, warps, tune)."""
        b = self.b
        params, _ = self.params()
        d, n = b.dim, int(b.sizes[b.dim])
        others = [(i, s) for i, s in enumerate(b.sizes) if i != d]
        vars_ = ir.loop_vars(tuple(b.sizes))
        rb = min(MAX_RBLOCK, pow2(max(n, 16)))
        acc = compute_dtype(b.acc_dtype)
        out = [f"# {self.name}: {b.scan_type} scan along dim {d}; from {b.origin}",
               "@triton.jit",
               f"def {self.name}({', '.join(params)}, RBLOCK: tl.constexpr):",
               "    pid = tl.program_id(0)"]
        out += ["    " + line for line in decompose([vars_[i] for i, _ in others],
                                                      [s for _, s in others], "pid")]
        out.append(f"    carry = tl.full([], 0, {TL[acc]})")
        out.append(f"    for r0 in range(0, {size(n)}, RBLOCK):")
        ind = "        "
        rvar = vars_[d]
        if rvar.terms:
            out.append(f"{ind}{rvar.terms[0][0]} = r0 + tl.arange(0, RBLOCK)")
        out.append(f"{ind}rmask = (r0 + tl.arange(0, RBLOCK)) < {size(n)}")
        out.append(f"{ind}rzero = tl.arange(0, RBLOCK) * 0")
        body = TBody({}, ind, self.counter, "rmask",
                     {t[0] for t in rvar.terms}, "rzero")
        v = body.render(b.body)
        out += body.lines
        out.append(f"{ind}v = tl.where(rmask, {v} + rzero, 0).to({TL[acc]})")
        out.append(f"{ind}c = tl.cumsum(v, 0) + carry")
        out.append(f"{ind}tl.store({body.ptr(b.name, b.store_index(vars_))}, "
                   f"{store_value('c', b.dtype)}, mask=rmask)")
        out.append(f"{ind}carry += tl.sum(v, 0)")
        grid = f"({max(numel_of([s for _, s in others]), 1)},)"
        return "\n".join(out), params, grid, {"RBLOCK": rb}, 4, ()
