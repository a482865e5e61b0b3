"""PYTEST_DONT_REWRITE

Builtins on tensors, objects made inside the compiled function, torch's own C helpers
and ``torch.cond``, traced whole (``fullgraph=True``, one graph) and compared with
eager; a sample also on the ``kiln`` backend. What kiln cannot reproduce exactly is
checked to be a break (``expect_unsupported``).
"""
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

from .harness import TORCH_MODE, T, dynamo_bug, check, expect_unsupported, shapes

PROGRAMS = []
ON_KILN = []
# the kiln backend, and the breaks kiln keeps where torch.compile traces on, are kiln's own
kiln_only = pytest.mark.skipif(TORCH_MODE, reason="kiln's backend or kiln's own break")


def program(*shps, inputs=None, kiln=False, marks=(), backward=False):
    def deco(f):
        f.make_inputs = inputs or shapes(*(shps or ((3,),)))
        f.backward = backward
        PROGRAMS.append(pytest.param(f, marks=marks, id=f.__name__))
        if kiln:
            ON_KILN.append(pytest.param(f, marks=kiln_only, id=f.__name__))
        return f
    return deco


def _grad_inputs(*shps):
    return lambda i: tuple(T(*s).requires_grad_() for s in shps)


# --- builtins on tensors -------------------------------------------------------------
@program(kiln=True)
def max_min_of_0d(x):
    a, b = x.sum(), x.mean()
    return max(a, b), min(a, b)


@program(inputs=_grad_inputs((3,)), backward=True)
def max_of_0d_backward(x):
    return max(x[0] * 2, x[1] * 3) + min(x.sum(), x.prod())


@program((4,))
def max_of_three(x):
    return max(x[0] + 1, x[1] * 1, x[2] * 2)


@program((4,))
def min_of_iterable(x):
    return min([x[i] * i for i in range(4)])


@program((4,), marks=dynamo_bug("max() of tensors as torch.maximum: NaN propagates where eager keeps the first"))
def max_ties_and_nan_pick_eagers(x):
    a = x[0] * 0 + 1
    b = x[1] * 0 + 1          # a tie: eager keeps the first
    n = x[2] * float("nan")   # NaN compares false: eager keeps what it has
    return max(a, b) is not None, max(a, n), max(n, a), min(n, b)


@program((4, 3))
def dunder_len(x):
    return x * x.__len__()


@program((5,))
def len_builtin(x):
    return x * len(x)


@program(inputs=lambda i: (T(3), torch.tensor(i % 3)), kiln=True)
def list_indexed_by_0d_tensor(x, i):
    fs = [x.sin(), x.cos(), x.exp()]
    return fs[i]


@program(inputs=lambda i: (T(3), torch.tensor(i % 2)))
def tuple_of_scales_indexed_by_tensor(x, i):
    scales = (1.5, 2.5)
    return x * scales[i]


@program(inputs=lambda i: (T(2, 3), torch.tensor(-1 - i % 2)))
def negative_tensor_index(x, i):
    return [x[0], x[1]][i] + 1


@program((3,), (3,))
def sum_of_tensor_list(x, y):
    return sum([x, y, x])


@program((3,))
def sum_over_tensor_rows(x):
    return sum(x)


@program((2, 3))
def sum_with_start(x):
    return sum((r for r in x), x[0] * 0 + 1)


@program((3,))
def any_all_of_python_values_next_to_tensors(x):
    flags = [x.dim() == 1, x.numel() > 2]
    return x * 2 if all(flags) and any(flags) else x


# --- objects made inside -------------------------------------------------------------
@program(kiln=True)
def relu_made_inside(x):
    return nn.ReLU()(x)


@program((2, 3))
def softmax_made_inside(x):
    return nn.Softmax(dim=1)(x)


@program((2, 3))
def sequential_made_inside(x):
    return nn.Sequential(nn.ReLU(), nn.Tanh())(x)


@program((2, 3))
def dropout_made_inside_eval(x):
    m = nn.Dropout(0.5)
    m.eval()
    return m(x), m.training


