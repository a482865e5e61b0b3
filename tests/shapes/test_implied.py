"""shapes/implied.py: relations the ranges and known guards imply are shown, and no
relation some admitted size breaks ever is."""
import sympy
import pytest

from kiln.shapes.env import ShapeEnv
from kiln.shapes.exprs import FloorDiv
from kiln.shapes.implied import implied


def _env(n=3, int_arg=False):
    env = ShapeEnv()
    syms = [env.new_symbol(f"x.size({i})", f"x.size({i})", 4 + i).node.expr for i in range(n)]
    if int_arg:
        syms.append(env.new_symbol("n", "n", 5, is_int=True, lo=None).node.expr)
    return env, syms


def test_products_of_sizes_are_ordered():
    env, (a, b, c) = _env()
    assert implied(sympy.Lt(b * c, a * b * c), env)
    assert implied(sympy.Ge(a * b * c, 8), env)
    assert implied(sympy.Le(2 * FloorDiv(a, 2), a), env)
    assert implied(sympy.Ne(sympy.Mod(1, b), 0), env)


@pytest.mark.parametrize("rel", [
    lambda a, b, c: sympy.Lt(a, 3),                    # a == 3 breaks it... and a == 2 holds
    lambda a, b, c: sympy.Ne(a, 3),
    lambda a, b, c: sympy.Eq(a, 4),
    lambda a, b, c: sympy.Lt(2 * FloorDiv(a, 2), a),   # an even a breaks it
    lambda a, b, c: sympy.Gt(a, b),
    lambda a, b, c: sympy.Ne(a * b, 6),
])
def test_what_some_size_breaks_is_not_implied(rel):
    env, (a, b, c) = _env()
    assert not implied(rel(a, b, c), env)


def test_known_guards_count():
    env, (a, b, c) = _env()
    known = [sympy.Ne(FloorDiv(a, 2), 1)]                # a is neither 2 nor 3
    assert implied(sympy.Ne(a, 3), env, known)
    assert not implied(sympy.Ne(a, 5), env, known)
    eq = sympy.Eq(a * b * c, 2 * a * b * FloorDiv(b, 2))  # c == 2 * (b // 2)
    assert implied(sympy.Ge(c, FloorDiv(b, 2)), env, [eq])
    assert implied(sympy.Ne(c, FloorDiv(b, 2)), env, [eq])
    assert not implied(sympy.Eq(c, b), env, [eq])


def test_int_arguments_have_no_lower_bound():
    env, (a, b, c, n) = _env(int_arg=True)
    assert not implied(sympy.Gt(n, 0), env)
    env.symbols[n].lo = 1
    assert implied(sympy.Ge(FloorDiv(3 * a, n), 0), env)
