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
import functools
import re

import torch

from ... import ir
from ...scheduler import Schedule
from .prelude import INTERPRETER_SHIMS, PRELUDE
from .exprs import declared_multiple, interpreting, udiv_magic
from .heuristics import plan_reduction
from .kernel import TritonKernel, split_group
from ..size_args import SizeArgs, concrete, each_own, names_each_own, size, substitute, values


@functools.lru_cache(maxsize=4096)
def _grid_of(grid: str) -> tuple:
    """A launch grid's literal text as a tuple (parsed once per text: ``literal_eval``
    compiles it, and every size of a symbolic graph asks again for the same grids)."""
    return ast.literal_eval(grid)


@functools.lru_cache(maxsize=4096)
def _names_pattern(names: tuple):
    """``_canonical``'s pattern for these names (the same kernels' names recur at
    every size of a symbolic graph)."""
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(re.escape(n) for n in names)
                      + r")(?![A-Za-z0-9])")


def _canonical(src: str, name: str, params: list) -> str:
    """A kernel's text with its name and parameter names made positional, the graph's
    buffer names it holds only inside (a reduction it does not store: ``acc_buf54``)
    numbered in order of first use, and comments dropped: kernels equal under this
    (the same block of a network repeated) are compiled once. Renaming is one-to-one,
    so equal texts are the same kernel up to names. A name is replaced inside the
    identifiers made from it too (``acc_buf7``): ``_`` separates, letters and digits
    do not."""
    return _canonical_of(src, name, tuple(params))


#: the graph's buffer and input names (``buf7``, ``in3``), wherever a kernel uses them
_BUFFER_NAME = re.compile(r"(?<![A-Za-z0-9])((?:buf|in)\d+)(?![A-Za-z0-9])")


@functools.lru_cache(maxsize=512)
def _canonical_of(src: str, name: str, params: tuple) -> str:
    """``_canonical``, remembered by its arguments: a kernel's text with its sizes read
    from ``kiln_ks`` is the same at every size of its class, and the substitution was a
    quarter of the code generator's time for each new size."""
    names = {name: "KERNEL", **{p: f"P{i}" for i, p in enumerate(params)}}
    body = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith("#"))
    for m in _BUFFER_NAME.finditer(body):
        if m.group(1) not in names:
            names[m.group(1)] = f"LOCAL{len(names)}"
    pat = _names_pattern(tuple(names))
    return pat.sub(lambda m: names[m.group(1)], body)


def generate(sched: Schedule, buffers: list):
    """The module source, and per segment (launcher name, params)."""
    source, entries, _ = generate_detailed(sched, buffers)
    return source, entries


def generate_detailed(sched: Schedule, buffers: list, interpret: bool | None = None):
    """``generate`` plus, per kernel, (name, params, param dtypes, constexprs, num_warps):
    what compiling a kernel ahead of time needs (``tests/kernels/test_triton_compile.py``)."""
    return generate_sized(sched, buffers, interpret)[:3]


#: The parameter through which kernels read their size arguments: a pointer into an int64
#: tensor on the device (every kernel parameter stays a pointer, as ``triton_build`` and
#: ``cuda_launch`` launch them), loaded once at the top of each kernel.
KS = "kiln_ks"


