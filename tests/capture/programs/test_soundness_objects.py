"""PYTEST_DONT_REWRITE

Faithful Python object semantics in compiled code: generators and iterators run
lazily, object identity and equality, live dict views, iterators that keep their
position across graph breaks, metaclass attributes, frame introspection, exceptions
(type, args, attributes, tracebacks) and a few crashes of the trace. Each program
compares compiled with eager; those whose tensors reach the later stages also run
through the "aot_eager" and "kiln" backends (``test_backends``).
"""
import dataclasses
import enum
import inspect
import itertools
import sys
import traceback

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from .harness import KILN_ONLY, T, _compile, _reset, check, compare, graph_break, shapes

LOG = []  # the side effects programs make; compared after every call (state=LOG)


def _gen(x):
    LOG.append("start")
    yield x + 1
    LOG.append("mid")
    yield x * 2
    LOG.append("end")
    raise ValueError("eager never gets here")


# --------------------------------------------------------------------------- generators

def test_generator_runs_only_as_far_as_pulled():
    def f(x):
        g = _gen(x)
        return next(g), len(LOG)
    check(f, shapes((3,)), state=LOG, graphs=1, breaks=KILN_ONLY(0))


def test_generator_for_loop_break_and_zip_with_shorter():
    def f(x):
        out = []
        for v in _gen(x):
            out.append(v)
            break
        out += [b for _, b in zip([0], _gen(x))]
        out += [a for a, _ in zip(_gen(x), [0])]
        return out
    check(f, shapes((3,)), state=LOG, graphs=1)


def _echo():
    got = yield "ready"
    while True:
        got = yield got * 2


def test_generator_send():
    def f(x):
        g = _echo()
        first = next(g)
        return x * g.send(3) + g.send(x), first
    check(f, shapes((3,)), graphs=1)


def _guarded():
    try:
        LOG.append("enter")
        while True:
            try:
                yield len(LOG)
            except KeyError as e:
                LOG.append(f"caught {e.args[0]}")
    finally:
        LOG.append("finally")


def test_generator_throw_and_close():
    def f(x):
        g = _guarded()
        a = next(g)
        b = g.throw(KeyError("k"))
        g.close()
        g.close()
        return x + a + b, next(g, "done")
    check(f, shapes((3,)), state=LOG, graphs=1, breaks=KILN_ONLY(0))


def test_generator_expression_is_lazy():
    def side(i):
        LOG.append(i)
        return i
    def f(x):
        g = (side(i) * x for i in range(4))
        first = next(g)
        found = any(side(i) > 1 for i in range(10))
        return first, found, 2 in (side(i) for i in range(10))
    check(f, shapes((3,)), state=LOG, graphs=1)


def _inner():
    LOG.append("inner")
    yield 1
    yield 2
    return 10


def _outer():
    r = yield from _inner()
    LOG.append(r)
    yield from [3, 4]
    LOG.append("outer done")


def test_yield_from_delegates_item_by_item():
    def f(x):
        g = _outer()
        head = [next(g), next(g), next(g)]
        return x + sum(head), sum(_outer())
    check(f, shapes((3,)), state=LOG, graphs=1)


def test_generator_return_value_and_pep479():
    def ret():
        yield 1
        return 7
    def bad():
        yield 1
        raise StopIteration("inside")
    def f(x):
        g = ret()
        next(g)
        try:
            next(g)
        except StopIteration as e:
            value = e.value
        try:
            list(bad())
        except RuntimeError as e:
            msg = e.args
        return x + value, msg
    check(f, shapes((3,)), graphs=1)


def test_unpacking_a_generator_takes_one_item_more_at_most():
    def three():
        yield 1
        yield 2
        LOG.append("third")
        yield 3
        LOG.append("after the third")
    def f(x):
        try:
            a, b = three()
        except ValueError as e:
            return x + 1, e.args
        return x, a, b
    check(f, shapes((3,)), state=LOG, graphs=1)


