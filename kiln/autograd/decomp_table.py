"""PyTorch's core-aten decomposition table, rebuilt from a remembered op list.

``torch._decomp.core_aten_decompositions()`` adds to its hand-written table one entry
per CompositeImplicitAutograd op, and finds those ops by materialising and inspecting
every overload of every op namespace: 0.3-0.5 s, paid at every process's first compile.
The ops it finds depend only on the installed PyTorch and on which libraries have
registered CompositeImplicitAutograd kernels, so their names are kept under
``cache_dir``, keyed by PyTorch's version and the dispatcher's list of those
registrations; a later process rebuilds the same table (same keys, the same
``_get_decomp_for_cia`` entries) in milliseconds. Any name that no longer resolves
means a full rebuild.
"""
from __future__ import annotations

import hashlib
import os

import torch
from torch._decomp import _core_aten_decompositions_post_autograd, core_aten_decompositions

from kiln import config

FORMAT = 1


def _name(op) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def _resolve(name: str):
    qual, _, overload = name.rpartition(".")
    ns, _, op = qual.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def _path() -> str:
    regs = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    h = hashlib.sha256()
    for part in (str(FORMAT), torch.__version__, str(torch.version.git_version),
                 *sorted(regs)):
        h.update(part.encode() + b"\0")
    return os.path.join(config.cache_dir, "decompositions", h.hexdigest()[:32] + ".txt")


def _remembered(path: str) -> dict | None:
    from torch._export.utils import _get_decomp_for_cia
    try:
        with open(path) as f:
            names = f.read().split()
        table = dict(_core_aten_decompositions_post_autograd())
        for n in names:
            op = _resolve(n)
            table[op] = _get_decomp_for_cia(op)
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
        names = sorted(_name(op) for op in table if op not in base)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write("\n".join(names))
        os.replace(tmp, path)
    except (OSError, AttributeError):
        pass
    return table
