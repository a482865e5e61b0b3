"""PYTEST_DONT_REWRITE

Python values: constants and arithmetic, math/operator, containers and their mutating
methods, comprehensions, slices, unpacking, f-strings, membership, identity, chained
comparisons -- alone and mixed with tensors.
"""
import math
import operator

import torch

from .harness import T, check, shapes


def test_int_float_arithmetic():
    def f(x):
        a = 7
        b = a // 2 + a % 3 - 2 ** 3
        c = a / 2 * 1.5 - 0.25
        return x * b + c, b, c
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_bool_none_constants():
    def f(x, flag, opt):
        y = x + 1 if flag else x - 1
        if opt is None:
            y = y * 2
        return y, not flag, opt is None, True and flag, False or flag
    check(f, lambda i: (T(3), i % 2 == 0, None if i < 2 else 3), graphs=1, breaks=0)


def test_str_constants_and_methods():
    def f(x, mode):
        if mode.upper() == "SUM" and mode.startswith("s"):
            r = x.sum()
        else:
            r = x.mean()
        return r, mode + "!", "-".join(["a", mode]), mode.split("u"), len(mode)
    check(f, lambda i: (T(4), ["sum", "mean", "sum"][i]), graphs=1, breaks=0)


def test_fstring():
    def f(x, n):
        name = f"layer_{n}:{x.shape[0]:03d}/{n * 1.5:.2f}"
        return x * n, name, f"{name!r}"
    check(f, lambda i: (T(2), 3), graphs=1, breaks=0)


def test_math_module():
    def f(x):
        s = math.sqrt(16) + math.log(math.e) + math.floor(2.7) + math.ceil(1.1) + math.pi
        return x * s + math.cos(0.0), math.isclose(s, 10.0), math.prod([1, 2, 3])
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_math_on_shape():
    def f(x):
        d = x.shape[-1]
        return x / math.sqrt(d), int(math.log2(d))
    check(f, shapes((2, 8)), graphs=1, breaks=0)


def test_operator_module():
    def f(x, y):
        ops = [operator.add, operator.mul, operator.sub]
        r = [op(x, y) for op in ops]
        return r, operator.getitem(x, 0), operator.neg(y), operator.itemgetter(1)((5, 6)), operator.attrgetter("shape")(x)
    check(f, shapes((3,), (3,)), graphs=1, breaks=0)


def test_operator_inplace_functions():
    def f(x):
        y = x.clone()
        operator.iadd(y, 1)
        n = operator.imul(3, 2)
        return y, n, operator.truth(n), operator.contains([1, 2], 2)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_tuple_ops():
    def f(x):
        t = (1, 2, 3)
        u = t + (4,)
        return x * len(u), u[1:], u[::-1], u.index(3), u.count(2), t * 2, max(t)
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_list_mutation_methods():
    def f(x):
        xs = [x, x + 1]
        xs.append(x * 2)
        xs.extend([x - 1, x - 2])
        xs.insert(1, x * 10)
        last = xs.pop()
        first = xs.pop(0)
        xs.reverse()
        del xs[0]
        xs[0] = xs[0] + 100
        return xs, last, first
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_list_of_ints_sort_remove():
    def f(x):
        ks = [3, 1, 2, 5]
        ks.sort()
        ks.remove(5)
        ks += [9]
        return x * sum(ks), ks, ks.index(9), 2 in ks, ks.copy()
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_dict_ops():
    def f(x):
        d = {"a": x, "b": x * 2}
        d["c"] = d["a"] + d["b"]
        d.update({"e": x - 1}, f=x)
        d.setdefault("a", None)
        d.setdefault("g", x * 0)
        v = d.pop("b")
        got = d.get("zz", 5)
        return d, v, got, list(d.keys()), len(d), "c" in d
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_dict_iteration():
    def f(x):
        d = {"w": 2.0, "b": -1.0}
        out = x
        for k, v in d.items():
            out = out * v if k == "w" else out + v
        return out, [k for k in d], sum(d.values())
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_dict_clear_and_del():
    def f(x):
        d = {1: x, 2: x + 1, 3: x + 2}
        del d[2]
        keep = dict(d)
        d.clear()
        return keep, d, len(keep)
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_set_ops():
    def f(x):
        s = {1, 2, 3}
        s.add(4)
        s.discard(1)
        t = s | {7}
        return x * len(t), 4 in s, sorted(s & {2, 4, 9}), sorted(t - s), frozenset(s) == frozenset({2, 3, 4})
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_list_comprehension():
    def f(x):
        return [x * i for i in range(3)]
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_nested_comprehension_with_condition():
    def f(x):
        return [[x[i] * j for j in range(3) if j != i] for i in range(x.shape[0])]
    check(f, shapes((3, 2)), graphs=1, breaks=0)


def test_dict_and_set_comprehension():
    def f(x):
        d = {f"k{i}": x + i for i in range(3)}
        s = {i % 3 for i in range(10)}
        return d, sorted(s)
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_slice_objects():
    def f(x):
        s = slice(1, None, 2)
        xs = list(range(10))
        return x[s], xs[s], xs[-3:], xs[:-1:3], s.start
    check(f, shapes((6,)), graphs=1, breaks=0)