def test_map_and_filter_are_lazy():
    def side(v):
        LOG.append(v)
        return v * 2
    def f(x):
        m = map(side, [x, x + 1, x + 2])
        first = next(m)
        kept = filter(lambda v: side(v) > 2, [1, 2, 3, 4])
        return first, next(kept)
    check(f, shapes((3,)), state=LOG, graphs=1)


def test_generator_suspended_at_a_graph_break_runs_eagerly():
    def f(x):
        g = _gen(x)
        a = next(g)
        graph_break()
        return a + next(g)
    check(f, shapes((3,)), state=LOG)


def test_generator_not_started_or_finished_at_a_graph_break():
    def f(x):
        fresh = _gen(x)
        done = (i for i in [x])
        list(done)
        graph_break()
        return next(fresh), list(done), type(done).__name__
    check(f, shapes((3,)), state=LOG)


def test_compiled_generator_function_returns_a_generator():
    def gen(x):
        if x.shape[0] > 100:
            yield x
        return x + 1
    _reset()
    try:
        compiled = _compile(gen, "eager", False)
        for _ in range(2):
            x = T(3)
            g = compiled(x)
            assert type(g) is type(gen(x))
            with pytest.raises(StopIteration) as stop:
                next(g)
            assert g.gi_code is gen.__code__
            torch.testing.assert_close(stop.value.value, x + 1)
    finally:
        _reset()


