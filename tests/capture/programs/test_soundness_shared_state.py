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


# --- objects the trace took for distinct, aliased on a later call -----------------------

class _Obj:
    def __init__(self, v=1, inner=None):
        self.v = v
        self.inner = inner


def _alias_world(w=None):
    """Globals of one program: a list, a dict holding a list, an object; given ``w``,
    set back to their first values in place (the objects stay the same)."""
    if w is None:
        return {"G": [1], "GD": {"k": [1]}, "GO": _Obj()}
    w["G"][:] = [1]
    w["GD"]["k"][:] = [1]
    vars(w["GO"]).update(v=1, inner=None)
    return w


def _aliased_later(body, first, second, backend="eager"):
    """``body(w, x, *args)`` over globals ``w``: compiled on ``first(w)``'s arguments
    (distinct objects, equal in value to what ``second(w)`` passes, so that only their
    identity differs), then called with ``second(w)``'s (aliases); each call starts
    from the same global values and is compared with eager, state included."""
    def make():
        w = _alias_world()

        def prog(x, *args):
            return body(w, x, *args)
        return prog, w
    e_prog, e_w = make()
    c_prog, c_w = make()
    kiln.reset()
    compiled = kiln.compile(c_prog, backend=backend)
    try:
        for pick in (first, second, first, second):
            _alias_world(e_w), _alias_world(c_w)
            compare(e_prog(torch.zeros(1), *pick(e_w)), compiled(torch.zeros(1), *pick(c_w)))
            compare(e_w, c_w, "state")
    finally:
        kiln.reset()


def _append_then_read_global(w, x, lst):
    lst.append(2)
    return x + len(w["G"])


def _global_item_mutated_arg_read(w, x, lst):
    w["GD"]["k"].append(5)
    return x + len(lst)


def _mutate_through_a_callee(w, x, lst):
    _appends(lst)
    return x + len(w["G"])


def _appends(lst):
    lst.append(3)


def _attr_written_other_read(w, x, o):
    o.v = o.v + 6
    return x + w["GO"].v


def _nested_attr_read(w, x, o):
    w["GO"].v = 9
    return x + o.inner.v


def _two_args_in_a_loop(w, x, a, b):
    for i in range(2):
        a.append(i)
        x = x + len(b)
    return x


def _two_sets(w, x, a, b):
    a.add(len(a) + 1)
    return x + len(b)


def _two_dicts(w, x, a, b):
    a["n"] = a.get("n", 0) + 1
    return x + len(b) + b.get("n", 0)


ALIASES = {
    "arg_is_global": (_append_then_read_global, lambda w: (list(w["G"]),), lambda w: (w["G"],)),
    "dict_item_is_global": (lambda w, x, d: _append_then_read_global(w, x, d["k"]),
                            lambda w: ({"k": list(w["G"])},), lambda w: ({"k": w["G"]},)),
    "arg_is_global_dict_item": (_global_item_mutated_arg_read, lambda w: (list(w["GD"]["k"]),), lambda w: (w["GD"]["k"],)),
    "callee_mutates": (_mutate_through_a_callee, lambda w: (list(w["G"]),), lambda w: (w["G"],)),
    "object_attribute": (_attr_written_other_read, lambda w: (_Obj(w["GO"].v),), lambda w: (w["GO"],)),
    "nested_object": (_nested_attr_read, lambda w: (_Obj(inner=_Obj(w["GO"].v)),), lambda w: (_Obj(inner=w["GO"]),)),
    "two_lists_in_a_loop": (_two_args_in_a_loop, lambda w: ([], []), lambda w: (lambda l: (l, l))([])),
    "two_sets": (_two_sets, lambda w: (set(), set()), lambda w: (lambda s: (s, s))(set())),
    "two_dicts": (_two_dicts, lambda w: ({}, {}), lambda w: (lambda d: (d, d))({})),
}


@pytest.mark.parametrize("name", list(ALIASES))
def test_mutable_objects_aliased_on_a_later_call(name):
    _aliased_later(*ALIASES[name])


@backends
def test_alias_of_a_global_with_each_backend(backend):
    _aliased_later(*ALIASES["arg_is_global"], backend=backend)


def _transpose_one_read_other(a, b):
    a.t_()
    return b.shape, b * 1


def _unsqueeze_one_add_other(a, b):
    a.unsqueeze_(0)
    return b + 1


def _add_one_read_other(a, b):
    a.add_(1)
    return b * 2


@backends
@pytest.mark.parametrize("fn", [_transpose_one_read_other, _unsqueeze_one_add_other, _add_one_read_other])
def test_tensor_arguments_aliased_on_a_later_call(fn, backend):
    """The same tensor twice (or two views of one storage) after a trace on distinct
    ones: an in-place geometry change shows through both names, as does data."""
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    try:
        compiled(T(2, 3), T(2, 3))
        pairs = [lambda t: (t, t), lambda t: (t[0], t[1]), lambda t: (t, t.view(6).view(2, 3))]
        for pair in pairs:
            base = T(2, 3)
            e_args, c_args = pair(base.clone()), pair(base.clone())
            compare(fn(*e_args), compiled(*c_args))
            compare(list(e_args), list(c_args), "args")
            for a, b in zip(e_args, c_args):
                assert a.shape == b.shape and a.stride() == b.stride()
    finally:
        kiln.reset()


def test_many_objects_of_one_type_one_mutated():
    """Past a few pairs the distinctness guard is one check over the whole group."""
    def f(x, items):
        items[0].append(1)
        return x + sum(len(lst) for lst in items[1:])
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    try:
        for aliased in (False, True, False, True):
            def make():
                items = [[0] for _ in range(12)]
                if aliased:
                    items[7] = items[0]
                return (items,)
            e_args, c_args = make(), make()
            compare(f(torch.zeros(1), *e_args), compiled(torch.zeros(1), *c_args))
            compare(e_args, c_args, "args")
    finally:
        kiln.reset()
