"""PyTorch's core-aten decomposition table, rebuilt from a remembered op list.

``torch._decomp.core_aten_decompositions()`` adds to its hand-written table one entry
per CompositeImplicitAutograd op, and finds those ops by materialising and inspecting
every overload of every op namespace: 0.3-0.5 s, paid at every process's first compile.
The ops it finds depend only on the installed PyTorch and on which libraries have
registered CompositeImplicitAutograd kernels, so their names are kept under
``cache_dir``, keyed by PyTorch's version and the dispatcher's list of those
registrations; a later process rebuilds the same table (same keys; each added entry
runs the op's CompositeImplicitAutograd kernel, as PyTorch's does) in milliseconds. Any name that no longer resolves
means a full rebuild.
"""
from __future__ import annotations

import os

import torch
from torch._decomp import _core_aten_decompositions_post_autograd, core_aten_decompositions

from kiln.disk_cache import cache_path, key_of, write_text

FORMAT = 1


def _name(op) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def _resolve(name: str):
    qual, _, overload = name.rpartition(".")
    ns, _, op = qual.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def _path() -> str:
    regs = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    key = key_of(str(FORMAT), torch.__version__, str(torch.version.git_version), *sorted(regs))
    return cache_path("decompositions", key, ".txt")


def _remembered(path: str) -> dict | None:
    try:
        with open(path) as f:
            names = f.read().split()
        table = dict(_core_aten_decompositions_post_autograd())
        for n in names:
            op = _resolve(n)
            # what PyTorch's table holds for such an op: run its Python
            # CompositeImplicitAutograd kernel if it has one, else the C++ one
            table[op] = op.decompose
        return table
    except (OSError, AttributeError, ValueError, RuntimeError):
        return None


def core_aten_table() -> dict:
    """``dict(core_aten_decompositions())``, from the remembered op list when there is
    one."""
    try:
        path = _path()
    except Exception:                 # noqa: BLE001  (another PyTorch: no shortcut)
        return dict(core_aten_decompositions())
    table = _remembered(path) if os.path.exists(path) else None
    if table is not None:
        return table
    table = dict(core_aten_decompositions())
    try:
        base = _core_aten_decompositions_post_autograd()
        write_text(path, "\n".join(sorted(_name(op) for op in table if op not in base)))
    except (OSError, AttributeError):
        pass
    return table
