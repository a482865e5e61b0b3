"""PYTEST_DONT_REWRITE

Calls: user functions inlined (closures, nonlocal, defaults, *args/**kwargs,
keyword-only, lambdas, recursion, generators), builtins, functools, itertools.
"""
import functools
import itertools

import torch

from .harness import T, check, shapes


def _helper(x, scale=2.0):
    return x * scale + 1


def _kw_only(x, *, bias=0.5, power=2):
    return x ** power + bias


def _varargs(*xs, **opts):
    out = sum(xs[1:], xs[0])
    if opts.get("neg"):
        out = -out
    return out * opts.get("scale", 1)


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


def _rec_apply(x, depth):
    if depth == 0:
        return x
    return _rec_apply(x.sin() + depth, depth - 1)


def test_call_module_level_function():
    def f(x):
        return _helper(x) + _helper(x, 3.0) + _helper(x, scale=0.5)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_nested_function_calls():
    def inner(x):
        return x.relu()
    def middle(x):
        return inner(x) * 2 + inner(-x)
    def f(x):
        return middle(middle(x))
    check(f, shapes((4,)), graphs=1, breaks=0)


def test_keyword_only_args():
    def f(x):
        return _kw_only(x), _kw_only(x, power=3), _kw_only(x, bias=-1.0, power=1)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_varargs_kwargs():
    def f(x, y):
        return _varargs(x, y), _varargs(x, y, x, neg=True), _varargs(y, scale=3)
    check(f, shapes((2,), (2,)), graphs=1, breaks=0)


def test_kwargs_forwarding():
    def g(x, **kw):
        return _kw_only(x, **kw)
    def f(x):
        opts = {"bias": 2.0}
        return g(x, **opts), g(x, power=1, **opts)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_program_takes_kwargs():
    from .harness import Args
    def f(x, *, scale=1.0, shift=None):
        y = x * scale
        if shift is not None:
            y = y + shift
        return y
    check(f, lambda i: Args(T(3), scale=2.0, shift=T(3) if i != 1 else None), graphs=1, breaks=0)


def test_default_mutable_argument_read():
    def g(x, dims=(0,)):
        return x.sum(dims)
    def f(x):
        return g(x), g(x, (1,))
    check(f, shapes((2, 3)), graphs=1, breaks=0)


def test_closure_read():
    scale = 3.0
    offset = torch.ones(3)
    def f(x):
        return x * scale + offset
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_closure_nonlocal_write():
    def f(x):
        count = 0
        def bump(t):
            nonlocal count
            count += 1
            return t + count
        y = bump(bump(x))
        return y, count
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_closure_cell_mutated_across_calls():
    # The closure cell outlives the call: compare it through a holder list.
    calls = [0]
    def make():
        def f(x):
            calls[0] += 1
            return x * 2
        return f
    check(make(), shapes((2,)), graphs=1, breaks=0, state=calls)


def test_closure_factory_inlined():
    def make_affine(a, b):
        def g(x):
            return x * a + b
        return g
    def f(x):
        g1 = make_affine(2, 1)
        g2 = make_affine(-1, 0.5)
        return g2(g1(x))
    check(f, shapes((4,)), graphs=1, breaks=0)


def test_lambda():
    def f(x):
        sq = lambda t: t * t
        add = lambda a, b=1: a + b
        return add(sq(x)), add(x, b=x), (lambda: 3)()
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_lambda_in_list_and_dict():
    acts = {"relu": lambda t: t.relu(), "neg": lambda t: -t}
    def f(x, name):
        fs = [lambda t: t + 1, acts[name]]
        for g in fs:
            x = g(x)
        return x
    check(f, lambda i: (T(4), ["relu", "neg", "relu"][i]), graphs=1, breaks=0)


def test_recursion_python():
    def f(x):
        return x * _fact(4)
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_recursion_tensor():
    def f(x):
        return _rec_apply(x, 3)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_generator_list():
    def gen(x, n):
        for i in range(n):
            yield x * i
    def f(x):
        return list(gen(x, 3))
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_generator_expression_sum():
    def f(x):
        return sum(x * i for i in range(4)), sum(i for i in range(5) if i % 2)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_generator_with_yield_from():
    def inner(x):
        yield x
        yield x + 1
    def outer(x):
        yield from inner(x)
        yield x * 3
    def f(x):
        return tuple(outer(x))
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_builtin_len_range_enumerate():
    def f(xs):
        out = []
        for i, t in enumerate(xs):
            out.append(t * i)
        for j in range(len(xs) - 1, -1, -1):
            out.append(xs[j] + j)
        return out
    check(f, lambda i: ([T(2), T(2), T(2)],), graphs=1, breaks=0)


