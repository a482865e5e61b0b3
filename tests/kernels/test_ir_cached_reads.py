"""The loop IR's cached facts about an expression (kernels/ir.py): the buffers it loads
(``loaded_buffers``, cached on the expression) and its operation count (``op_count``,
stopping past a limit) agree with a walk of the whole DAG; a pickled expression carries
neither cache."""
import pickle

import torch

from kiln.kernels import ir
from kiln.kernels.ir import Affine, Const, Load, Op

F = torch.float32


def _load(buf, k=0, mask=None, gather=()):
    return Load(buf, Affine.var("x0") + k, F, mask, gather)


def _dag(depth):
    """A chain whose every step reuses the previous one twice (a DAG, not a tree)."""
    e = _load("buf1")
    for i in range(depth):
        e = Op("add", (Op("mul", (e, _load(f"buf{i % 3 + 2}", i)), F), e), F)
    return e


def _walked_loads(e):
    return {x.buf for x in ir.walk(e) if isinstance(x, Load)}


def _walked_ops(e):
    return sum(1 for x in ir.walk(e) if isinstance(x, Op))


def test_loaded_buffers_are_the_walks():
    idx = Op("to_int", (_load("buf9"),), torch.int64)
    exprs = [_dag(0), _dag(5), _dag(40), Const(1.0, F),
             _load("buf7", mask=Op("lt", (_load("buf8"), Const(0.0, F)), torch.bool)),
             _load("buf5", gather=((idx, 4),))]
    for e in exprs:
        first = ir.loaded_buffers(e)
        assert first == _walked_loads(e)
        assert ir.loaded_buffers(e) is first          # cached on the expression
    assert ir.loaded_buffers(exprs[-2]) == {"buf7", "buf8"}
    assert ir.loaded_buffers(exprs[-1]) == {"buf5", "buf9"}


def test_buffer_reads_are_fresh_sets():
    b = ir.Pointwise("buf20", (4,), (1,), F, body=_dag(3))
    r = b.reads()
    r.add("other")
    assert b.reads() == {"buf1", "buf2", "buf3", "buf4"}
    b.body = _load("buf11")          # a new body: its own reads
    assert b.reads() == {"buf11"}


def test_op_count_with_a_limit():
    for depth in (0, 1, 7, 60):
        e = _dag(depth)
        n = _walked_ops(e)
        assert ir.op_count(e) == n == 2 * depth
        for limit in (0, 5, 96, 200):
            got = ir.op_count(e, limit)
            assert got == (n if n <= limit else limit + 1), (depth, limit, got)


def test_pickled_expressions_carry_no_cache():
    e = _dag(6)
    hash(e)
    ir.loaded_buffers(e)
    assert "_h" in e.__dict__ and "_reads" in e.__dict__
    state = e.__getstate__()
    assert "_h" not in state and "_reads" not in state
    back = pickle.loads(pickle.dumps(e))
    assert "_reads" not in back.__dict__
    assert back == e and ir.loaded_buffers(back) == ir.loaded_buffers(e)
