"""``np.random`` calls in a trace (placeholder: filled in below)."""
from __future__ import annotations


def random_rule(fn):
    return None
