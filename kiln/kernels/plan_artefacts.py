"""A plan's artefacts (``compile.plan``): a dict whose printed forms of the IR and the
schedule are made on first read. Tests and the output_code log read them; a new size of
a symbolic graph planned with logs off never does, and printing every buffer's
expression was a tenth of its host cost."""
from __future__ import annotations


class Artefacts(dict):
    """``dict`` plus ``lazy`` (key -> a function making the value), each made at its
    key's first read (``[]``, ``get``, ``in``, iteration) and kept; pickled (the
    graph cache) and copied as a plain dict with every value made."""

    def __init__(self, items: dict, lazy: dict):
        super().__init__(items)
        self._lazy = dict(lazy)

    def _make_all(self):
        for k in list(self._lazy):
            self[k] = self._lazy.pop(k)()
        return self

    def __missing__(self, key):
        make = self._lazy.pop(key, None)
        if make is None:
            raise KeyError(key)
        v = self[key] = make()
        return v

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __contains__(self, key):
        return dict.__contains__(self, key) or key in self._lazy

    def __iter__(self):
        return iter(dict(self._make_all()))

    def keys(self):
        return dict.keys(self._make_all())

    def values(self):
        return dict.values(self._make_all())

    def items(self):
        return dict.items(self._make_all())

    def __len__(self):
        return dict.__len__(self) + len(self._lazy)

    def __eq__(self, other):
        return dict.__eq__(self._make_all(), other)

    __hash__ = None

    def __repr__(self):
        return dict.__repr__(self._make_all())

    def copy(self):
        return dict(self._make_all())

    def __reduce__(self):
        return dict, (dict(self._make_all()),)
