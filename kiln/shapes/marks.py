"""The user's marks on a tensor's dims: ``kiln.mark_dynamic`` (symbolic from the first
trace; the trace fixing it is an error), ``kiln.maybe_mark_dynamic`` (symbolic, fixing
it allowed) and ``kiln.mark_static`` (never symbolic). Kept on the tensor itself, as
PyTorch's own marks are, so they follow the tensor and go with it."""
from __future__ import annotations


def _dims(dim):
    return list(dim) if isinstance(dim, (list, tuple)) else [dim]


def _norm(t, d):
    n = t.dim()
    if not -n <= d < n:
        raise IndexError(f"dim {d} out of range for a tensor of {n} dims")
    return d % n


def mark_dynamic(t, dim, min=None, max=None):   # noqa: A002  (torch's argument names)
    marks = t.__dict__.setdefault("_kiln_dynamic", {})
    for d in _dims(dim):
        marks[_norm(t, d)] = (min, max)


def maybe_mark_dynamic(t, dim):
    marks = t.__dict__.setdefault("_kiln_maybe_dynamic", set())
    for d in _dims(dim):
        marks.add(_norm(t, d))


def mark_static(t, dim=None):
    marks = t.__dict__.setdefault("_kiln_static", set())
    for d in (range(t.dim()) if dim is None else _dims(dim)):
        marks.add(_norm(t, d))


def marked(t):
    """(dynamic {dim: (min, max)}, maybe-dynamic dims, static dims) of ``t``."""
    d = getattr(t, "__dict__", {})
    return d.get("_kiln_dynamic", {}), d.get("_kiln_maybe_dynamic", set()), d.get("_kiln_static", set())