@program((2, 3))
def module_attr_written_inside(x):
    m = nn.LeakyReLU(0.1)
    m.negative_slope = 0.3
    return m(x)


@program((2, 3))
def gelu_tanh_made_inside(x):
    return nn.GELU(approximate="tanh")(x) + nn.Identity()(x)


@program((2, 3, 4))
def flatten_made_inside(x):
    return nn.Flatten(1)(x).sum(1)


@program((2, 3))
def module_list_of_made_modules(x):
    acts = [nn.ReLU(), nn.Sigmoid(), nn.Softplus(beta=2.0)]
    for a in acts:
        x = a(x)
    return x


@program((2, 3))
def partial_of_made_module(x):
    f = functools.partial(nn.LogSoftmax(dim=-1))
    return f(x)


class _Scale(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(x) * self.s


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Scale(3)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.inner(x)) + 1


class _NoInit(nn.Module):
    def forward(self, x):
        return x * 2


class _MyTanh(nn.Tanh):
    pass


@program(kiln=True)
def user_module_made_inside(x):
    return _Scale(2.0)(x)


@program()
def nested_user_modules_made_inside_eval(x):
    b = _Block()
    b.eval()
    return b(x), b.training, b.inner.training, b.inner.act.training


@program()
def user_module_without_init_and_layer_subclass(x):
    return _NoInit()(x) + _MyTanh()(x)


@program(marks=dynamo_bug("breaks: getattr() on nn.Module with pending mutation"))
def user_module_children(x):
    m = _Scale(2)
    return len(list(m.children())), [type(c).__name__ for c in m.modules()], m(x)


# --- torch's own helpers ---------------------------------------------------------------
@program()
def cublas_tf32_query(x):
    return x * 2 if torch._C._get_cublas_allow_tf32() else x - 2


@program(marks=dynamo_bug("breaks: torch.* op returned non-Tensor"))
def cudnn_queries(x):
    a = torch._C._get_cudnn_enabled()
    b = torch.backends.cudnn.allow_tf32
    return x + (1 if a else 2) + (10 if b else 20)


@program()
def autocast_enabled_query(x):
    return x + 1 if torch.is_autocast_enabled() else x - 1


@program()
def any_autocast_query(x):
    return x + 1 if torch._C._is_any_autocast_enabled() else x - 1


@program()
def functorch_transforms_query(x):
    return x + 1 if torch._C._are_functorch_transforms_active() else x - 1


@program()
def privateuse1_name(x):
    return x + len(torch._C._get_privateuse1_backend_name())


@program()
def checkpoint_valid_query(x):
    return x * 2 if torch.autograd._is_checkpoint_valid() else x - 1


@program(marks=dynamo_bug("breaks: torch.* op returned non-Tensor"))
def matmul_precision_query(x):
    return x * 2 if torch.get_float32_matmul_precision() == "highest" else x - 3


@program()
def deterministic_query(x):
    return x * 3 if torch.are_deterministic_algorithms_enabled() else x + 3


@program(marks=dynamo_bug("breaks: torch.* op returned non-Tensor"))
def mkldnn_enabled_query(x):
    return x * 3 if torch._C._get_mkldnn_enabled() else x + 3


# --- torch.cond ------------------------------------------------------------------------
def _flip(*shps):
    return lambda i: tuple((T(*s).abs() + 0.1) * (1 if i % 2 == 0 else -1) for s in shps)


@program(inputs=_flip((3,)), kiln=True)
def cond_lambdas(x):
    return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


@program(inputs=_flip((3,), (3,)))
def cond_two_operands(x, y):
    def tb(a, b):
        return a + b

    def fb(a, b):
        return a - b
    return torch.cond(x.mean() > 0, tb, fb, (x, y))


@program(inputs=_flip((2, 3)))
def cond_tuple_outputs(x):
    return torch.cond(x[0, 0] > 0, lambda t: (t * 2, t.sum(0)), lambda t: (t - 1, t.mean(0)), (x,))


