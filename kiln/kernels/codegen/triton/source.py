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

import ast
import re

import torch

from ... import ir
from ...scheduler import Schedule
from .prelude import INTERPRETER_SHIMS, PRELUDE
from .exprs import interpreting
from .heuristics import plan_reduction
from .kernel import TritonKernel, split_group
from ..size_args import SizeArgs, concrete, is_lifted, size, substitute, used, values


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
    return generate_sized(sched, buffers, interpret)[:3]


#: The parameter through which kernels read their size arguments: an int64 tensor on
#: the device (every kernel parameter stays a pointer, as ``triton_build`` and
#: ``cuda_launch`` launch them), loaded once at the top of each kernel.
KS = "kiln_ks"


def generate_sized(sched: Schedule, buffers: list, interpret: bool | None = None):
    """``generate_detailed`` plus the size arguments (``size_args.SizeArgs``): the
    lifted values and each launch's grid. Segment launchers are
    ``kiln_segN(rt, launch, G, S, kiln_ks, *tensors)``: ``G`` the grids, ``S`` the
    values on the host (workspace sizes), ``kiln_ks`` the same on the device."""
    interpret = interpreting() if interpret is None else interpret
    dtypes = {b.name: b.dtype for b in buffers}
    parts = [PRELUDE] + ([INTERPRETER_SHIMS] if interpret else [])
    segments, cur, kinfo, grids = [], None, [], []
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
            if is_lifted(src):
                old = f"def {kern.name}({', '.join(params)}"
                params = params + [KS]
                assert old in src, old
                src = src.replace(old, f"def {kern.name}({', '.join(params)}", 1)
            pd = dict(dtypes)
            pd[KS] = torch.int64
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
            grids.append(ast.literal_eval(grid))
            cur[1].append((name, params, f"G[{len(grids) - 1}]", consts, nw, tune, allocs,
                           fused))
    entries = []
    for name, kernels in segments:
        params = []
        local = {ws for *_, allocs, _ in kernels for ws, _, _ in allocs}
        for _, ps, *_, fused in kernels:
            ps = ps if fused is None else fused[1]
            params += [q for q in ps if q not in params and q not in local and q != KS]
        lines = []
        for kname, ps, grid, consts, nw, tune, allocs, fused in kernels:
            for ws, numel, dt in allocs:
                lines.append(f"    {ws} = torch.empty({size(numel)}, dtype={dt}, "
                             f"device={params[0]}.device)")
            kw = ", ".join(f"{k}={v}" for k, v in consts.items())
            if not tune:
                kw += f", num_warps={nw}"
            call = f"    launch(rt, {kname}, {grid}, ({', '.join(ps)},), dict({kw}))"
            lines += [call] if fused is None else fused[0](call)
        parts.append(f"def {name}(rt, launch, G, S, {', '.join([KS] + params)}):\n"
                     + "\n".join(lines))
        entries.append((name, params))
    vals = []
    for part in parts:
        vals = values(part, vals)
    parts = [_take_sizes(part, vals) for part in parts]
    return "\n\n\n".join(parts) + "\n", entries, kinfo, SizeArgs(vals, grids)


#: Triton's own specialisation of integer arguments: a multiple of this is declared so
#: (``tl.multiple_of``), which lets loads under a mask against it, or along rows of a
#: stride of it, be vector loads. A size class is a multiple or not.
DIVISIBILITY = 16


def _read(i: int, v: int) -> str:
    """A kernel's read of size argument ``i`` (value ``v``): int32 where it fits (the
    type Triton gives such a literal), declared a multiple of DIVISIBILITY when it is."""
    r = f"tl.load({KS} + {i})" + (".to(tl.int32)" if -2**31 <= v < 2**31 else "")
    return f"tl.multiple_of({r}, {DIVISIBILITY})" if v % DIVISIBILITY == 0 else r


def _take_sizes(part: str, vals: list) -> str:
    """A kernel's text reading the size arguments it uses from ``kiln_ks`` at its top
    (as int32 where the value fits, the type Triton gives such a literal); a
    launcher's reading them from ``S``."""
    if not is_lifted(part):
        return part
    lines = substitute(part, vals).split("\n")
    at = next(i for i, l in enumerate(lines) if l.startswith("def "))
    if lines[at].startswith("def kiln_seg"):
        return substitute(part, vals, lambda i: f"S[{i}]")
    decl = [f"    ks{i} = {_read(i, vals[i])}" for i in used(part, vals)]
    return "\n".join(lines[:at + 1] + decl + lines[at + 1:])


def _fused(gi, g, sched, kern, dtypes, interpret, parts, seen):
    """A group with a library product fused in (``matmul_epilogue``): its fused kernel
    emitted beside the plain one (which reads the product from memory, for the library
    tier); returns (the launcher lines as a function of the plain kernel's launch
    line, the segment parameters this group needs)."""
    from . import matmul_epilogue as me
    from ... import matmul_fusion
    lay = matmul_fusion.layout(g.matmul, dtypes)
    own, writes = kern.params()
    own = [q for q in own if q != g.matmul.name]
    bias = lay["bias"]
    if bias is not None and bias.buf not in own:
        own.append(bias.buf)
    fname = f"kernel{gi}_mm"
    src, fparams, consts, options, stores = me.source(fname, g, own, writes, lay, dtypes,
                                                      interpret)
    src = concrete(src)           # the fused tier keeps its sizes literal
    key = ("matmul", _canonical(src, fname, fparams), tuple(sorted(consts.items())))
    name = seen.get(key)
    if name is None:
        name = seen[key] = fname
        parts.append(src)
    needs = sorted(g.matmul.reads() - set(own)) + own
    return (lambda call: me.launcher_lines(name, call, g, lay, own, consts, options, stores)), \
        needs