def generate_sized(sched: Schedule, buffers: list, interpret: bool | None = None):
    """``generate_detailed`` plus the size arguments (``size_args.SizeArgs``): the
    lifted values, each launch's grid and the device layout of its sizes. Segment
    launchers are ``kiln_segN(rt, launch, G, S, K, *tensors)``: ``G`` the grids, ``S``
    the values on the host (workspace sizes), ``K`` per launch a view of the device
    array at that launch's sizes (``K[j]`` beside ``G[j]``).

    Each kernel names its sizes locally (``ks0``, ``ks1``… in order of first use) and
    kernels are deduplicated on that text: an optimizer's per-parameter updates, which
    differ only in their element counts, are one kernel (one binary) launched with
    different ``K[j]``."""
    interpret = interpreting() if interpret is None else interpret
    dtypes = {b.name: b.dtype for b in buffers}
    parts = [PRELUDE] + ([INTERPRETER_SHIMS] if interpret else [])
    segments, cur, kinfo, grids, local_sizes, lifted_sizes = [], None, [], [], [], []
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
            old = f"def {kern.name}({', '.join(params)}"
            assert old in src, old
            # this kernel's sizes in the order its code first uses them (then any only
            # its header comment names)
            if names_each_own():      # every mark its own argument, in order of use
                at = src.index(old)
                body, mine = each_own(src[at:], 0)
                head, more = each_own(src[:at], len(mine))
                src, mine = head + body, mine + more
            else:
                mine = values(src, values(src[src.index(old):]))
            params = _by_first_use(src, old, params) + ([KS] if mine else [])
            src = src.replace(old, f"def {kern.name}({', '.join(params)}", 1)
            raw = mine
            if mine:
                src, mine = _take_sizes(src, kern.name, mine)
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
            grids.append(_grid_of(grid))
            local_sizes.append(mine)
            lifted_sizes.append(raw)
            j = len(grids) - 1
            args = [f"K[{j}]" if q == KS else q for q in params]
            cur[1].append((name, params, args, f"G[{j}]", consts, nw, tune, allocs, fused))
    entries, launchers = [], []
    for name, kernels in segments:
        params = []
        local = {ws for *_, allocs, _ in kernels for ws, _, _ in allocs}
        for _, ps, *_, fused in kernels:
            ps = ps if fused is None else fused[1]
            params += [q for q in ps if q not in params and q not in local and q != KS]
        lines = []
        for kname, ps, args, grid, consts, nw, tune, allocs, fused in kernels:
            for ws, numel, dt in allocs:
                lines.append(f"    {ws} = torch.empty({size(numel)}, dtype={dt}, "
                             f"device={params[0]}.device)")
            kw = ", ".join(f"{k}={v}" for k, v in consts.items())
            if not tune:
                kw += f", num_warps={nw}"
            call = f"    launch(rt, {kname}, {grid}, ({', '.join(args)},), dict({kw}))"
            lines += [call] if fused is None else fused[0](call)
        launchers.append(f"def {name}(rt, launch, G, S, {', '.join(['K'] + params)}):\n"
                         + "\n".join(lines))
        entries.append((name, params))
    host = []
    for part in launchers:
        host = values(part, host)
    parts += [substitute(part, host, lambda i: f"S[{i}]") for part in launchers]
    everything = host + sorted({v for mine in lifted_sizes for v in mine} - set(host))
    device, slots = layout(local_sizes)
    return "\n\n\n".join(parts) + "\n", entries, kinfo, \
        SizeArgs(everything, grids, device, slots)


#: a launch's sizes start at a multiple of this many values in the device array: 16
#: bytes, the alignment Triton specialises pointers on (every ``K[j]`` has it, so one
#: binary serves all of a kernel's launches)
_ALIGN = 2


def layout(local_sizes: list) -> tuple:
    """The device array of the launches' sizes (``local_sizes``: per launch its values in
    its kernel's order, empty for a kernel without sizes) and per launch its slot
    (offset, length) in it, None for none. Launches with equal values share a slot."""
    device, slots, at = [], [], {}
    for mine in local_sizes:
        if not mine:
            slots.append(None)
            continue
        key = tuple(mine)
        if key not in at:
            at[key] = len(device)
            device += list(mine) + [0] * (-len(mine) % _ALIGN)
        slots.append((at[key], len(mine)))
    return device, slots


def _read(i: int, v: int, rows: bool) -> str:
    """A kernel's read of size argument ``i`` (value ``v``): int32 where it fits (the
    type Triton gives such a literal), declared the multiple it is
    (``exprs.declared_multiple``; ``rows``: a row-tiled kernel)."""
    r = f"tl.load({KS} + {i})" + (".to(tl.int32)" if -2**31 <= v < 2**31 else "")
    d = declared_multiple(v, rows=rows)
    return f"tl.multiple_of({r}, {d})" if d > 1 else r


