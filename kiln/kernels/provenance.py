"""The user's lines above each generated kernel, in what kiln shows of it
(``KILN_LOGS=output_code``, the trace directory).

Each aten node carries ``meta["kiln_user_line"]`` (file, line, function): capture records
it for the torch-level node, the autograd stage copies it to the aten nodes it records
for that node. A kernel's header comment names the nodes it computes (``...; from add_1,
mul_2``); under it go the user lines of those nodes, with their source text.

The compiled source itself stays without them: it keys the C++ library cache, and one
graph plan serves every program with the same graph, so lines written into it would name
another program's lines, and an edit that moves a line would recompile everything below.
"""
from __future__ import annotations

import linecache
import re

_KERNEL_HEAD = re.compile(r"^(?P<indent>\s*)(?P<mark>//|#) .*; from (?P<origins>.+)$")


def user_lines_of(gm) -> dict:
    """Node name -> (file, line, function) for the nodes of ``gm`` that carry one."""
    out = {}
    for n in gm.graph.nodes:
        where = n.meta.get("kiln_user_line")
        if where is not None:
            out[n.name] = where
    return out


def annotate(source: str, user_lines: dict) -> str:
    """``source`` with, under each kernel's header comment, the user lines its nodes came
    from (``//   model.py:42 in forward: h = F.gelu(x)``)."""
    if not user_lines:
        return source
    out = []
    for line in source.splitlines():
        out.append(line)
        m = _KERNEL_HEAD.match(line)
        if m is None:
            continue
        seen = []
        for origin in m.group("origins").split(", "):
            where = user_lines.get(origin.split(" ")[0])
            if where is not None and where not in seen:
                seen.append(where)
        for file, lineno, fn in seen:
            text = linecache.getline(file, lineno or 0).strip()
            out.append(f"{m.group('indent')}{m.group('mark')}   {file}:{lineno} in {fn}: {text}")
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")
