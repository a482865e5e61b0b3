"""Which tensors eager's autograd saves for the backward: the ones whose later in-place
writes make eager's backward fail.

Eager's backward checks the version of every tensor it saved: write one in place after
the forward (``x.add_(1)`` after ``y = x.sin()``, which saves ``x``; not after ``y =
x.exp()``, which saves ``y``) and the backward through it raises "modified by an
inplace operation". A
compiled graph saves what its partitioner chose, which may be an input eager never
saved (the partitioner recomputes ``x * 2`` from ``x`` rather than keep it): a later
write to ``x``, fine in eager, would fail the compiled backward. So the trace asks,
before differentiating, which storages eager's own autograd graph saves a tensor of
(``saved_storages``); a value the compiled backward would keep of a storage the user
can write after the call (an input's, an output's) that eager does not save is saved
as a copy (``partition``'s ``copied``), and the partitioner avoids keeping those. The
other way round, such a storage eager does save is a *witness*: its version is checked
when a backward from an output whose history saves it runs (``runtime``), so that the
compiled backward fails where eager's does, whatever the partitioner kept. A value the compiled
backward keeps of a witnessed output is saved through an alias with a version counter
of its own (``Witnesses.unversioned``): PyTorch checks every saved tensor of a node
when any backward of it reads one, so a write to that output would fail backwards
eager runs without it; the witnesses raise where eager does instead, and a backward
that would read the written value raises too (``check_reads``).
"""
from __future__ import annotations

import weakref

import torch

_names: dict[type, tuple] = {}


def _saved_names(node_type: type) -> tuple:
    """The attributes a node of this type exposes its saved tensors under."""
    names = _names.get(node_type)
    if names is None:
        names = _names[node_type] = tuple(
            a for a in dir(node_type)
            if a.startswith("_saved_") or a == "saved_tensors")
    return names


def storage_of(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (shared by its views), as ``saved_storages``
    gives them."""
    return t.untyped_storage()._cdata


def saved_storages(roots, among) -> list[frozenset]:
    """Per tensor of ``roots``, the storages (of those in ``among``) of the tensors
    eager's autograd saved in the graph its backward runs, walking that graph."""
    own: dict = {}            # node -> the storages it saved, of those in ``among``
    memo: dict = {}           # node -> the storages saved at or below it

    def saved_by(node) -> frozenset:
        found = set()
        for name in _saved_names(type(node)):
            try:
                value = getattr(node, name)
            except RuntimeError:      # modified in place already: the backward says so
                continue
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, torch.Tensor) and storage_of(v) in among:
                    found.add(storage_of(v))
        return frozenset(found)

    def below(root) -> frozenset:
        if root is None:
            return frozenset()
        if root in memo:
            return memo[root]
        found, stack, seen = set(), [root], {root}
        while stack:                       # iterative: graphs are deep
            node = stack.pop()
            if node is not root and node in memo:
                found |= memo[node]
                continue
            if node not in own:
                own[node] = saved_by(node)
            found |= own[node]
            for nxt, _ in node.next_functions:
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        memo[root] = frozenset(found)
        return memo[root]

    return [below(t.grad_fn) for t in roots]


class Witnesses:
    """One call's witnesses: the tensors the user holds (inputs, outputs) of storages
    eager saved, each with the differentiable outputs whose backward reads it, and its
    version once the call is over (``settle``); ``check`` raises as eager's backward
    would where one has been written since."""

    def __init__(self):
        self.items: list = []
        self.versions = None
        #: forward saved-value position -> the witness whose storage it is saved from
        #: through a version-free alias (``unversioned``)
        self.aliased: dict[int, int] = {}

    def unversioned(self, saved: tuple, outputs) -> tuple:
        """``saved`` with each value sharing a witnessed output's storage (``outputs``:
        (witness index, output)) replaced by an alias of its own version counter: the
        user may write that output after the call, and PyTorch would then refuse every
        backward of the node, also those eager runs without reading it; the witnesses
        raise where eager does, ``check_reads`` where a backward would read it."""
        ptrs = {t.untyped_storage().data_ptr(): j for j, t in outputs
                if t.untyped_storage().data_ptr()}
        if not ptrs:
            return saved
        saved = list(saved)
        for k, v in enumerate(saved):
            j = ptrs.get(v.untyped_storage().data_ptr()) if isinstance(v, torch.Tensor) \
                else None
            if j is not None:
                with torch.no_grad():
                    saved[k] = torch.empty(0, dtype=v.dtype, device=v.device).set_(
                        v.untyped_storage(), v.storage_offset(), v.size(), v.stride())
                self.aliased[k] = j
        return tuple(saved)

    def watch(self, tensors_and_deps):
        self.items = [(weakref.ref(t), deps) for t, deps in tensors_and_deps]

    def settle(self):
        self.versions = [None if (t := ref()) is None else t._version
                         for ref, _ in self.items]

    def check_reads(self, positions):
        """Raise where a backward reads a saved value (``positions`` in the forward's
        saved values) aliasing a witnessed output written since the call: eager's
        backward would not have read it, but its value is no longer the one saved."""
        if self.versions is None or not self.aliased:
            return
        for k in positions:
            j = self.aliased.get(k)
            if j is None:
                continue
            t, version = self.items[j][0](), self.versions[j]
            if t is not None and version is not None and t._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been "
                    f"modified by an inplace operation: [{t.type()} {list(t.shape)}], is "
                    f"at version {t._version}; expected version {version} instead "
                    "(kiln: an output its compiled backward reads)")

    def check(self, present: set):
        """``present``: positions (in ``TraceResult.differentiable``) of the outputs
        this backward runs from."""
        if self.versions is None:
            return
        for (ref, deps), version in zip(self.items, self.versions):
            t = ref()
            if t is not None and version is not None and deps & present and \
                    t._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been "
                    f"modified by an inplace operation: [{t.type()} {list(t.shape)}], is "
                    f"at version {t._version}; expected version {version} instead "
                    "(kiln: a tensor eager's autograd saved)")