class Countdown:
    """An iterator class: __iter__ returns self, __next__ raises StopIteration."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        return self.n


def test_user_iterator_class():
    def f(x):
        return x + sum(Countdown(3)), list(Countdown(2)), [v for v in Countdown(2)]
    check(f, shapes((3,)), graphs=1)


def test_islice_of_an_infinite_generator():
    def naturals():
        i = 0
        while True:
            yield i
            i += 1
    def f(x):
        return x + sum(itertools.islice(naturals(), 2, 5)), list(zip(naturals(), "ab"))
    check(f, shapes((3,)), graphs=1, breaks=KILN_ONLY(0))


# --------------------------------------------------------------------------- identity and equality

class Plain:
    pass


class Money:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Money) and self.v == other.v

    def __hash__(self):
        return hash(self.v)

    def __lt__(self, other):
        return self.v < other.v


class Shy(Money):
    def __eq__(self, other):
        return NotImplemented


@dataclasses.dataclass
class Cfg:
    a: int
    b: int = 2


def test_new_objects_are_distinct():
    def f(x):
        a, b = Plain(), Plain()
        return x + 1, a is b, a == b, a != b, a is a, a == a, {} is {}, [] == [], (lambda: 0) is (lambda: 0)
    check(f, shapes((3,)), graphs=1)


def test_user_eq_ne_hash_and_reflection():
    def f(x):
        return (x + 1, Money(1) == Money(1), Money(1) != Money(1), Money(1) == Money(2), Money(1) == 1,
                1 == Money(1), Shy(1) == Shy(1), Shy(1) == Money(1), Money(1) == Shy(1),
                hash(Money(5)) == hash(5), Money(1) < Money(2), Money(3) > Money(2),
                Cfg(1) == Cfg(1), Cfg(1) != Cfg(1, 3))
    check(f, shapes((3,)), graphs=1)


def test_in_index_count_on_lists_of_objects():
    def f(x):
        a = Plain()
        objs = [Plain(), a]
        money = [Money(2), Money(1), Money(1)]
        return x + 1, a in objs, Plain() in objs, objs.index(a), Money(1) in money, money.index(Money(1)), money.count(Money(1))
    check(f, shapes((3,)), graphs=1)


def test_sequences_compare_item_by_item():
    def f(x):
        p = Plain()
        return x + 1, [1, Plain()] == [1, Plain()], [1, p] == [1, p], (Money(1), 2) == (Money(1), 2), [1] == (1,)
    check(f, shapes((3,)), graphs=1)


def test_unhashable_and_unorderable_objects_raise_as_in_eager():
    def f(x):
        out = []
        for thunk in (lambda: hash(Cfg(1)), lambda: Plain() < Plain(), lambda: Plain() + 1):
            try:
                thunk()
            except TypeError as e:
                out.append(e.args)
        return x + 1, out
    check(f, shapes((3,)), graphs=1)


class Mode:
    pass


MODE_A, MODE_B = Mode(), Mode()


class Level(str, enum.Enum):
    LOW = "low"
    HIGH = "high"


def test_identity_and_equality_of_existing_objects_are_guarded():
    def f(x, m, level):
        a = x + 1 if m is MODE_A else x - 1
        return a * 2 if level == Level.HIGH else a
    check(f, lambda i: (T(3), [MODE_A, MODE_B, MODE_A][i], [Level.HIGH, Level.LOW, Level.LOW][i]), graphs=1)


SHARED = [0]


def test_one_object_through_two_names_is_guarded():
    def f(x, lst):
        lst.append(1)
        return x + len(SHARED)
    _reset()
    try:
        compiled = _compile(f, "eager", False)
        for arg in (SHARED, [0], SHARED):
            before = list(SHARED)
            x = T(3)
            expected = f(x, arg if arg is SHARED else list(arg))
            SHARED[:] = before
            compare(expected, compiled(x, arg))
            SHARED[:] = before
    finally:
        _reset()
        SHARED[:] = [0]


# --------------------------------------------------------------------------- dict views

def test_dict_views_are_live():
    def f(x):
        d = {"a": 1, "b": 2}
        keys, values, items = d.keys(), d.values(), d.items()
        d["c"] = 3
        del d["b"]
        return x + 1, list(keys), list(values), list(items), len(keys), "c" in keys, ("c", 3) in items, 3 in values
    check(f, shapes((3,)), graphs=1)


def test_keys_views_set_operations_and_comparisons():
    def f(x):
        d = {"a": 1, "b": 2, "c": 3}
        k = d.keys()
        d["z"] = 0
        return (x + 1, sorted(k & {"a", "q"}), sorted(k - {"a"}), sorted(k | {"q"}), sorted({"a", "y"} ^ k),
                k == {"a", "b", "c", "z"}, k == ["a", "b", "c", "z"], d.items() == {("a", 1), ("b", 2), ("c", 3), ("z", 0)},
                d.values() == d.values(), k.isdisjoint(["y"]))
    check(f, shapes((3,)), graphs=1)


def test_dict_view_of_an_argument_across_a_break():
    def f(x, d):
        v = d.values()
        graph_break()
        d["new"] = 5
        return x + 1, sorted(v)
    check(f, lambda i: (T(3), {"a": i, "b": 1}))


def test_dict_changed_size_during_iteration_raises():
    def f(x):
        d = {"a": 1, "b": 2}
        try:
            for k in d:
                d[k + "x"] = 0
        except RuntimeError as e:
            return x + 1, e.args
        return x
    check(f, shapes((3,)), graphs=1)


def test_set_iteration_order_is_eagers():
    def f(x):
        s = {"b", "a", "c", "zz", "q"}
        s.discard("a")
        s.add("e")
        t = {"x", "y", "zeta"} | {"alpha"}
        return x + 1, list(s), list(t), list(set("hello") | {"world"})
    check(f, shapes((3,)), graphs=1, breaks=KILN_ONLY(0))


# --------------------------------------------------------------------------- iterators across breaks

def test_iterator_aliases_stay_one_object_across_a_break():
    def f(x):
        it = iter([1, 2, 3])
        alias = it
        graph_break()
        return x + 1, next(it), next(alias)
    check(f, shapes((3,)))


def test_partly_consumed_iterator_continues_after_a_break():
    def f(x):
        it = iter([("a", 1), ("b", 2), ("c", 3)])
        first = next(it)
        d = dict(it)
        graph_break()
        pairs = iter(zip("xyz", [1, 2, 3]))
        next(pairs)
        graph_break()
        return x + 1, first, d, list(it), dict(pairs)
    check(f, shapes((3,)))


def test_list_iterator_sees_mutations():
    def f(x):
        lst = [1, 2]
        it = iter(lst)
        lst.append(3)
        seen = []
        for v in lst:
            seen.append(v)
            if v == 1:
                lst.append(4)
        back = reversed(lst)
        lst.pop()
        return x + 1, list(it), seen, list(back)
    check(f, shapes((3,)), graphs=1)


def test_list_iterator_across_a_break_sees_later_appends():
    def f(x, lst):
        it = iter(lst)
        next(it)
        graph_break()
        lst.append(9)
        return x + 1, list(it)
    check(f, lambda i: (T(3), [1, 2, 3]))


class Holder:
    def __init__(self):
        self.t = (1, 2)


def test_value_read_before_an_attribute_write_is_the_old_one():
    h = Holder()
    def f(x):
        old = h.t
        h.t = (5,)
        return x + 1, old
    def g(x):
        old = h.t
        h.t = (6,)
        graph_break()
        return x + 1, old
    check(f, shapes((3,)), state=h)
    check(g, shapes((3,)), state=h)


# --------------------------------------------------------------------------- metaclasses

class _Meta(type):
    @property
    def world(cls):
        return cls._world * 2

    def twice(cls, v):
        return 2 * v

    def __getattr__(cls, name):
        return name + "!"


class WithMeta(metaclass=_Meta):
    _world = 3


class ShadowsMeta(WithMeta):
    world = "the class attribute loses to the metaclass property"


def test_metaclass_property_method_and_getattr():
    def f(x):
        return x + WithMeta.world + WithMeta.twice(1), ShadowsMeta.world, WithMeta.missing
    check(f, shapes((3,)), graphs=1)


def test_group_member_world():
    def f(x):
        import torch.distributed as dist
        return x + 1, dist.GroupMember.WORLD
    check(f, shapes((3,)), graphs=1)


# --------------------------------------------------------------------------- frames, exceptions

def test_current_frame_is_the_users():
    def f(x):
        y = x + 1
        fr = inspect.currentframe()
        return y, fr.f_code.co_name, fr.f_lineno - f.__code__.co_firstlineno, sorted(fr.f_locals)
    def g(x):
        y = x * 2
        graph_break()
        return y, sys._getframe().f_code.co_name, sorted(locals())
    check(f, shapes((3,)))
    check(g, shapes((3,)))


class TwoArgError(Exception):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


class TwoArgValueError(ValueError):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


class RaisingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise TwoArgValueError("from forward", 3)

    @staticmethod
    def backward(ctx, g):
        return g


def _fail(x):
    raise TwoArgError("bad input", 7)  # the line tracebacks must show


def _check_raises(fn, *args):
    """The compiled function raises eager's exception: type, args, attributes, and the
    user's line in its formatted traceback."""
    def outcome(call):
        try:
            call(*args)
        except Exception as e:  # noqa: BLE001
            return e
        raise AssertionError("no exception")
    e_exc = outcome(fn)
    _reset()
    try:
        for _ in range(2):
            c_exc = outcome(_compile(fn, "eager", False))
            assert type(c_exc) is type(e_exc) and c_exc.args == e_exc.args, (e_exc, c_exc)
            assert vars(c_exc) == vars(e_exc)
            text = "".join(traceback.format_exception(c_exc))
            last = traceback.extract_tb(e_exc.__traceback__)[-1]
            assert f'File "{last.filename}", line {last.lineno}' in text and last.line in text, text
    finally:
        _reset()