@program(inputs=_flip((3,)))
def cond_closure_and_global(x):
    w = x * 3

    def tb(t):
        return t * w + _BIAS

    def fb(t):
        return t - w
    return torch.cond(x.sum() > 0, tb, fb, [x])


_BIAS = torch.tensor([1.0, 2.0, 3.0])


@program(inputs=_flip((3,)))
def cond_constant_predicate(x):
    return torch.cond(True, lambda t: t + 1, lambda t: t - 1, (x,)), \
        torch.cond(0, lambda t: t * 2, lambda t: t / 2, (x,))


@program(inputs=lambda i: tuple(t.requires_grad_() for t in _flip((3,))(i)), backward=True)
def cond_backward(x):
    return torch.cond(x.sum() > 0, lambda t: (t * 2).sin(), lambda t: t.exp(), (x * 1,))


# --- torch.while_loop ------------------------------------------------------------------
@program(kiln=True)
def while_loop_counter(x):
    return torch.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))


@program()
def while_loop_single_carry(x):
    return torch.while_loop(lambda y: y.abs().sum() < 50, lambda y: y * 2 + 0.5, (x * 1,))


@program(inputs=lambda i: (T(3), torch.tensor(i)))
def while_loop_data_trip_count_and_closure(x, n):
    w = x.sum()
    return torch.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y + w), (torch.tensor(0), x * 1))


@program(inputs=lambda i: (T(3).abs().requires_grad_(),), backward=True)
def while_loop_backward(x):
    return torch.while_loop(lambda y: y.sum() < 50, lambda y: y * 2 + 1, (x * 1,))


@pytest.mark.parametrize("fn", PROGRAMS)
def test_program(fn):
    check(fn, fn.make_inputs, graphs=1, fullgraph=True, backward=fn.backward)


@pytest.mark.parametrize("fn", ON_KILN)
def test_program_on_kiln(fn):
    check(fn, fn.make_inputs, fullgraph=True, backend="kiln")


@kiln_only
@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_cond_with_gradients_on_aot_backends(backend):
    """The autograd stage runs the torch-level graph (one branch) when gradients flow."""
    check(cond_backward, cond_backward.make_inputs, fullgraph=True, backward=True, backend=backend, calls=4)


# --- what stays a break (kiln's own decisions; torch.compile may trace on) ------------------------------------------------------------------
def test_any_all_over_tensors_break():
    """Their Python bool is the tensors' data (torch.compile breaks too)."""
    expect_unsupported(lambda x: (x * 2) if any([x.sum() > 0, x.mean() > 1]) else x, shapes((3,)))
    expect_unsupported(lambda x: (x * 2) if all(x > 0) else x, shapes((3,)))


def _max_written_in_place(x):
    a, b = (x + 1).sum(), (x * 2).sum()
    m = max(a, b)
    m.add_(1)            # eager writes into a or b
    return a, b


def _max_operand_base_written(x):
    y = x * 2
    m = max(y[0], y[1])  # eager's m is a view of y
    y.mul_(3)
    return m


def _max_identity(x):
    a, b = (x + 1).sum(), (x * 2).sum()
    return max(a, b) is a


def _max_of_input_views(x):
    return max(x[0], x[1])


def _helper_writing_max(a, b):
    m = min(a, b)
    m.sub_(1)
    return a + 0, b + 0


def _max_written_in_an_inlined_call(x):
    return _helper_writing_max((x + 1).sum(), (x * 2).sum())


@kiln_only
@pytest.mark.parametrize("fn", [_max_written_in_place, _max_operand_base_written, _max_identity,
                                _max_of_input_views, _max_written_in_an_inlined_call],
                         ids=lambda f: f.__name__.strip("_"))
def test_max_whose_result_is_told_apart_from_its_operand(fn):
    """Eager's max()/min() result *is* an operand: where the program can tell (a write,
    `is`, a view of an input), kiln breaks at the max()/min() call itself — fullgraph
    refuses, and without it the answers are eager's."""
    expect_unsupported(fn, shapes((3,)))
    check(fn, shapes((3,)))


