"""PYTEST_DONT_REWRITE

The standard library as real code uses it, traced whole (``fullgraph=True``, one
graph): ``collections`` (OrderedDict and plain subclasses, defaultdict, deque,
namedtuple classes made inside and outside, Counter, ``dict.fromkeys``, dicts from
iterators), ``itertools`` (combinatoric and lazy ones) and ``functools`` (``lru_cache``
/ ``cache``-wrapped calls, ``reduce``, ``partial`` of functions, modules and methods).
Each program is compared with eager on the counting (eager) backend; a sample also on
the ``kiln`` backend.
"""
import collections
import functools
import itertools
import operator

import pytest
import torch

from .harness import TORCH_MODE, dynamo_bug, T, check, expect_unsupported, shapes

PROGRAMS = []
ON_KILN = []
# the kiln backend, and the breaks kiln keeps where torch.compile traces on, are kiln's own
kiln_only = pytest.mark.skipif(TORCH_MODE, reason="kiln's backend or kiln's own break")


def program(*shps, inputs=None, kiln=False, marks=()):
    def deco(f):
        f.make_inputs = inputs or shapes(*(shps or ((3,),)))
        PROGRAMS.append(pytest.param(f, marks=marks, id=f.__name__))
        if kiln:
            ON_KILN.append(pytest.param(f, marks=kiln_only, id=f.__name__))
        return f
    return deco


class PlainOD(collections.OrderedDict):
    """Adds nothing but a docstring: behaves as OrderedDict."""


class ODWithHelpers(collections.OrderedDict):
    """New methods only (no dict method overridden)."""
    scale = 2

    def total(self):
        return sum(self.values()) * self.scale

    def first_key(self):
        return next(iter(self))


Point = collections.namedtuple("Point", ["x", "y"])
PointZ = collections.namedtuple("PointZ", "x y z", defaults=(1.5,))


# --- collections -------------------------------------------------------------------
@program(kiln=True)
def od_build_and_read(x):
    d = collections.OrderedDict()
    d["a"] = x
    d["b"] = x * 2
    return d["a"] + d["b"], list(d.keys())


@program()
def od_from_pairs_move_to_end(x):
    d = collections.OrderedDict([("a", x), ("b", x + 1), ("c", x - 1)])
    d.move_to_end("a")
    d.move_to_end("c", last=False)
    return list(d.items()), list(d)


@program()
def od_returned(x):
    return collections.OrderedDict(a=x.sin(), b=x.cos())


@program()
def od_subclass(x):
    d = PlainOD(a=x)
    d["b"] = x.sin()
    return d["a"] * d["b"], len(d), d


@program()
def od_subclass_with_new_methods(x):
    d = ODWithHelpers(a=x, b=x * 3)
    return d.total(), d.first_key(), d


@program()
def od_popitem_first_and_last(x):
    d = collections.OrderedDict(a=x, b=x * 2, c=x * 3)
    k1, v1 = d.popitem(last=False)
    k2, v2 = d.popitem()
    return k1, v1, k2, v2, list(d)


@program()
def od_copy_update(x):
    d = collections.OrderedDict(a=x)
    e = d.copy()
    e.update(b=x + 1)
    return len(d), e


@program()
def od_missing_key_raises_caught(x):
    d = collections.OrderedDict(a=x)
    try:
        d.move_to_end("zz")
    except KeyError:
        x = x + 1
    return x


@program()
def od_fromkeys(x):
    d = collections.OrderedDict.fromkeys("ab", 1)
    return x * d["a"] + d["b"], d


@program()
def dd_list_append(x):
    d = collections.defaultdict(list)
    for i in range(3):
        d[i % 2].append(x * i)
    return d[0][0] + d[1][0], len(d)


@program()
def dd_int_setdefault(x):
    d = collections.defaultdict(int)
    d.setdefault("a", 3)
    d["b"] += 2
    return x * d["a"] + d["b"], dict(d)


@program()
def dd_fromkeys(x):
    d = collections.defaultdict.fromkeys(["a", "b"], 2)
    return x * d["a"], type(d).__name__, d.default_factory is None


@program()
def dd_nested(x):
    d = collections.defaultdict(lambda: collections.defaultdict(int))
    d["a"]["b"] += 1
    d["a"]["c"] += 2
    return x * (d["a"]["b"] + d["a"]["c"])


