"""PYTEST_DONT_REWRITE

Control flow: loops, break/continue, branches on Python values and on tensor
metadata (guarded; other metadata recompiles), try/except/finally, assert, raise,
grad modes.
"""
import torch

from .harness import T, check, dynamo_bug, shapes


def test_for_loop_range():
    def f(x):
        for i in range(4):
            x = x * 0.5 + i
        return x
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_while_loop_counter():
    def f(x):
        i = 0
        while i < 5:
            x = x.sin()
            i += 2
        return x, i
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_break_continue():
    def f(x):
        for i in range(10):
            if i % 2 == 0:
                continue
            if i > 6:
                break
            x = x + i
        return x
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_while_true_break():
    def f(x):
        n = 1
        while True:
            x = x * 2
            n *= 3
            if n > 20:
                break
        return x, n
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_nested_loops():
    def f(x):
        acc = torch.zeros_like(x)
        for i in range(3):
            for j in range(i):
                acc = acc + x * (i * 10 + j)
        return acc
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_loop_else():
    def f(x, target):
        for k in [1, 2, 3]:
            if k == target:
                x = x + k
                break
        else:
            x = x - 100
        return x
    check(f, lambda i: (T(2), [2, 9, 3][i]), graphs=1, breaks=0)


def test_loop_over_tensor_rows():
    def f(x):
        out = []
        for row in x:
            out.append(row.sum())
        return torch.stack(out)
    check(f, shapes((4, 3)), graphs=1, breaks=0)


def test_branch_on_python_flag():
    def f(x, training):
        if training:
            return x * 2
        return x / 2
    check(f, lambda i: (T(3), i % 2 == 0), graphs=1, breaks=0)


def test_branch_on_ndim_recompiles():
    def f(x):
        if x.ndim == 2:
            return x.sum(1)
        return x * 2
    check(f, lambda i: (T(2, 3) if i % 2 == 0 else T(3),), graphs=1, breaks=0)


def test_branch_on_shape_recompiles():
    def f(x):
        if x.shape[0] > 3:
            return x[:3]
        return torch.cat([x, x])
    check(f, lambda i: (T([5, 2, 7][i], 2),), graphs=1, breaks=0)


def test_branch_on_dtype_recompiles():
    def f(x):
        if x.dtype == torch.float32:
            return x.exp()
        if x.dtype.is_floating_point:
            return x.double().sin()
        return x * 2
    check(f, lambda i: (T(3, dtype=[torch.float32, torch.float64, torch.int64][i]),), graphs=1, breaks=0)


def test_branch_on_requires_grad():
    def f(x):
        if x.requires_grad:
            return x * 2
        return x - 1
    check(f, lambda i: (T(3).requires_grad_(i % 2 == 0),), graphs=1, breaks=0)


def test_branch_on_list_length():
    def f(xs):
        if len(xs) > 2:
            return xs[0] + xs[2]
        return xs[0] * 10
    check(f, lambda i: ([T(2) for _ in range([3, 1, 4][i])],), graphs=1, breaks=0)


def test_branch_on_none_argument():
    def f(x, mask=None):
        if mask is not None:
            x = x.masked_fill(mask, 0.0)
        return x * 2
    check(f, lambda i: (T(4), None if i % 2 else T(4) > 0), graphs=1, breaks=0)


@dynamo_bug("after the KeyError path is compiled, a dict that has the key reuses it (missing guard)")
def test_try_except_caught_keyerror():
    def f(x, d):
        try:
            y = x * d["scale"]
        except KeyError:
            y = x - 1
        return y
    check(f, lambda i: (T(3), {"scale": 2} if i % 2 == 0 else {}), graphs=1, breaks=0)


def test_try_except_raise_inside_caught():
    def g(x):
        raise ValueError("bad")
    def f(x):
        try:
            g(x)
        except ValueError:
            x = x + 1
        return x
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_try_finally():
    def f(x, log):
        try:
            x = x * 2
        finally:
            log.append("done")
        return x
    check(f, lambda i: (T(3), []), graphs=1, breaks=0)