@kiln_only
def test_max_tensor_against_number_breaks():
    """Eager returns the number or the tensor depending on the data (torch.compile
    returns a tensor either way: a different answer)."""
    expect_unsupported(lambda x: max(x.sum(), 0.5), shapes((3,)))


@kiln_only
def test_max_of_inputs_breaks():
    """Eager returns the input tensor itself."""
    expect_unsupported(lambda a, b: max(a, b), lambda i: (torch.tensor(1.0), torch.tensor(2.0)))


@kiln_only
def test_max_of_different_dtypes_breaks():
    expect_unsupported(lambda x: max(x.sum(), x.sum().long()), shapes((3,)))


@kiln_only
def test_list_indexed_by_computed_tensor_breaks():
    expect_unsupported(lambda x: [x, x + 1][x.sum().long() % 2], shapes((3,)))


@kiln_only
def test_list_index_tensor_guard_recompiles():
    def f(x, i):
        return [x + 1, x + 2][i]
    cf = kiln.compile(f, fullgraph=True)
    x = torch.zeros(2)
    assert cf(x, torch.tensor(0))[0] == 1
    assert cf(x, torch.tensor(1))[0] == 2


@kiln_only
def test_linear_made_inside_breaks():
    """Parameters made in the function (random init per call) are not modelled."""
    expect_unsupported(lambda x: nn.Linear(3, 3)(x), shapes((3,)))


@kiln_only
def test_user_module_with_parameters_made_inside_breaks():
    """torch.compile traces the parameter's creation; kiln breaks."""
    class WithParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w
    expect_unsupported(lambda x: WithParam()(x), shapes((3,)))


@kiln_only
def test_user_module_with_own_setattr_made_inside_breaks():
    class Odd(nn.Module):
        def __setattr__(self, name, value):
            super().__setattr__(name, value)

        def forward(self, x):
            return x * 2
    expect_unsupported(lambda x: Odd()(x), shapes((3,)))


@kiln_only
def test_made_module_returned_breaks():
    expect_unsupported(lambda x: (nn.ReLU(), x + 1), shapes((3,)))


@kiln_only
def test_tf32_guard_recompiles():
    def f(x):
        return x * 2 if torch._C._get_cublas_allow_tf32() else x - 2
    cf = kiln.compile(f, fullgraph=True)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert cf(torch.ones(1)).item() == -1
        torch.backends.cuda.matmul.allow_tf32 = True
        assert cf(torch.ones(1)).item() == 2
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@kiln_only
def test_cond_branch_with_side_effect_breaks():
    log = []

    def f(x):
        def tb(t):
            log.append(1)
            return t + 1
        return torch.cond(x.sum() > 0, tb, lambda t: t - 1, (x,))
    expect_unsupported(f, shapes((3,)))


@kiln_only
@pytest.mark.parametrize("branch", [lambda t: t, lambda t: t.view(-1), lambda t: t.reshape(3)])
def test_cond_branch_aliasing_an_operand_breaks(branch):
    """Eager's torch.cond raises on a branch returning (a view of) its operand."""
    expect_unsupported(lambda x: torch.cond((x * 2).sum() > 0, branch, lambda t: t + 1, (x * 2,)),
                       shapes((3,)))


@kiln_only
def test_while_loop_body_changing_shape_breaks():
    expect_unsupported(lambda x: torch.while_loop(lambda y: y.sum() < 5, lambda y: y[:1] + 1, (x * 1,)),
                       shapes((3,)))


@kiln_only
def test_while_loop_body_returning_its_input_breaks():
    """Eager's torch.while_loop raises on a body output aliasing its input."""
    expect_unsupported(lambda x: torch.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, y),
                                                  (torch.tensor(0), x * 1)), shapes((3,)))


@kiln_only
def test_cond_branches_of_different_shapes_break():
    expect_unsupported(lambda x: torch.cond(x.sum() > 0, lambda t: t, lambda t: t.sum(), (x,)), shapes((3,)))