@program(kiln=True)
def deque_both_ends(x):
    q = collections.deque([x, x + 1])
    q.append(x * 2)
    q.appendleft(x - 1)
    a = q.popleft()
    b = q.pop()
    return a + b, len(q)


@program()
def deque_maxlen_window(x):
    q = collections.deque(maxlen=2)
    for i in range(4):
        q.append(x * i)
    return sum(q), len(q), q.maxlen


@program()
def deque_rotate_extend(x):
    q = collections.deque([1, 2, 3])
    q.rotate(1)
    q.extend([4])
    q.extendleft([0, -1])
    return x * q[0] + q[-1], list(q)


@program()
def deque_returned(x):
    q = collections.deque([x], maxlen=3)
    q.appendleft(x * 2)
    return q


@program()
def deque_pop_empty_caught(x):
    q = collections.deque()
    try:
        q.pop()
    except IndexError:
        x = x * 3
    return x


@program()
def deque_iterate(x):
    q = collections.deque(range(3))
    return [x * i for i in q], 2 in q


@program()
def deque_mutated_while_iterated_raises_caught(x):
    q = collections.deque([1, 2])
    try:
        for _ in q:
            q.append(3)
    except RuntimeError:
        x = x + 1
    return x, len(q)


@program()
def deque_iterator_returned_midway(x):
    q = collections.deque([x, x + 1, x + 2])
    it = iter(q)
    first = next(it)
    return first * 2, list(it)


@program()
def deque_index_count_remove(x):
    q = collections.deque([1, 2, 2, 3])
    q.remove(2)
    return x * q.index(3) + q.count(2), q[-1], len(q)


@program()
def nt_outside(x):
    p = Point(x, x * 2)
    return p.x + p.y, p[0], p._replace(x=x + 1)._asdict()["x"]


@program()
def nt_defaults(x):
    p = PointZ(x, x)
    return p.z * p.x, p


@program()
def nt_keywords(x):
    p = Point(y=x, x=x + 1)
    return p.x - p.y


@program()
def nt_made_inside(x):
    P2 = collections.namedtuple("P2", ["a", "b"])
    p = P2(x, 2)
    return p.a * p.b, P2._fields


@program()
def nt_made_inside_with_defaults(x):
    P3 = collections.namedtuple("P3", "a b", defaults=[2])
    p = P3(a=x)
    return p.a * p.b, P3._field_defaults


@program()
def nt_unpack(x):
    a, b = Point(x, x + 1)
    return a * b


@program()
def dict_fromkeys_value(x):
    d = dict.fromkeys(["a", "b"], 0)
    d["a"] = x + 1
    return d


@program()
def dict_fromkeys_default_none(x):
    d = dict.fromkeys("ab")
    return x + 1, d


@program()
def dict_update_zip(x):
    d = {}
    d.update(zip(["a", "b"], [x, x + 1]))
    return d["a"] + d["b"]


@program()
def dict_from_iterator(x):
    return dict(iter([("a", x * 1), ("b", x * 2)]))


@program()
def dict_from_generator(x):
    return dict((k, x * i) for i, k in enumerate("abc"))


@program()
def dict_from_zip(x):
    return dict(zip("ab", (x.sin(), x.cos())))


@program()
def dict_from_map(x):
    return dict(map(lambda kv: (kv[0], kv[1] * x), [("a", 1), ("b", 2)]))


@program()
def counter_from_list(x):
    c = collections.Counter(["a", "b", "a"])
    return x * c["a"], c["z"], c.most_common(1)


@program()
def counter_increment(x):
    c = collections.Counter()
    for k in "hello":
        c[k] += 1
    return x + c["l"], sorted(c.items())


@program()
def counter_update_total(x):
    c = collections.Counter(a=2)
    c.update("aab")
    c.subtract(["b"])
    return x * c.total(), c["a"], c["b"]


@program()
def counter_elements(x):
    c = collections.Counter(a=2, b=1)
    return [x * len(k) for k in c.elements()], c


@program(marks=dynamo_bug("Counter(str) calls a C helper dynamo skips (a break, not a wrong answer)"))
def counter_of_string(x):
    c = collections.Counter("mississippi")
    return x * c["s"] - c["p"], c.most_common(2)


# --- itertools ---------------------------------------------------------------------
@program(kiln=True)
def it_combinations(x):
    return [a * b for a, b in itertools.combinations([x, x + 1, x + 2], 2)]


@program()
def it_combinations_count(x):
    return x * len(list(itertools.combinations(range(5), 3)))