def test_builtin_zip_map_filter():
    def f(xs, ys):
        pairs = [a * b for a, b in zip(xs, ys)]
        sq = list(map(lambda t: t * t, xs))
        pos = list(filter(lambda n: n > 1, [0, 1, 2, 3]))
        return pairs, sq, pos, list(zip([1, 2], "ab"))
    check(f, lambda i: ([T(2), T(2)], [T(2), T(2)]), graphs=1, breaks=0)


def test_builtin_sorted_reversed():
    def f(x):
        ks = sorted([3, 1, 2], reverse=True)
        names = sorted(["b", "a", "c"], key=lambda s: s)
        return [x * k for k in reversed(ks)], names, list(reversed(range(3)))
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_builtin_min_max_sum_tensors_list():
    def f(xs):
        return sum(xs), max(len(xs), 2), min(t.shape[0] for t in xs)
    check(f, lambda i: ([T(3), T(3), T(3)],), graphs=1, breaks=0)


def test_builtin_any_all():
    def f(x, flags):
        y = x
        if any(flags):
            y = y + 1
        if all(flags):
            y = y * 2
        return y, any([]), all([])
    check(f, lambda i: (T(3), [[True, True], [False, True], [False, False]][i]), graphs=1, breaks=0)


def test_builtin_isinstance_issubclass_type():
    def f(x, v):
        r = x
        if isinstance(v, (int, float)):
            r = r * v
        if isinstance(v, torch.Tensor):
            r = r + v
        return r, type(v) is int, issubclass(type(v), int), isinstance(x, torch.Tensor), type(x).__name__
    check(f, lambda i: (T(3), [2, 1.5, T(3)][i]), graphs=1, breaks=0)


def test_builtin_getattr_hasattr_setattr():
    class Box:
        pass
    def f(x):
        b = Box()
        setattr(b, "scale", 3)
        s = getattr(b, "scale")
        d = getattr(b, "missing", 7)
        return x * s + d, hasattr(b, "scale"), hasattr(b, "nope")
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_builtin_getattr_on_torch():
    def f(x, name):
        return getattr(torch, name)(x), getattr(x, name)()
    check(f, lambda i: (T(3), ["sin", "cos", "exp"][i]), graphs=1, breaks=0)


def test_builtin_abs_round_pow_on_tensors():
    def f(x):
        return abs(x), pow(x, 2), round(3.14159, 3), pow(x.abs(), 0.5)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_functools_partial():
    def scale_shift(x, a, b=0.0):
        return x * a + b
    def f(x):
        g = functools.partial(scale_shift, a=2.0)
        h = functools.partial(scale_shift, x, 3.0)
        return g(x, b=1.0), h(), g.keywords["a"]
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_functools_partial_torch_fn():
    sm = functools.partial(torch.softmax, dim=-1)
    def f(x):
        return sm(x)
    check(f, shapes((2, 4)), graphs=1, breaks=0)


def test_functools_reduce():
    def f(xs):
        import operator
        return functools.reduce(operator.add, xs), functools.reduce(lambda a, b: a * b, [1, 2, 3, 4], 1)
    check(f, lambda i: ([T(2), T(2), T(2)],), graphs=1, breaks=0)


def test_itertools_chain_product():
    def f(x):
        out = [x * a + b for a, b in itertools.product([1, 2], [0, 10])]
        flat = list(itertools.chain([1, 2], (3,), range(4, 6)))
        return out, flat
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_itertools_accumulate_islice():
    def f(xs):
        acc = list(itertools.accumulate(xs))
        firsts = list(itertools.islice(range(100), 2, 8, 3))
        return acc, firsts, list(itertools.accumulate([1, 2, 3], lambda a, b: a * b))
    check(f, lambda i: ([T(2), T(2), T(2)],), graphs=1, breaks=0)


def test_itertools_chain_from_iterable_tensors():
    def f(pairs):
        return torch.stack(list(itertools.chain.from_iterable(pairs)))
    check(f, lambda i: ([(T(3), T(3)), (T(3),)],), graphs=1, breaks=0)


def test_function_returning_multiple():
    def stats(x):
        return x.mean(), x.std(), x.shape
    def f(x):
        m, s, shape = stats(x)
        return (x - m) / s, shape
    check(f, shapes((10,)), graphs=1, breaks=0)


def test_higher_order_function():
    def apply_twice(g, x):
        return g(g(x))
    def f(x):
        return apply_twice(torch.sin, x), apply_twice(lambda t: t * 2, x)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_decorated_function():
    def twice(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k) * 2
        return wrapper
    @twice
    def g(x, b=1.0):
        return x + b
    def f(x):
        return g(x), g(x, b=3.0), g.__name__
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_call_torch_function_with_kwargs_dict():
    def f(x):
        kw = {"dim": 1, "keepdim": True}
        return torch.sum(x, **kw), x.mean(**kw)
    check(f, shapes((2, 3)), graphs=1, breaks=0)
