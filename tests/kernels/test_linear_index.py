"""``ir.linear_index`` (one pass over the dims) against the sum of ``Affine`` terms it
replaces, on random indices and strides (negative, zero, size-1 dims' constants)."""
import random

from kiln.kernels.ir import Affine, linear_index


def _by_terms(idx, strides):
    out = Affine()
    for i, s in zip(idx, strides):
        out = out + i * s
    return out


def test_linear_index_is_the_sum_of_its_terms():
    r = random.Random(0)
    for _ in range(5000):
        n = r.randint(0, 5)
        idx = [Affine(tuple(sorted({f"x{r.randint(0, 4)}": r.randint(-3, 3) or 1
                                    for _ in range(r.randint(0, 3))}.items())), r.randint(-5, 5))
               for _ in range(n)]
        strides = [r.randint(-4, 100) for _ in range(n)]
        got = linear_index(idx, strides)
        assert got == _by_terms(idx, strides), (idx, strides)
        assert all(k != 0 for _, k in got.terms)


def test_cancelling_terms_leave_none():
    x = Affine.var("x0")
    assert linear_index([x, x], [3, -3]) == Affine()
