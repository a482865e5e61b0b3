"""PyTorch's core-aten decomposition table, rebuilt from a remembered op list.

``torch._decomp.core_aten_decompositions()`` adds to its hand-written table one entry
per CompositeImplicitAutograd op, and finds those ops by materialising and inspecting
every overload of every op namespace: 0.3-0.5 s, paid at every process's first compile.
The ops it finds depend only on the installed PyTorch and on which libraries have
registered CompositeImplicitAutograd kernels, so their names are kept under
``cache_dir``, keyed by PyTorch's version and the dispatcher's list of those
registrations; a later process rebuilds the same table (same keys; each added entry
runs the op's CompositeImplicitAutograd kernel, as PyTorch's does) in microseconds: the
remembered ops are matched by name, resolved to op objects only if the table is
iterated. The list is a sealed cache entry (``disk_cache.read_entry``): a file that
fails its check (garbage, truncated, another entry's) is a miss, rebuilt.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch._ops import OpOverload
from torch._decomp import _core_aten_decompositions_post_autograd, core_aten_decompositions

from kiln.disk_cache import key_of, read_entry, write_entry

FORMAT = 2          # 2: a sealed entry


def _name(op) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def _resolve(name: str):
    qual, _, overload = name.rpartition(".")
    ns, _, op = qual.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


_KIND, _SUFFIX = "decompositions", ".txt"


def _key() -> str:
    regs = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    return key_of(str(FORMAT), torch.__version__, str(torch.version.git_version), *sorted(regs))


class DecompositionTable(Mapping):
    """op -> decomposition, where the remembered CompositeImplicitAutograd ops are kept
    by name and resolved only when asked about (resolving all of them: 60-100 ms at
    every process's first compile); their entry is the op's own ``decompose``."""

    def __init__(self, entries: dict, names=()):
        self._entries = dict(entries)
        self._names = set(names)
        self._all = None

    def __contains__(self, op) -> bool:
        return op in self._entries or (bool(self._names) and isinstance(op, OpOverload)
                                       and _name(op) in self._names)

    def __getitem__(self, op):
        fn = self._entries.get(op)
        if fn is not None:
            return fn
        if op in self:
            return op.decompose
        raise KeyError(op)

    def __setitem__(self, op, fn) -> None:
        self._entries[op] = fn
        self._all = None

    def pop(self, op, default=None):
        self._names.discard(_name(op))
        self._all = None
        return self._entries.pop(op, default)

    def _materialised(self) -> dict:
        if self._all is None:
            self._all = {**{_resolve(n): None for n in sorted(self._names)}, **self._entries}
        return self._all

    def __iter__(self):
        return iter(self._materialised())

    def __len__(self) -> int:
        return len(self._materialised())


def _remembered(key: str) -> DecompositionTable | None:
    found = read_entry(_KIND, key, _SUFFIX)
    if found is None:
        return None
    try:
        names = found[1].decode().split()
        # what PyTorch's table holds for such an op: run its Python
        # CompositeImplicitAutograd kernel if it has one, else the C++ one
        return DecompositionTable(_core_aten_decompositions_post_autograd(), names)
    except (UnicodeDecodeError, AttributeError, ValueError, RuntimeError):
        return None


def core_aten_table() -> DecompositionTable:
    """``core_aten_decompositions()``'s table, from the remembered op list when there is
    one."""
    try:
        key = _key()
    except Exception:                 # noqa: BLE001  (another PyTorch: no shortcut)
        return DecompositionTable(core_aten_decompositions())
    table = _remembered(key)
    if table is not None:
        return table
    table = dict(core_aten_decompositions())
    try:
        base = _core_aten_decompositions_post_autograd()
        names = "\n".join(sorted(_name(op) for op in table if op not in base))
        write_entry(_KIND, key, _SUFFIX, names.encode())
    except (OSError, AttributeError):
        pass
    return DecompositionTable(table)