def _by_first_use(src: str, head: str, params: list) -> list:
    """``params`` in the order the kernel's body first names them (those it never names
    last): the generator lists them by name, so two kernels of one structure over
    differently numbered buffers would otherwise differ in order, hence in text."""
    body = src[src.index(head) + len(head):]
    body = body[body.index("\n"):]
    first = {}
    for q in params:
        at = _first_identifier(body, q)
        if at is not None:
            first[q] = at
    return sorted(params, key=lambda q: first.get(q, len(body)))


def _first_identifier(text: str, name: str):
    """Where ``name`` first occurs in ``text`` as a whole identifier (not inside a
    longer run of letters, digits and ``_``: an identifier token equal to ``name``),
    or None. ``str.find`` with the bounds checked: a regular expression per name, or a
    scan of every identifier, cost more than the kernel's own generation."""
    n, i = len(name), text.find(name)
    while i >= 0:
        j = i + n
        if (i == 0 or not _word(text[i - 1])) and (j == len(text) or not _word(text[j])):
            return i
        i = text.find(name, i + 1)
    return None


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _take_sizes(src: str, name: str, mine: list) -> tuple:
    """Kernel ``name``'s text reading its sizes (``mine``: their values, in order of
    first use) from ``kiln_ks`` at its top, as ``ks0``, ``ks1``…: the names are the
    kernel's own, so kernels differing only in sizes have one text. Each read keeps the
    class of its value (int32 or not, the multiple it is declared). Returns the text and
    the values its launch passes: ``mine``, then each divisor's magic number and shift
    (``_host_magic``)."""
    src, divisors = _host_magic(substitute(src, mine))
    lines = src.split("\n")
    at = next(i for i, l in enumerate(lines) if l.startswith(f"def {name}("))
    rows = "ROWS: tl.constexpr" in lines[at]
    decl = [f"    ks{i} = {_read(i, v, rows)}" for i, v in enumerate(mine)]
    values = list(mine)
    for i in divisors:
        m, sh = udiv_magic(mine[i])
        decl += [f"    ksm{i} = tl.load({KS} + {len(values)}).to(tl.uint32)",
                 f"    kss{i} = tl.load({KS} + {len(values) + 1}).to(tl.uint32)"]
        values += [m, sh]
    return "\n".join(lines[:at + 1] + decl + lines[at + 1:]), values


_UDIV = "kiln_udiv("


def _host_magic(src: str) -> tuple:
    """``src`` with each ``kiln_udiv(x, ksN)`` (a division by size argument N) as
    ``kiln_udivm(x, ksmN, kssN)``: the divisor's magic number and shift, computed on the
    host per size and passed beside the sizes. Computed in the kernel, they cost every
    thread a 31-step loop and a 64-bit division per divisor (no hardware divides 64
    bits), where a pointwise kernel's own work is a few dozen instructions an element.
    Returns the text and the Ns, in order of first use."""
    out, divisors, pos = [], [], 0
    while True:
        at = src.find(_UDIV, pos)
        if at < 0:
            out.append(src[pos:])
            break
        depth, j, comma = 1, at + len(_UDIV), None
        while depth:
            c = src[j]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "," and depth == 1:
                comma = j
            j += 1
        divisor = src[comma + 1:j - 1].strip()
        if not divisor.startswith("ks") or not divisor[2:].isdigit():
            out.append(src[pos:j])              # a literal divisor: Triton folds it
            pos = j
            continue
        n = int(divisor[2:])
        if n not in divisors:
            divisors.append(n)
        # the dividend may itself divide (nested): its text rewritten too
        inner, more = _host_magic(src[at + len(_UDIV):comma])
        divisors += [d for d in more if d not in divisors]
        out.append(f"{src[pos:at]}kiln_udivm({inner}, ksm{n}, kss{n})")
        pos = j
    return "".join(out), divisors


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
