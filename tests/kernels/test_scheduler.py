"""Scheduler rules on hand-built loop IR: one-element buffers hoisted after their inputs
(``hoist_scalars``), and outputs joining an earlier kernel they share a read with
(``_sibling_group``)."""
import torch

from kiln.kernels import ir
from kiln.kernels.ir import Load, linear_index, loop_vars
from kiln.kernels.ops import const, op
from kiln.kernels.scheduler import hoist_scalars, schedule

F32 = torch.float32


def _inp(name, sizes, pos):
    return ir.Input(name, sizes, ir.contiguous_strides(sizes), F32, position=pos)


def _pw(name, sizes, *reads):
    """A pointwise buffer summing ``reads`` (each (name, sizes): full-size or 0-d)."""
    idx = loop_vars(sizes)
    body = const(1.0, F32)
    for buf, rs in reads:
        load = Load(buf, linear_index(idx, ir.contiguous_strides(rs)) if rs else
                    linear_index([], ()), F32)
        body = op("add", body, load)
    return ir.Pointwise(name, sizes, ir.contiguous_strides(sizes), F32, body=body)


def test_a_scalar_moves_up_to_just_after_what_it_reads():
    a, s = _inp("a", (4, 5), 0), _inp("s", (), 1)
    big1, big2 = _pw("b1", (4, 5), ("a", (4, 5))), _pw("b2", (6,), )
    s1 = _pw("s1", (), ("s", ()))                   # reads an input only: to the front
    s2 = _pw("s2", (), ("b1", (4, 5)))              # reads b1: right after it
    order = [b.name for b in hoist_scalars([a, s, big1, big2, s1, s2])]
    assert order == ["a", "s", "s1", "b1", "s2", "b2"]


def test_a_scalar_never_moves_above_a_library_call():
    a, s = _inp("a", (4,), 0), _inp("s", (), 1)
    ext = ir.Extern("e", (4,), (1,), F32, op=torch.ops.aten.cumsum.default,
                    args=(ir.ExternArg("a", (4,), (1,), 0), 0))
    big = _pw("b", (4,), ("e", (4,)))
    s1 = _pw("s1", (), ("s", ()))
    order = [b.name for b in hoist_scalars([a, s, ext, big, s1])]
    assert order == ["a", "s", "e", "s1", "b"]


def _group_of(sched, name):
    return next(i for i, g in enumerate(sched.groups) if name in g.names)


def test_an_output_joins_the_earlier_kernel_reading_the_same_input():
    """Two lists of per-tensor ops: each tensor's second result joins its first's
    kernel (one read of ``x`` and ``y``, one kernel each); a result that is not an
    output stays where it is (computing it earlier would hold its memory longer)."""
    x, y = _inp("x", (8,), 0), _inp("y", (3, 3), 1)
    bufs = [x, y, _pw("x1", (8,), ("x", (8,))), _pw("y1", (3, 3), ("y", (3, 3))),
            _pw("x2", (8,), ("x", (8,))), _pw("y2", (3, 3), ("y", (3, 3))),
            _pw("x3", (8,), ("x2", (8,)), ("x1", (8,)))]
    sched = schedule(bufs, {"x1", "y1", "x2", "y2", "x3"})
    assert _group_of(sched, "x2") == _group_of(sched, "x1") == _group_of(sched, "x3")
    assert _group_of(sched, "y2") == _group_of(sched, "y1")
    assert len(sched.groups) == 2
    sched = schedule(bufs, {"x1", "y1", "x3", "y2"})        # x2 is a temporary now
    assert _group_of(sched, "x2") != _group_of(sched, "x1")
