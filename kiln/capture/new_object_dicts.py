"""``obj.__dict__`` of an object made in the trace, read-only: a snapshot of its
attributes as a dict (``name in self.__dict__``, as ``torch.distributions`` asks while
validating). Writing through it would have to reach the object, so writes are breaks.
"""
from __future__ import annotations

from kiln.capture import values as V
from kiln.capture.errors import Unsupported

_WRITES = {"__setitem__", "__delitem__", "update", "setdefault", "pop", "popitem", "clear"}


class AttrsDictValue(V.DictValue):
    def call_method(self, tx, name, args, kwargs):
        if name in _WRITES:
            raise Unsupported("K0025", "writing to the __dict__ of an object made in the trace")
        return super().call_method(tx, name, args, kwargs)

    def setitem(self, tx, k, v):
        raise Unsupported("K0025", "writing to the __dict__ of an object made in the trace")


def attrs_dict(ov):
    return AttrsDictValue({k: v for k, v in ov.attrs.items() if v is not V.DELETED})
