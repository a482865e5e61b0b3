"""PYTEST_DONT_REWRITE

State the program shares with the world and mutates through more than one name: a
closure cell reached through several calls or several functions, and mutable objects
that may be one object at run time although the trace saw two (or two although it saw
one). Eager and compiled runs each get their own fresh copy of the program (a factory
makes its functions, cells and globals) and are compared call by call, state included.
"""
import functools

import pytest
import torch

import kiln

from .harness import T, compare

BACKENDS = ["eager", "aot_eager", "kiln"]
backends = pytest.mark.parametrize("backend", BACKENDS)


def _same_as_eager(make, backend, inputs, calls=2):
    """``make()`` -> (prog, state): a fresh program and a function reading its state.
    ``inputs(i)`` -> the positional arguments of call ``i`` (built twice: eager and
    compiled runs get equal, separate ones)."""
    e_prog, e_state = make()
    c_prog, c_state = make()
    kiln.reset()
    compiled = kiln.compile(c_prog, backend=backend)
    try:
        for i in range(calls):
            torch.manual_seed(i)
            e_args = inputs(i)
            torch.manual_seed(i)
            c_args = inputs(i)
            compare(e_prog(*e_args), compiled(*c_args), f"call {i}: out")
            compare(e_state(), c_state(), f"call {i}: state")
            compare(list(e_args), list(c_args), f"call {i}: args")
    finally:
        kiln.reset()


def _x(i):
    return (T(3),)


# --- closure cells: one real cell, one value in the trace ------------------------------

def _counter():
    n = 0

    def step(t):
        nonlocal n
        n += 1
        return t * n
    return step


def _make_counter_loop():
    """A global closure counter called twice, its result unused (fuzz seed 1225)."""
    c = _counter()

    def prog(x, alpha=0.5):
        if alpha > 1:
            kiln.graph_break()
        for _ in range(2):
            c(x)
        return c(x) + 1
    return prog, lambda: c.__closure__[0].cell_contents


def _make_counter_pair():
    """Two closures of one factory share one cell: the reader sees the writer's calls."""
    n = 0

    def inc():
        nonlocal n
        n += 1

    def get():
        return n

    def prog(x):
        inc()
        inc()
        return x + get()
    return prog, get


def _make_root_closure():
    """The compiled function is itself a closure writing the cell its callees write."""
    n = 0

    def inc():
        nonlocal n
        n += 1

    def prog(x):
        nonlocal n
        inc()
        inc()
        n += 10
        inc()
        return x * n
    return prog, lambda: n


def _make_counter_through_containers():
    """The same counter reached through a dict, an attribute, a partial and a
    generator."""
    c = _counter()
    holder = type("Holder", (), {})()
    holder.f = c
    table = {"f": c}
    part = functools.partial(c)

    def gen(x):
        for _ in range(2):
            yield c(x)

    def prog(x):
        table["f"](x)
        holder.f(x)
        part(x)
        return sum(gen(x))
    return prog, lambda: c.__closure__[0].cell_contents


def _make_counter_across_breaks():
    c = _counter()

    def prog(x):
        c(x)
        kiln.graph_break()
        for _ in range(2):
            c(x)
            kiln.graph_break()
        return c(x)
    return prog, lambda: c.__closure__[0].cell_contents


@backends
@pytest.mark.parametrize("make", [_make_counter_loop, _make_counter_pair, _make_root_closure,
                                  _make_counter_through_containers, _make_counter_across_breaks])
def test_closure_cell_written_by_every_call(make, backend):
    _same_as_eager(make, backend, _x)


def test_closure_cell_passed_as_an_argument():
    def make():
        c = _counter()

        def prog(x, f):
            f(x)
            f(x)
            return x
        return prog, lambda: c.__closure__[0].cell_contents, c
    e_prog, e_state, e_c = make()
    c_prog, c_state, c_c = make()
    compiled = kiln.compile(c_prog, backend="eager")
    for _ in range(2):
        x = T(3)
        compare(e_prog(x, e_c), compiled(x, c_c))
        assert e_state() == c_state()
