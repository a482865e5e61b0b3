"""kiln/shapes alone: symbols, what the ranges decide, guards kept and printed."""
import pytest
import sympy
import torch

from kiln.capture.fake import FakeMode, FakeTensor
from kiln.shapes.env import ShapeEnv, SpecializedMarkedDim
from kiln.shapes.printing import to_python


def _env(hint=6, marked=False):
    env = ShapeEnv()
    s = env.new_symbol("x.size(0)", "L['x'].size(0)", hint, marked=marked)
    return env, s


def _guards(env):
    names = {i.symbol: i.expr for i in env.symbols.values()}
    return [to_python(g, names) for g, _ in env.final_guards()]


def _fake(s, *rest):
    sizes = (s,) + rest
    strides, acc = [], 1
    for n in reversed(sizes):
        strides.append(acc)
        acc = acc * n
    return FakeTensor(torch.empty_strided(sizes, tuple(reversed(strides)), device="meta"),
                      torch.device("cpu"))


def test_symbol_arithmetic_keeps_hint_and_expression():
    env, s = _env()
    assert str(s * 2 + 1) == "2*s0 + 1"
    assert (s // 2).node.hint == 3 and (s % 4).node.hint == 2
    assert _guards(env) == ["2 <= x.size(0)"]


def test_a_comparison_the_ranges_decide_is_not_a_guard():
    env, s = _env()
    assert bool(s != 1) and bool(s >= 2) and not bool(s == 0)
    assert _guards(env) == ["2 <= x.size(0)"]


def test_a_bound_narrows_the_range_and_prints_once():
    env, s = _env()
    assert bool(s > 4)
    assert bool(s <= 4096)
    assert not bool(s > 5000)       # implied now
    assert _guards(env) == ["5 <= x.size(0) <= 4096"]


def test_relation_guard_is_canonical_and_readable():
    env, s = _env()
    with FakeMode():
        y = _fake(s, 4).view(s // 2, 8)
    assert tuple(y.shape)[1] == 8
    assert "(x.size(0) % 2) == 0" in _guards(env)


def test_int_specialises_with_an_equality_guard():
    env, s = _env()
    assert int(s) == 6
    assert _guards(env) == ["x.size(0) == 6"]
    assert env.simplify(s.node.expr + 1) == 7


def test_marked_symbol_fixed_by_the_trace_is_an_error():
    env, s = _env(marked=True)
    assert list(range(s)) == list(range(6))
    with pytest.raises(SpecializedMarkedDim, match="marked dynamic"):
        env.check_marks()


def test_two_symbols_found_equal_become_one():
    env, s = _env()
    t = env.new_symbol("y.size(0)", "L['y'].size(0)", 6)
    with FakeMode():
        r = _fake(s, 3) + _fake(t, 3)
    assert str(r.shape[0]) in ("s0", "s1")
    assert "y.size(0) == x.size(0)" in _guards(env) or "x.size(0) == y.size(0)" in _guards(env)


@pytest.mark.parametrize("op,shape", [
    (lambda t, s: t[: s // 2], "[FloorDiv(s0, 2), 4]"),
    (lambda t, s: torch.nn.functional.pad(t, (0, 0, 1, 1)), "[s0 + 2, 4]"),
    (lambda t, s: torch.cat([t, t]), "[2*s0, 4]"),
    (lambda t, s: torch.nn.functional.layer_norm(t, (4,)), "[s0, 4]"),
    (lambda t, s: torch.softmax(t, -1), "[s0, 4]"),
    (lambda t, s: t @ torch.ones(4, 3), "[s0, 3]"),
    (lambda t, s: t.t().reshape(-1), "[4*s0]"),
    (lambda t, s: t + torch.ones(4), "[s0, 4]"),
    (lambda t, s: torch.ones(s, s).triu(1), "[s0, s0]"),
])
def test_meta_kernels_compute_symbolic_result_sizes(op, shape):
    env, s = _env()
    with FakeMode():
        r = op(_fake(s, 4), s)
    assert str(list(r.shape)).replace(" ", "") == shape.replace(" ", "")
    assert _guards(env) == ["2 <= x.size(0)"]


def test_printing_uses_python_operators():
    env, s = _env()
    e = s.node.expr
    from kiln.shapes.exprs import FloorDiv
    g = sympy.And(sympy.Le(2, e), sympy.Le(e, 9))
    assert to_python(g, {e: "n"}) == "2 <= n <= 9"
    assert to_python(sympy.Eq(sympy.Mod(FloorDiv(e, 2), 3), 0), {e: "n"}) == "((n // 2) % 3) == 0"


def test_an_expression_found_constant_simplifies_later_guards():
    env, s = _env(hint=3)
    with FakeMode():
        y = _fake(s, 3).view(s // 2, -1)     # s // 2 == 1 here: the -1 is 3 * s
    assert str(y.shape[0]) == "FloorDiv(s0, 2)"
    assert _guards(env) == ["2 <= x.size(0)", "(x.size(0) // 2) == 1"]


def test_shape_arithmetic_memo_keeps_operand_types():
    """The memo of shape arithmetic (``node._expr``) is keyed by operand types too: an
    int and a float (or a sympy Integer and Float) that compare equal make different
    expressions, and each gets its own."""
    import operator

    import sympy

    from kiln.shapes import node
    s = sympy.Symbol("s_memo", integer=True, positive=True)
    a = node._expr(operator.add, s, 2)
    b = node._expr(operator.add, s, 2.0)
    c = node._expr(operator.add, s, sympy.Float(2.0))
    assert a == s + 2 and a.args and all(not t.is_Float for t in a.args)
    assert any(t.is_Float for t in b.args) and any(t.is_Float for t in c.args)
    assert node._expr(operator.add, s, 2) is a          # a hit: the same object
