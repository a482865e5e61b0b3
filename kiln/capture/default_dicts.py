"""``collections.defaultdict`` during a trace: a dict Value whose missing keys, read by
``d[k]``, call its factory and store the result (``__missing__``), as eager's does.

Both kinds come here: one made in the trace (``defaultdict(list)``,
``defaultdict(lambda: defaultdict(list))`` in ``Optimizer.zero_grad``) and a real one
read from a source (its factory read, and guarded, through ``d.default_factory``).
"""
from __future__ import annotations

import collections

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.rule_tables import BUILTINS


class DefaultDictValue(V.DictValue):
    def __init__(self, items: dict, factory, source=None):
        super().__init__(items, source, cls=collections.defaultdict)
        self.factory = factory  # a Value: a class, a function, or the constant None

    def getitem(self, tx, k):
        key = k.const()
        if key in self.items or _is_none(self.factory):
            return super().getitem(tx, k)
        value = self.factory.call(tx, [], {})
        self.setitem(tx, k, value)
        return value

    def call_method(self, tx, name, args, kwargs):
        if name == "copy" and not args and not kwargs:
            return DefaultDictValue(dict(self.items), self.factory)
        if name == "__missing__":
            raise Unsupported("K0019", "calling defaultdict.__missing__ directly")
        return super().call_method(tx, name, args, kwargs)

    def getattr(self, tx, name):
        if name == "default_factory":
            return self.factory
        return super().getattr(tx, name)

    def factory_expr(self, cg) -> str:
        """The factory as source text, for the entry code that rebuilds this dict."""
        return cg.expr(self.factory)

    def __repr__(self):
        return f"DefaultDict({self.factory}, {self.items})"


_is_none = V.is_none


def construct(tx, factory=None, *args, **kwargs):
    """``defaultdict(factory, [items], **kw)`` made in the trace."""

    factory = factory if factory is not None else V.ConstantValue(None)
    items = BUILTINS[dict](tx, *args, **kwargs).items if (args or kwargs) else {}
    return DefaultDictValue(items, factory)


BUILTINS[collections.defaultdict] = construct


@V.rule(name="defaultdict_wrap_real")
def wrap_real(tx, obj, items, source):
    """The Value of a real defaultdict read from ``source`` (its items already wrapped)."""
    from kiln.capture.builder import wrap
    from kiln.capture.sources import AttrSource

    factory = wrap(tx, obj.default_factory, AttrSource(source, "default_factory") if source else None)
    return DefaultDictValue(items, factory, source)