@program()
def it_permutations(x):
    return [a - b for a, b in itertools.permutations([x, x * 2], 2)]


@program()
def it_permutations_default_r(x):
    return [x * (a * 10 + b) for a, b in itertools.permutations(range(2))]


@program()
def it_combinations_with_replacement(x):
    return len(list(itertools.combinations_with_replacement(range(3), 2))) * x


@program()
def it_product(x):
    return [x * i + j for i, j in itertools.product(range(2), range(3))]


@program()
def it_product_repeat(x):
    return sum(x * (i - j) for i, j in itertools.product([1, 2], repeat=2))


@program()
def it_accumulate(x):
    return list(itertools.accumulate([x, x, x]))


@program()
def it_accumulate_mul(x):
    return list(itertools.accumulate([x, x + 1, x + 2], operator.mul))


@program()
def it_groupby(x):
    out = []
    for k, g in itertools.groupby([1, 1, 2, 3, 3]):
        out.append(x * k * len(list(g)))
    return out


@program()
def it_groupby_key(x):
    return [(k, len(list(g))) for k, g in itertools.groupby("aabBbc", key=lambda c: c.lower())], x + 1


@program()
def it_groupby_skip_groups(x):
    return [x * k for k, _ in itertools.groupby([3, 3, 1, 1, 1, 2])]


@program()
def it_repeat_times(x):
    return list(itertools.repeat(x + 1, 3))


@program()
def it_repeat_forever_zip(x):
    return [a * b for a, b in zip([x, x], itertools.repeat(2))]


@program()
def it_count(x):
    return [x * i for i, _ in zip(itertools.count(1), range(3))]


@program()
def it_count_step(x):
    c = itertools.count(5, 2)
    return x + next(c) + next(c)


@program()
def it_zip_longest(x):
    return [a * b for a, b in itertools.zip_longest([x, x], [1], fillvalue=3)]


@program()
def it_starmap(x):
    return list(itertools.starmap(operator.add, [(x, 1), (x, 2)]))


@program()
def it_pairwise(x):
    return [b - a for a, b in itertools.pairwise([x, x * 2, x * 3])]


@program()
def it_takewhile(x):
    return [x * i for i in itertools.takewhile(lambda i: i < 3, range(10))]


@program()
def it_dropwhile(x):
    return [x * i for i in itertools.dropwhile(lambda i: i < 3, range(5))]


@program()
def it_tee(x):
    a, b = itertools.tee([x, x + 1])
    return [u * v for u, v in zip(a, b)]


@program()
def it_tee_three_interleaved(x):
    a, b, c = itertools.tee(iter([x, x + 1, x + 2]), 3)
    return next(a) + next(b) + next(a), list(c)


@program()
def it_chain(x):
    return list(itertools.chain([x * 2], (x + 1,)))


@program()
def it_chain_from_iterable(x):
    return list(itertools.chain.from_iterable([[x * 1], [x * 2, x * 3]]))


@program()
def it_compress(x):
    return list(itertools.compress([x, x + 1, x + 2], [1, 0, 1]))


@program()
def it_cycle(x):
    c = itertools.cycle([1, 2])
    return x * next(c) + next(c) * next(c)


@program()
def it_filterfalse(x):
    return [x * i for i in itertools.filterfalse(lambda i: i % 2, range(5))]


@program()
def it_islice(x):
    return list(itertools.islice([x, x + 1, x + 2, x + 3], 1, None, 2))


@program()
def it_islice_count(x):
    return [x * i for i in itertools.islice(itertools.count(), 2, 5)]


# --- functools ---------------------------------------------------------------------
_calls = []


@functools.lru_cache(maxsize=None)
def _doubled(n):
    return n * 2


@functools.lru_cache
def _table(k):
    return tuple(range(k))


@functools.cache
def _offset(a, b=1):
    return a + b


@functools.lru_cache(maxsize=8)
def _tensor_fn(t):
    return t * 2 + 1


class _WithCachedMethods:
    def __init__(self):
        self.k = 3

    @functools.lru_cache(maxsize=None)
    def table(self, n):
        return tuple(range(n + self.k))

    @staticmethod
    @functools.cache
    def doubled(n):
        return n * 2


_with_cached = _WithCachedMethods()


@program()
def ft_lru_cache_method_and_static(x):
    return x * len(_with_cached.table(2)) + _WithCachedMethods.doubled(2) + _with_cached.doubled(1)


