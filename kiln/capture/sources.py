"""Sources: where a traced value came from, as an expression over the frame's inputs.

Every value the interpreter reads from outside the frame knows its source, so that a
guard can re-read it on the next call and the generated code can fetch it again. A
source renders as Python source text in the namespace of the generated entry function:
the frame's arguments are plain parameters there, ``__G`` is the function's globals,
``__B`` its builtins and ``__closure`` its closure cells.
"""
from __future__ import annotations

import keyword
from dataclasses import dataclass


class Source:
    def expr(self) -> str:
        raise NotImplementedError

    def pretty(self) -> str:
        """The name a user recognises, for messages."""
        return self.expr()

    def __str__(self):
        return self.pretty()


@dataclass(frozen=True)
class LocalSource(Source):
    name: str

    def expr(self):
        return self.name

    def pretty(self):
        return f"L[{self.name!r}]"


@dataclass(frozen=True)
class GlobalSource(Source):
    name: str

    def expr(self):
        return f"__G[{self.name!r}]"

    def pretty(self):
        return f"G[{self.name!r}]"


@dataclass(frozen=True)
class BuiltinSource(Source):
    name: str

    def expr(self):
        return f"__B[{self.name!r}]"


@dataclass(frozen=True)
class ClosureSource(Source):
    """A free variable of the compiled function itself."""

    index: int
    name: str

    def expr(self):
        return f"__closure[{self.index}].cell_contents"

    def pretty(self):
        return f"closure[{self.name!r}]"


@dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    attr: str

    def expr(self):
        if self.attr.isidentifier() and not keyword.iskeyword(self.attr):
            return f"{self.base.expr()}.{self.attr}"
        return f"getattr({self.base.expr()}, {self.attr!r})"

    def pretty(self):
        return f"{self.base.pretty()}.{self.attr}"


@dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: object  # an int or a str (or another hashable constant)

    def expr(self):
        return f"{self.base.expr()}[{_literal(self.key)}]"

    def pretty(self):
        return f"{self.base.pretty()}[{self.key!r}]"


def _literal(key) -> str:
    """``key`` as source text: ``repr``, except for infinite floats (``inf`` is no
    Python name)."""
    if type(key) is float and key in (float("inf"), float("-inf")):
        return f"float('{key!r}')"
    return repr(key)


@dataclass(frozen=True)
class FuncCellSource(Source):
    """A closure cell of a function value: ``fn.__closure__[i].cell_contents``."""

    fn: Source
    index: int

    def expr(self):
        return f"{self.fn.expr()}.__closure__[{self.index}].cell_contents"


@dataclass(frozen=True)
class DefaultSource(Source):
    fn: Source
    index: object  # int for __defaults__, str for __kwdefaults__

    def expr(self):
        if isinstance(self.index, int):
            return f"{self.fn.expr()}.__defaults__[{self.index}]"
        return f"{self.fn.expr()}.__kwdefaults__[{self.index!r}]"


@dataclass(frozen=True)
class RefSource(Source):
    """An object kept by reference in the entry namespace (a module's globals dict)."""

    name: str

    def expr(self):
        return self.name