def test_try_except_else_finally_order():
    def f(x):
        order = []
        try:
            order.append("try")
            y = x + 1
        except RuntimeError:
            order.append("except")
            y = x
        else:
            order.append("else")
            y = y * 2
        finally:
            order.append("finally")
        return y, order
    check(f, shapes((3,)), graphs=1, breaks=0)


def test_assert_passing():
    def f(x):
        assert x.dim() == 2, "need a matrix"
        assert x.shape[1] == 3
        return x.sum(1)
    check(f, shapes((2, 3)), graphs=1, breaks=0)


def test_assert_failing():
    def f(x):
        assert x.dim() == 3, "need a 3-d tensor"
        return x + 1
    check(f, shapes((2, 3)))


def test_raise_value_error():
    def f(x, n):
        if n < 0:
            raise ValueError(f"negative: {n}")
        return x * n
    check(f, lambda i: (T(3), [-1, 2, -5][i]))


def test_raise_type_error_from_inlined_call():
    def check_dtype(t):
        if t.dtype != torch.float32:
            raise TypeError("float32 only")
        return t
    def f(x):
        return check_dtype(x) * 2
    check(f, lambda i: (T(3, dtype=[torch.int64, torch.float32, torch.int64][i]),))


@dynamo_bug("the shape error surfaces as TorchRuntimeError, not eager's RuntimeError")
def test_torch_error_reaches_caller():
    def f(x, y):
        return x @ y
    check(f, lambda i: (T(2, 3), T(4, 2)))


def test_python_error_reaches_caller():
    def f(x, d):
        return x * d["missing"]
    check(f, lambda i: (T(2), {"k": 1}))


def test_no_grad_block():
    def f(x, w):
        with torch.no_grad():
            y = x * w
        z = x * w
        return y, z, y.requires_grad, z.requires_grad, torch.is_grad_enabled()
    check(f, lambda i: (T(3), T(3).requires_grad_()), graphs=1, breaks=0)


def test_enable_grad_inside_no_grad():
    def f(x, w):
        with torch.no_grad():
            a = x * w
            with torch.enable_grad():
                b = x * w
            c = a + 1
        return a, b, c
    check(f, lambda i: (T(3), T(3).requires_grad_()), graphs=1, breaks=0)


def test_set_grad_enabled():
    def f(x, w, flag):
        with torch.set_grad_enabled(flag):
            y = (x * w).sum()
        return y, y.requires_grad
    check(f, lambda i: (T(3), T(3).requires_grad_(), i % 2 == 0), graphs=1, breaks=0)


def test_no_grad_decorator_on_inlined_fn():
    @torch.no_grad()
    def g(x, w):
        return x * w
    def f(x, w):
        return g(x, w), x * w
    check(f, lambda i: (T(3), T(3).requires_grad_()), graphs=1, breaks=0)


def test_backward_through_compiled_output():
    # The compiled program returns graph-connected outputs; gradients through them match.
    def f(x, w):
        y = (x * w).sin()
        return y.sum(), y.detach()
    check(f, lambda i: (T(3), T(3).requires_grad_()), graphs=1, breaks=0, backward=True)


def test_backward_through_break():
    def f(x, w):
        a = x * w
        print("break")
        return (a.exp() * w).sum()
    check(f, lambda i: (T(3).requires_grad_(), T(3).requires_grad_()), graphs=2, breaks=1, backward=True)


def test_early_return_in_loop():
    def f(x):
        for i in range(5):
            x = x + 1
            if i == 2:
                return x, i
        return x, -1
    check(f, shapes((2,)), graphs=1, breaks=0)


def test_conditional_expression_chain():
    def f(x, k):
        y = x * 2 if k == 0 else x * 3 if k == 1 else x * 4
        return y
    check(f, lambda i: (T(2), i), graphs=1, breaks=0)


def test_match_statement():
    def f(x, cmd):
        match cmd:
            case ("scale", k):
                return x * k
            case {"shift": s}:
                return x + s
            case _:
                return x
    check(f, lambda i: (T(2), [("scale", 3), {"shift": 1.5}, "noop"][i]), graphs=1, breaks=0)