@program(kiln=True)
def ft_lru_cache(x):
    return x * _doubled(3)


@program()
def ft_lru_cache_tuple(x):
    return [x * i for i in _table(3)]


@program()
def ft_cache_kwargs(x):
    return x + _offset(2, b=3)


@program()
def ft_lru_cache_of_tensor(x):
    return _tensor_fn(x)


@program()
def ft_reduce(x):
    return functools.reduce(operator.add, [x, x * 2, x * 3])


@program()
def ft_reduce_initial(x):
    return functools.reduce(lambda a, b: a * b, [x, x + 1], 1)


@program()
def ft_partial_function(x):
    f = functools.partial(torch.nn.functional.softmax, dim=-1)
    return f(x)


_lin = torch.nn.Linear(3, 3)


@program()
def ft_partial_module(x):
    f = functools.partial(_lin)
    return f(x)


@program()
def ft_partial_method(x):
    f = functools.partial(x.add, alpha=2)
    return f(x)


@program()
def ft_partial_nested(x):
    f = functools.partial(functools.partial(torch.clamp, min=0), max=1)
    return f(x)


@program()
def ft_partial_user_function(x):
    def scale(t, s, shift=0):
        return t * s + shift
    f = functools.partial(scale, s=3)
    return f(x, shift=1)


def _plain(y):
    "doc of _plain"
    return y - 1


@program()
def ft_wraps_made_inside(x):
    def deco(fn):
        @functools.wraps(fn)
        def w(*a):
            return fn(*a) + 1
        return w

    @deco
    def g(y):
        """doc"""
        return y * 2
    return g(x), g.__name__, g.__doc__, g.__qualname__, g.__wrapped__(x)


@program()
def ft_wraps_of_a_global_function(x):
    w = functools.wraps(_plain)(lambda y: _plain(y) * 3)
    return w(x), w.__name__, w.__doc__, w.__module__


def test_wraps_of_annotated_function_made_inside():
    """Annotations of a function made in the trace are not kept: a break, eager's answer."""
    def f(x):
        def g(y: int):
            return y

        @functools.wraps(g)
        def h(y):
            return g(y) + 1
        return h(x), h.__annotations__
    check(f, shapes((3,)))


@pytest.mark.parametrize("fn", PROGRAMS)
def test_program(fn):
    check(fn, fn.make_inputs, graphs=1, fullgraph=True)


@pytest.mark.parametrize("fn", ON_KILN)
def test_program_on_kiln(fn):
    check(fn, fn.make_inputs, fullgraph=True, backend="kiln")


def test_lru_cache_left_untouched():
    """The trace calls the wrapped function: the cache neither grows nor is read."""
    @functools.lru_cache(maxsize=None)
    def table(n):
        return n + 1

    def f(x):
        return x * table(4)
    before = table.cache_info()
    check(f, shapes((3,)), graphs=1, fullgraph=True)
    # eager's calls in check fill the cache once (hit afterwards); compiled calls do not touch it
    info = table.cache_info()
    assert info.misses == before.misses + 1 and info.hits == before.hits + 2


@pytest.mark.parametrize("op", [lambda q: q[0:1], lambda q: q == [1, 2], lambda q: q + q, lambda q: q * 2,
                                lambda q: repr(q)], ids=["slice", "eq_list", "add", "mul", "repr"])
def test_deque_is_not_a_list(op):
    """What a deque does differently from a list stays eager's (a break or its error)."""
    def f(x):
        return op(collections.deque([1, 2], maxlen=4)), x + 1
    check(f, shapes((3,)))


def test_deque_escaping_keeps_maxlen():
    import kiln

    def f(x):
        q = collections.deque([x], maxlen=2)
        q.append(x + 1)
        q.append(x + 2)
        return q
    out = kiln.compile(f, fullgraph=True)(torch.ones(2))
    assert type(out) is collections.deque and out.maxlen == 2 and len(out) == 2
    torch.testing.assert_close(out[0], torch.full((2,), 2.0))


@kiln_only
def test_od_subclass_with_behaviour_is_not_modelled():
    """kiln keeps a break where the subclass overrides dict behaviour (torch.compile
    traces the override)."""
    class Loud(collections.OrderedDict):
        def __setitem__(self, k, v):
            super().__setitem__(k, v * 2)

    def f(x):
        d = Loud()
        d["a"] = x
        return d["a"]
    expect_unsupported(f, shapes((3,)))