def test_exceptions_keep_type_args_attributes_and_user_lines():
    def raises_inline(x):
        return _fail(x + 1)
    def raises_from_function_forward(x):
        return RaisingFn.apply(x) + 1
    def raises_after_break(x):
        y = x + 1
        graph_break()
        return _fail(y)
    for fn in (raises_inline, raises_from_function_forward, raises_after_break):
        _check_raises(fn, T(3))


def _breaks_then_fails(x):
    graph_break()
    raise KeyError("deep")


def test_call_run_at_a_break_shows_the_callers_line():
    def f(x):
        y = x + 1
        return _breaks_then_fails(y)  # the caller's line
    _check_raises(f, T(3))


def test_exception_made_in_the_trace_keeps_its_state():
    def f(x):
        e = TwoArgError("m", 5)
        try:
            raise e
        except TwoArgError as caught:
            seen = (caught.args, caught.code, caught is e)
        try:
            (1, 2)[5]
        except IndexError as ie:
            seen += ie.args
        graph_break()
        return x + 1, seen, e.args, e.code
    check(f, shapes((3,)), breaks=KILN_ONLY(1))


def test_op_error_caught_by_the_program_has_eagers_message():
    def f(x):
        try:
            return x + torch.ones(5)
        except RuntimeError as e:
            return x, e.args
    check(f, shapes((3,)))


