"""Triton kernels for an ``ir.Scatter`` (``index_put``): one kernel writes the
destination's initial value (an ordinary pointwise kernel), a second writes the values
at their computed positions — ``tl.store``, or ``tl.atomic_add`` when accumulating, so
that repeated positions add up whichever program gets there first (in an order that
varies from run to run, as eager's CUDA kernels' order does not: sums agree to
rounding). Half precision accumulates into a float32 copy that the lowering rounds
once at the end, as eager sums repeats in float before one write.
"""
from __future__ import annotations

from ... import ir
from ...ir import numel_of
from ...scheduler import Group
from .exprs import AloneKernel, TBody, decompose, pow2, store_value
from .kernel import XBLOCK, TritonKernel
from ..size_args import is_lifted, size


class ScatterKernel(AloneKernel):
    """The writes of an ``ir.Scatter`` over its index space, XBLOCK positions a program."""

    def source(self):
        """As ``TritonKernel.source``: (source, params, grid, constexprs, warps, tune)."""
        b = self.b
        params, _ = self.params()
        sizes = tuple(b.iter_sizes)
        numel = numel_of(sizes)
        xb = min(XBLOCK, pow2(max(numel, 16)))
        out = [f"# {self.name}: scatter over [{', '.join(size(s) for s in sizes)}]; from {b.origin}",
               "@triton.jit",
               f"def {self.name}({', '.join(params)}, XBLOCK: tl.constexpr):",
               "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)"]
        mask = None
        if numel % xb or is_lifted(size(numel)):
            out.append(f"    xmask = xindex < {size(numel)}")
            mask = "xmask"
        out += ["    " + line for line in decompose(ir.loop_vars(sizes), sizes, "xindex")]
        out.append("    xzero = xindex * 0")
        body = TBody({}, "    ", self.counter, mask, {f"x{i}" for i in range(len(sizes))},
                     "xzero")
        v = body.render(b.value)
        ptr = body.address(b.dest)
        masks = [m for m in (mask, body.render(b.dest.mask) if b.dest.mask is not None
                             else None) if m]
        mk = f", mask={' & '.join(masks)}" if masks else ""
        val = store_value(v, b.dtype)
        if b.accumulate:
            body.lines.append(f"    tl.atomic_add({ptr}, {val}{mk}, sem='relaxed')")
        else:
            body.lines.append(f"    tl.store({ptr}, {val}{mk})")
        out += body.lines
        return "\n".join(out), params, f"({-(-numel // xb)},)", {"XBLOCK": xb}, 4, ()


def scatter_kernels(gi: int, g: Group, sched, interpret: bool) -> list:
    """The group's kernels in launch order, as ``generate_detailed`` takes them:
    (kernel, workspace allocations)."""
    b = g.alone
    init = ir.Pointwise(b.name, b.sizes, b.strides, b.dtype, body=b.init, origin=b.origin)
    first = TritonKernel(gi, Group(tuple(b.sizes), None, [init]), sched,
                         name=f"kernel{gi}_init", interpret=interpret)
    return [(first, []), (ScatterKernel(gi, b), [])]
