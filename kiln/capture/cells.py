"""Closure cells of real functions, as the trace reads and writes them.

A real cell is one mutable object: every function closing over it (the compiled
function, a global closure called twice, two closures of one factory) must see the
trace's writes to it. ``real_cell`` hands out one ``RealCell`` per cell per trace, so
a second call of a counter reads the first call's write, as eager does.
"""
from __future__ import annotations

import torch

from kiln.capture import values as V
from kiln.capture.builder import wrap, wrap_static
from kiln.capture.errors import Unsupported, UserException


class RealCell:
    """A closure cell of a real function, read and written through its source."""

    def __init__(self, cell, source):
        self.cell = cell
        self.source = source
        self.written = None

    def read(self, tx):
        if self.written is not None:
            return self.written
        try:
            obj = self.cell.cell_contents
        except ValueError:
            raise UserException(V.ExceptionValue(NameError, [V.ConstantValue("free variable referenced before assignment")]))
        if self.source is None:
            if isinstance(obj, torch.Tensor) or type(obj) in (list, dict, set):
                raise Unsupported("K0026", "a tensor or mutable container in a closure kiln cannot re-read")
            try:
                return wrap_static(obj)
            except Unsupported:
                return wrap(tx, obj, None)
        return wrap(tx, obj, self.source)

    def write(self, tx, value):
        if self.source is None:
            raise Unsupported("K0026", "writing a closure cell kiln cannot re-read")
        self.written = value
        tx.output.mark_mutated(self)


def real_cell(output, cell, source) -> RealCell:
    """The one RealCell of ``cell`` in this trace (its functions are guarded by
    identity, so the cell reached through any of them is the same object at run time)."""
    known = output.real_cells.get(id(cell))
    if known is None:
        known = output.real_cells[id(cell)] = RealCell(cell, source)
        output._keepalive.append(cell)
    elif known.source is None and source is not None:
        known.source = source
    return known
