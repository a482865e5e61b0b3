"""PYTEST_DONT_REWRITE

Guards on float constants: NaN never equals itself under ``==`` and -0.0 equals 0.0,
but a trace can depend on either (``math.copysign``, ``str``, ``1 / x``). A guard must
hold on the inputs it was traced on (a NaN argument is no internal error) and must tell
the signed zeros apart, for plain floats, complex numbers, items of tuples, dict keys
and sets.
"""
import math

import pytest
import torch

import kiln

from .harness import T, compare

BACKENDS = ["eager", "aot_eager", "kiln"]
NAN = float("nan")


def _check_calls(fn, values, backend="eager"):
    """Each value in turn as ``fn``'s second argument: compiled equals eager (values,
    signs of zeros and NaNs in place), with no internal error. Returns the number of
    entries compiled."""
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    try:
        for v in values:
            x = T(3)
            e, c = fn(x, v), compiled(x, v)
            compare(e, c, f"value {v!r}")
            for a, b in zip(e if isinstance(e, tuple) else (e,), c if isinstance(c, tuple) else (c,)):
                assert torch.equal(torch.signbit(a), torch.signbit(b)), (v, a, b)
        return len(compiled.entries)
    finally:
        kiln.reset()


def _scale(x, s):
    return x * s, x + s


def _sign(x, s):
    return x * math.copysign(1.0, s)


def _sign_of_text(x, s):
    return x + (1.0 if str(s).startswith("-") else 2.0)


def _sign_of_item(x, t):
    return x * math.copysign(1.0, t[0])


def _sign_of_key(x, d):
    return x * math.copysign(1.0, next(iter(d))) + len(d)


def _sign_of_imag(x, c):
    return x * math.copysign(1.0, c.imag) + c.real


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_argument_is_no_internal_error(backend):
    # fuzz seeds 1095, 1221: "fresh guards fail on the traced inputs: L['s'] == nan"
    assert _check_calls(_scale, [NAN, float("nan"), 1.0, NAN], backend) == 2  # NaN (any), 1.0


def test_nan_inside_containers_and_after_a_break():
    def after_break(x, s):
        kiln.graph_break()
        return x * s
    _check_calls(_sign_of_item, [(NAN,), (float("nan"),)])
    _check_calls(_sign_of_imag, [complex(NAN, 1.0), complex(NAN, 1.0)])
    _check_calls(after_break, [NAN, float("nan")])


@pytest.mark.parametrize("fn,values", [
    (_sign, [0.0, -0.0, 0.0]),
    (_sign_of_text, [-0.0, 0.0]),
    (_sign_of_item, [(0.0,), (-0.0,)]),
    (_sign_of_key, [{0.0: 1}, {-0.0: 1}]),
    (_sign_of_key, [frozenset([0.0]), frozenset([-0.0])]),
    (_sign_of_key, [{0.0}, {-0.0}]),
    (_sign_of_imag, [complex(1.0, 0.0), complex(1.0, -0.0)]),
])
def test_signed_zeros_are_told_apart(fn, values):
    _check_calls(fn, values)


def test_signed_zero_scalar_in_the_graph():
    for backend in BACKENDS:
        _check_calls(_scale, [0.0, -0.0, float("inf"), -float("inf"), -0.0], backend)


def test_dict_with_infinite_and_nan_keys():
    def f(x, d):
        return x + sum(d.values())
    _check_calls(f, [{float("inf"): 1.0, -float("inf"): 2.0}, {float("inf"): 3.0, -float("inf"): 2.0}])
    _check_calls(f, [{NAN: 1.0}, {float("nan"): 2.0}])