def test_unpacking():
    def f(x):
        a, b = x.shape
        (c, d), e = (1, 2), 3
        first, *rest = [x, x + 1, x + 2]
        *init, last = (1, 2, 3, 4)
        return first + sum(rest), a * b + c + d + e, init, last
    check(f, shapes((2, 3)), graphs=1, breaks=0)


def test_starred_call_and_literal():
    def g(a, b, c):
        return a * b + c
    def f(x):
        args = [x, 2]
        return g(*args, 1), [*args, 3][2], (*range(2), 5), {**{"a": 1}, "b": 2}
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_in_and_is():
    def f(x, mode):
        modes = ("relu", "tanh")
        y = x.relu() if mode in modes and mode == "relu" else x.tanh()
        return y, mode not in ["gelu"], x is x, mode is not None
    check(f, lambda i: (T(4), ["relu", "tanh", "relu"][i]), graphs=1, breaks=0)


def test_chained_comparison():
    def f(x, n):
        if 0 < n <= 3 < 5:
            return x * n
        return x - n
    check(f, lambda i: (T(3), [2, 7, 3][i]), graphs=1, breaks=0)


def test_int_bool_float_str_constructors():
    def f(x):
        n = int(3.9) + int("4") + int(True)
        y = float(2) + float("1.5")
        return x * n + y, bool(0), bool([1]), str(12), str(n) + "x", int(x.shape[0] / 2)
    check(f, shapes((4,)), graphs=1, breaks=0)


def test_tuple_list_dict_constructors():
    def f(x):
        t = tuple([1, 2])
        l = list((x, x + 1))
        d = dict(a=1, b=2)
        d2 = dict([("k", 3)])
        return t, l, d, d2, list(range(3)), tuple(x.shape)
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_python_scalar_loop_accumulate():
    def f(x):
        total = 0
        for i in range(5):
            total += i * i
        return x + total, total
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_float_special_values():
    def f(x):
        inf = float("inf")
        return torch.clamp(x, max=inf), -inf < 0, math.isinf(inf)
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_integer_division_negative():
    def f(x, n):
        return x * (n // 4) + (n % 4), n // 4, n % -3, -n // 3
    check(f, lambda i: (T(2), -7 + i), graphs=1, breaks=0)


def test_min_max_abs_round_python():
    def f(x):
        a = max(3, 7, 1)
        b = min([4, 2, 9])
        c = abs(-2.5) + round(2.567, 2) + round(3.5)
        return x * a - b + c, pow(2, 5), divmod(17, 5)
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_shape_arithmetic_as_python():
    def f(x):
        b, c, h, w = x.shape
        return x.reshape(b, c * h * w) / (h * w), h * w, x.shape[1:]
    check(f, shapes((2, 3, 4, 5)), graphs=1, breaks=0)


def test_torch_size_ops():
    def f(x):
        s = x.shape
        s2 = s[:-1] + (1,)
        return x.sum(-1).view(s2), s2, s.numel(), torch.Size([2, 3]) == s
    check(f, shapes((2, 3)), graphs=1, breaks=0)


def test_string_format_and_join():
    def f(x):
        parts = ["%d" % i for i in range(3)]
        return x * len(parts), ",".join(parts), "{}-{}".format(1, "a"), "abc".replace("b", "x")
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_bytes_tuple_compare():
    def f(x):
        return x * 2, (1, 2) < (1, 3), [1, 2] == [1, 2], "a" < "b"
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_dtype_and_device_values():
    def f(x):
        dt = torch.float64 if x.dtype == torch.float32 else torch.float32
        return x.to(dt), dt, dt.is_floating_point, str(x.device), x.device.type
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_walrus_and_ternary():
    def f(x):
        if (n := x.shape[0]) > 2:
            y = x * n
        else:
            y = x
        return y, "big" if n > 2 else "small"
    check(f, lambda i: (T(3 + i),), graphs=1, breaks=0)


def test_enumerate_start_and_zip_three():
    def f(xs):
        out = [t * i for i, t in enumerate(xs, start=1)]
        trip = [a + b + c for a, b, c in zip(xs, xs[1:], xs[2:])]
        return out, trip
    check(f, lambda i: ([T(2) for _ in range(4)],), graphs=1, breaks=0)


def test_min_max_key_default():
    def f(xs):
        longest = max(xs, key=lambda t: t.shape[0])
        shortest = min(xs, key=lambda t: t.shape[0])
        return longest * 2, shortest.sum(), max([], default=-1), min(3, 1, key=lambda v: -v)
    check(f, lambda i: ([T(2), T(5), T(3)],), graphs=1, breaks=0)


def test_list_sort_key_and_del_local():
    def f(x):
        items = [("b", 2), ("a", 3), ("c", 1)]
        items.sort(key=lambda kv: kv[1])
        tmp = x * 2
        y = tmp + 1
        del tmp
        return y * items[0][1], [k for k, _ in items]
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_augmented_assign_on_containers():
    def f(x):
        d = {"a": x}
        d["a"] += 1
        lst = [x, x]
        lst[1] *= 3
        t = (1,)
        t += (2,)
        s = "a"
        s += "b"
        return d, lst, t, s
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_nested_containers_returned():
    def f(x):
        return {"pair": (x, [x + 1, {"deep": x * 2}]), "n": [1, (2, 3)]}
    check(f, shapes((2,)), graphs=1, breaks=0)