# --------------------------------------------------------------------------- crashes

def test_numpy_array_live_in_a_frame_with_the_kiln_backend():
    def f(x, a):
        y = np.ones(3)
        z = x + 1
        graph_break()
        return z * 2, a.sum() + y.sum()
    _reset()
    try:
        compiled = _compile(f, "kiln", False)
        for i in range(2):
            x, a = T(3), np.arange(float(i + 2))
            compare(f(x, a), compiled(x, a))
    finally:
        _reset()


def test_torch_functions_take_input_by_keyword():
    def f(x):
        z = x + 1
        return z, torch.is_floating_point(input=z), torch.numel(input=z), torch.is_complex(input=z), F.relu(input=x)
    check(f, shapes((3,)), graphs=1)


def test_tensor_type_casts_and_transpose_of_0d():
    def f(a, s):
        return (a.type(torch.HalfTensor), a.type("torch.DoubleTensor"), a.type(), a.type(torch.float64),
                a.type(dtype=torch.int32).type(), a.type(torch.FloatTensor) is a, s.T + 1, s.T.shape)
    check(f, lambda i: (T(3), torch.tensor(float(i))), graphs=1)


def test_builtins_called_with_keywords_or_generators():
    def f(x):
        return (x + 1, list(enumerate(iterable=[4, 5], start=1)), " ".join(str(d) for d in x.shape),
                round(2.567, ndigits=1))
    check(f, shapes((3,)))


def test_dotted_imports_inside_the_function():
    def f(x):
        import torch.distributed.fsdp._flat_param as fp
        import os.path
        from os import path as p
        try:
            import kiln_no_such_module  # noqa: F401
        except ImportError as e:
            missing = type(e).__name__
        return x + 1, fp.__name__, os.path.join("a", "b"), p.__name__, missing
    check(f, shapes((3,)))


# --------------------------------------------------------------------------- backends

def _backend_programs():
    def lazy_gen(x):
        def gen():
            yield x.sin()
            yield x * 2
            raise AssertionError("eager never gets here")
        g = gen()
        return next(g) + next(g)
    def views(x):
        d = {"a": x}
        vals = d.values()
        d["b"] = x.sin()
        return sum(vals)
    def objects(x):
        return x * (Money(1) == Money(1)) + x * (Plain() is Plain())
    def crash_cases(x):
        s = x.sum()
        return s.T + x.type(torch.HalfTensor).float() + F.relu(input=x), torch.is_floating_point(input=x)
    def iterator_across_break(x):
        it = iter([x, x + 1, x + 2])
        alias = it
        next(it)
        graph_break()
        return next(alias) * next(it)
    return [lazy_gen, views, objects, crash_cases, iterator_across_break]


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("program", _backend_programs(), ids=lambda p: p.__name__)
def test_backends(program, backend):
    _reset()
    try:
        compiled = _compile(program, backend, False)
        for i in range(2):
            x = torch.randn(4, requires_grad=bool(i))
            expected = program(x)
            got = compiled(x)
            compare(expected, got)
            if i:
                torch.autograd.grad(got[0].sum() if isinstance(got, tuple) else got.sum(), x)
    finally:
        _reset()
