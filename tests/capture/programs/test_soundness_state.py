"""PYTEST_DONT_REWRITE

Grad mode, requires_grad and global state across graph breaks, on every backend: the
grad mode a call leaves, each output's requires_grad / is_leaf / grad_fn, gradients
that eager leaves None, guards on global torch state, on function defaults and on
class attributes, and internal errors that must never become the program's exception.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

from .harness import Args, T, check

BACKENDS = ["eager", "aot_eager", "kiln"]
backends = pytest.mark.parametrize("backend", BACKENDS)


def _rg(*shape):
    return T(*shape).requires_grad_()


def _x(i):
    return (_rg(3),)


# --- 1. grad mode across graph breaks ---------------------------------------------------

def _break_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        kiln.graph_break()
        y = y + 1
    return y


def _enable_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        with torch.enable_grad():
            z = x * 3
            kiln.graph_break()
            z = z + 1
        y = y + 1
    return y, z


def _no_grad_inside_enable_grad(x):
    with torch.enable_grad():
        y = x * 2
        with torch.no_grad():
            z = x * 3
            kiln.graph_break()
            z = z + 1
        y = y + z
    return y, z


def _set_grad_enabled_call(x):
    torch.set_grad_enabled(False)
    y = x * 2
    kiln.graph_break()
    return y + 1


def _set_grad_enabled_call_restored(x):
    prev = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    y = x * 2
    kiln.graph_break()
    torch.set_grad_enabled(prev)
    return y * x


def _set_grad_enabled_context(x):
    with torch.set_grad_enabled(False):
        y = x * 2
        kiln.graph_break()
        y = y + 1
    with torch.set_grad_enabled(True):
        z = x * 2
    return y, z


def _set_grad_enabled_reentered(x):
    cm = torch.set_grad_enabled(False)
    a = torch.is_grad_enabled()
    torch.set_grad_enabled(True)
    with cm:
        y = x * 2
        b = torch.is_grad_enabled()
    return y, a, b


def _no_grad_then_enable_grad_after_breaks(x):
    with torch.no_grad():
        kiln.graph_break()
        y = x * 2
        with torch.enable_grad():
            z = x * 3
            kiln.graph_break()
            w = z * 2
    return y, z, w


def _inner_no_grad_break(x):
    with torch.no_grad():
        y = x * 2
        kiln.graph_break()
        return y + 1


def _calls_inner_no_grad_break(x):
    return _inner_no_grad_break(x) * x


def _raises_in_no_grad_after_break(x):
    with torch.no_grad():
        y = x * 2
        kiln.graph_break()
        raise ValueError("boom")
    return y


def _user_error_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        kiln.graph_break()
        z = y @ torch.ones(4, 4)
    return z


def _inference_mode_block(x):
    with torch.inference_mode():
        y = x * 2
        kiln.graph_break()
        y = y + 1
    return y, y.is_inference()


GRAD_MODE_PROGRAMS = [_break_in_no_grad, _enable_inside_no_grad, _no_grad_inside_enable_grad,
                      _set_grad_enabled_call, _set_grad_enabled_call_restored,
                      _set_grad_enabled_context, _set_grad_enabled_reentered,
                      _no_grad_then_enable_grad_after_breaks, _calls_inner_no_grad_break,
                      _raises_in_no_grad_after_break, _user_error_in_no_grad,
                      _inference_mode_block]


@backends
@pytest.mark.parametrize("program", GRAD_MODE_PROGRAMS, ids=lambda f: f.__name__.strip("_"))
def test_grad_mode_after_the_call(backend, program):
    check(program, _x, backend=backend, backward=True)


@backends
@pytest.mark.parametrize("program", [_enable_inside_no_grad, _set_grad_enabled_call_restored,
                                     _set_grad_enabled_context, _break_in_no_grad],
                         ids=lambda f: f.__name__.strip("_"))
def test_called_under_no_grad(backend, program):
    """The same programs entered with grad mode off: graphs that turn it on inside."""
    def under_no_grad(x):
        with torch.no_grad():
            return program(x)
    cf = kiln.compile(program, backend=backend)

    def compiled_under_no_grad(x):
        with torch.no_grad():
            return cf(x)
    torch.manual_seed(0)
    x = _rg(3)
    eager = under_no_grad(x)
    compiled = compiled_under_no_grad(x)
    for e, c in zip(eager if isinstance(eager, tuple) else (eager,),
                    compiled if isinstance(compiled, tuple) else (compiled,)):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(c, e)
            assert (c.requires_grad, c.is_leaf) == (e.requires_grad, e.is_leaf)
        else:
            assert c == e
    assert torch.is_grad_enabled()
    kiln.reset()


# --- 2. requires_grad / is_leaf / grad_fn of tensors crossing a break -------------------

def _detach_crosses_break(a):
    d = a.detach()
    kiln.graph_break()
    return d, d * 2


def _detach_and_data(a):
    d = a.detach()
    return d, d * 2, a.data, a.detach()[1:]


def _detach_of_intermediate(a):
    y = a * 2
    return y, y.detach(), y.detach()[1:]


def _detach__crosses_break(a):
    b = a * 2
    b.detach_()
    kiln.graph_break()
    return b, b + 1


def _made_under_no_grad(a):
    with torch.no_grad():
        b = a * 2
    kiln.graph_break()
    return b, b + a


def _factory_requires_grad(a):
    b = torch.ones(3, requires_grad=True)
    kiln.graph_break()
    return b, b * a


def _new_ones_requires_grad(a):
    return a.new_ones(3, requires_grad=True), a * 2


def _requires_grad_after_detach(a):
    b = a.detach().requires_grad_()
    c = b * 2
    kiln.graph_break()
    return b, c


@backends
@pytest.mark.parametrize("program", [_detach_crosses_break, _detach_and_data, _detach_of_intermediate,
                                     _detach__crosses_break, _made_under_no_grad,
                                     _factory_requires_grad, _new_ones_requires_grad,
                                     _requires_grad_after_detach],
                         ids=lambda f: f.__name__.strip("_"))
def test_autograd_state_of_outputs(backend, program):
    check(program, _x, backend=backend, backward=True)


def test_vector_matmul_keeps_its_shape():
    """eager squeezes ``v @ M`` in place (squeeze_): an in-place view op."""
    def f(v, m, w):
        return v @ m, m @ v, v @ w, (w * 2).t_().unsqueeze_(0) + 1
    for backend in BACKENDS:
        check(f, lambda i: (_rg(3), _rg(3, 3), _rg(3)), backend=backend, backward=True)
        check(f, lambda i: (T(3), T(3, 3), T(3)), backend=backend)


# --- 3. gradients eager leaves None -----------------------------------------------------

def _input_only_in_dead_value(a, b):
    c = a * 2
    d = b * 2
    kiln.graph_break()
    return d * 3


def _loss_of_one_output(a, b):
    return a * 2, b * 3


def _no_differentiable_path(a, b):
    return a * b, b * 3, a.argmax().float() * b


@backends
@pytest.mark.parametrize("pick", [0, 1, 2])
def test_grad_none_when_the_loss_does_not_reach_an_input(backend, pick):
    def run(fn):
        torch.manual_seed(0)
        a, b = _rg(3), _rg(3)
        outs = fn(a, b)
        outs = outs if isinstance(outs, tuple) else (outs,)
        outs[min(pick, len(outs) - 1)].sum().backward()
        return a.grad, b.grad

    for program in (_input_only_in_dead_value, _loss_of_one_output, _no_differentiable_path):
        kiln.reset()
        for e, c in zip(run(program), run(kiln.compile(program, backend=backend))):
            assert (e is None) == (c is None), f"{program.__name__}: eager grad {e}, compiled {c}"
            if e is not None:
                torch.testing.assert_close(c, e)
    kiln.reset()


# --- 7. in-place ops on non-leaf inputs ---------------------------------------------------

def _inplace_after_break(x):
    y = x * 2
    kiln.graph_break()
    y.add_(1)
    return y


def _inplace_view_op_after_break(x):
    y = x * 2
    kiln.graph_break()
    y.t_()
    return y * 2


def _inplace_on_view_after_break(x):
    y = x * 2
    kiln.graph_break()
    y[0].mul_(3)
    return y


@backends
@pytest.mark.parametrize("program", [_inplace_after_break, _inplace_view_op_after_break,
                                     _inplace_on_view_after_break],
                         ids=lambda f: f.__name__.strip("_"))
def test_inplace_on_non_leaf_crossing_a_break(backend, program):
    check(program, lambda i: (_rg(3, 3),), backend=backend, backward=True)


@backends
def test_inplace_on_non_leaf_argument(backend):
    def f(y):
        y.add_(1)
        return y * 2

    def run(fn):
        torch.manual_seed(0)
        x = _rg(3)
        y = x * 2                       # the argument: not a leaf
        out = fn(y)
        (out.sum() + y.sum()).backward()
        return out, y, x.grad

    eager = run(f)
    compiled = run(kiln.compile(f, backend=backend))
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e)
        assert (c.requires_grad, c.is_leaf) == (e.requires_grad, e.is_leaf)
    kiln.reset()


def _seeded(make):
    torch.manual_seed(0)
    return make()


_STANDINGS = {"leaf": lambda: _seeded(lambda: _rg(3)),
              "view_of_leaf": lambda: _seeded(lambda: _rg(4))[1:],
              "non_leaf": lambda: _seeded(lambda: _rg(3)) * 2}


@backends
@pytest.mark.parametrize("first", list(_STANDINGS))
def test_inplace_on_argument_follows_its_autograd_standing(backend, first):
    """One compiled function called with a leaf, a view of a leaf and a non-leaf that
    require grad: eager refuses the in-place op on the first two; each call is traced
    (and guarded) as what its argument is."""
    def f(y):
        y.mul_(2)
        return y + 1
    cf = kiln.compile(f, backend=backend)
    for name in (first, *[n for n in _STANDINGS if n != first], first):
        make = _STANDINGS[name]
        try:
            expect = f(make())
        except RuntimeError:
            with pytest.raises(RuntimeError, match="leaf"):
                cf(make())
            continue
        torch.testing.assert_close(cf(make()), expect)
    kiln.reset()


# --- 5. global state guards -------------------------------------------------------------

@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _reads_global_state(x):
    return (torch.tensor([1.5, 2.5]) * 2, torch.zeros(2) + x.sum(), torch.arange(3.0),
            torch.is_inference_mode_enabled(), torch.are_deterministic_algorithms_enabled(),
            torch.is_autocast_enabled("cpu"), torch.get_default_dtype())


_STATES = {
    "float64": lambda: _default_dtype(torch.float64),
    "inference_mode": torch.inference_mode,
    "deterministic": _deterministic,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "no_grad": torch.no_grad,
}


def _outcome(fn, x):
    try:
        return fn(x)
    except Exception as e:  # noqa: BLE001  (compared with eager's)
        return e


def _same(e, c):
    if isinstance(e, torch.Tensor):
        torch.testing.assert_close(c, e)
        assert c.dtype == e.dtype and c.is_inference() == e.is_inference()
    else:
        assert c == e, (c, e)


@backends
@pytest.mark.parametrize("state", list(_STATES))
def test_global_state_is_guarded(backend, state):
    """Compiled under the default state, then called under another: never the graph
    traced for the first."""
    def matmul(x):
        return x @ x.new_ones(3, 3), x.sum(), torch.full((2,), 1.5)

    for program in (_reads_global_state, matmul):
        cf = kiln.compile(program, backend=backend)
        x = T(3)
        for ctx in (contextlib.nullcontext, _STATES[state], contextlib.nullcontext):
            with ctx():
                e, c = _outcome(program, x), _outcome(cf, x)
            if isinstance(e, BaseException):
                assert type(c) is type(e), f"eager raised {e!r}, compiled gave {c!r}"
                continue
            for a, b in zip(e, c):
                _same(a, b)
        kiln.reset()


@backends
def test_autocast_compiles_again_without_it(backend):
    def f(x, w):
        return x @ w
    cf = kiln.compile(f, backend=backend)
    x, w = T(4, 4), T(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cf(x, w).dtype == f(x, w).dtype == torch.bfloat16
    torch.testing.assert_close(cf(x, w), f(x, w))
    assert cf(x, w).dtype == torch.float32
    kiln.reset()


@backends
def test_autocast_inside_the_function(backend):
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ torch.ones(3, 3)
        return y
    check(f, lambda i: (T(2, 3),), backend=backend)


def test_autocast_under_fullgraph():
    """CPU autocast is traced (its casts in the graph); another device type's is not."""
    cf = kiln.compile(lambda x: x @ x, backend="eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cf(T(3, 3)).dtype == torch.bfloat16
    torch.set_autocast_enabled("xpu", True)
    try:
        with pytest.raises(kiln.Unsupported):
            cf(T(3, 3))
    finally:
        torch.set_autocast_enabled("xpu", False)
    kiln.reset()


# --- 4. function defaults and class attributes ------------------------------------------

@backends
def test_defaults_assigned_after_compiling(backend):
    def f(x, k=2, *, m=3):
        return x * k + m
    cf = kiln.compile(f, backend=backend)
    x = T(3)
    torch.testing.assert_close(cf(x), f(x))
    f.__defaults__ = (5,)
    torch.testing.assert_close(cf(x), x * 5 + 3)
    f.__kwdefaults__ = {"m": 10}
    torch.testing.assert_close(cf(x), x * 5 + 10)
    f.__kwdefaults__["m"] = 20
    torch.testing.assert_close(cf(x), x * 5 + 20)
    f.__code__ = (lambda x, k=0, *, m=0: x - k - m).__code__
    torch.testing.assert_close(cf(x), x - 5 - 20)
    kiln.reset()


@backends
def test_class_attributes_swapped_after_compiling(backend):
    class C:
        scale = 3.0

        def __init__(self):
            self.v = 2.0

        @property
        def p(self):
            return self.v

        def meth(self, t):
            return t + 1

        @staticmethod
        def s(t):
            return t * 2

        @classmethod
        def c(cls, t):
            return t * cls.scale

    obj = C()

    def f(x):
        return x * obj.p + obj.meth(x) * obj.scale + obj.s(x) + obj.c(x)

    cf = kiln.compile(f, backend=backend)
    x = T(3)
    swaps = [lambda: setattr(C, "p", property(lambda self: self.v * 10)),
             lambda: setattr(C, "meth", lambda self, t: t - 1),
             lambda: setattr(C, "scale", 4.0),
             lambda: setattr(C, "s", staticmethod(lambda t: t * 20)),
             lambda: setattr(C, "c", classmethod(lambda cls, t: t * 30))]
    torch.testing.assert_close(cf(x), f(x))
    for swap in swaps:
        swap()
        torch.testing.assert_close(cf(x), f(x))
    kiln.reset()


@backends
def test_class_of_an_object_made_in_the_frame(backend):
    class D:
        k = 2.0

        def __init__(self, a):
            self.a = a

        def get(self):
            return self.a * self.k

    def f(x):
        return D(x).get()

    cf = kiln.compile(f, backend=backend)
    x = T(3)
    torch.testing.assert_close(cf(x), f(x))
    D.k = 5.0
    torch.testing.assert_close(cf(x), f(x))
    D.__init__ = lambda self, a: setattr(self, "a", a + 1)
    torch.testing.assert_close(cf(x), f(x))
    D.get = lambda self: self.a * 100
    torch.testing.assert_close(cf(x), f(x))
    kiln.reset()


@backends
def test_module_forward_patched_on_its_class(backend):
    lin = torch.nn.Linear(3, 3)

    def f(x):
        return lin(x)

    for cf in (kiln.compile(f, backend=backend), kiln.compile(lin, backend=backend)):
        x = T(2, 3)
        torch.testing.assert_close(cf(x), f(x))
        orig = torch.nn.Linear.forward
        try:
            torch.nn.Linear.forward = lambda self, t: t * 0
            torch.testing.assert_close(cf(x), f(x))
        finally:
            torch.nn.Linear.forward = orig
        torch.testing.assert_close(cf(x), f(x))
    kiln.reset()


# --- 6. internal errors during compile ----------------------------------------------------

@pytest.fixture
def broken_fake_propagation(monkeypatch):
    """kiln's fake propagation fails with an error of its own (a kiln bug)."""
    from kiln.capture import fake

    def broken(*args, **kwargs):
        raise RuntimeError("a kiln bug in shape propagation")
    monkeypatch.setattr(fake, "_pick_device", broken)
    return monkeypatch


def _sin2(x):
    return (x * 2).sin()


@backends
def test_internal_error_falls_back_to_eager_when_suppressed(backend, broken_fake_propagation):
    broken_fake_propagation.setattr(config, "suppress_errors", True)
    cf = kiln.compile(_sin2, backend=backend)
    x = T(3)
    torch.testing.assert_close(cf(x), _sin2(x))
    torch.testing.assert_close(cf(x), _sin2(x))
    kiln.reset()


@backends
def test_internal_error_is_raised_as_kiln_error_and_not_baked(backend, broken_fake_propagation):
    from kiln.capture import fake
    from kiln.capture.errors import InternalError

    cf = kiln.compile(_sin2, backend=backend)
    x = T(3)
    with pytest.raises(InternalError):
        cf(x)
    assert not cf.entries
    broken_fake_propagation.undo()
    assert fake._pick_device.__name__ == "_pick_device"
    torch.testing.assert_close(cf(x), _sin2(x))
    kiln.reset()


def test_keyboard_interrupt_during_tracing_leaves_no_entry(monkeypatch):
    from kiln.capture import fake

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(config, "suppress_errors", True)
    monkeypatch.setattr(fake, "_pick_device", interrupted)
    cf = kiln.compile(_sin2, backend="eager")
    x = T(3)
    with pytest.raises(KeyboardInterrupt):
        cf(x)
    assert not cf.entries and cf.skip is None
    monkeypatch.undo()
    torch.testing.assert_close(cf(x), _sin2(x))
    assert len(cf.entries) == 1
    kiln.reset()


@backends
def test_user_shape_error_is_still_the_users(backend):
    def f(x):
        return F.linear(x, torch.ones(4, 4))
    check(f, lambda i: (T(2, 3),), backend=backend)


# --- 1b. an exception the graph itself raises, inside grad-mode blocks ---------------------

def _index_in_no_grad(x, idx):
    with torch.no_grad():
        y = torch.index_select(x, 0, idx)
    return y * 2


def _index_in_no_grad_after_break(x, idx):
    with torch.no_grad():
        y = x * 2
        kiln.graph_break()
        y = torch.index_select(y, 0, idx)
    return y * 2


def _index_after_bare_set_grad_enabled(x, idx):
    torch.set_grad_enabled(False)
    return torch.index_select(x, 0, idx)


@backends
@pytest.mark.parametrize("program", [_index_in_no_grad, _index_in_no_grad_after_break,
                                     _index_after_bare_set_grad_enabled],
                         ids=lambda f: f.__name__.strip("_"))
def test_grad_mode_after_a_runtime_error_in_the_graph(backend, program):
    """An index out of range is only seen when the graph runs: the grad mode left
    afterwards is eager's (the with-blocks around the op unwound)."""
    cf = kiln.compile(program, backend=backend)
    x = _rg(3)
    cf(x, torch.tensor([0, 1]))
    torch.set_grad_enabled(True)
    modes = []
    for fn in (program, cf):
        with pytest.raises(Exception):
            fn(x, torch.tensor([0, 5]))
        modes.append(torch.is_grad_enabled())
        torch.set_grad_enabled(True)
    assert modes[0] == modes[1]
    kiln.reset()


@backends
def test_functorch_transforms_run_the_function_eagerly(backend):
    def f(x):
        return (x * 2).sin().sum(0)
    cf = kiln.compile(f, backend=backend)
    x = T(4, 3)
    torch.testing.assert_close(torch.vmap(cf)(x), torch.vmap(f)(x))
    torch.testing.assert_close(torch.func.grad(lambda t: cf(t).sum())(x),
                               torch.func.grad(lambda t: f(t).sum())(x))
    torch.testing.assert_close(cf(x), f(x))
    kiln.reset()


@backends
def test_a_users_dispatch_mode_sees_every_op(backend):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    def f(x):
        return (x * 2).sin()
    cf = kiln.compile(f, backend=backend)
    x = T(3)
    cf(x)
    with Count() as eager:
        f(x)
    with Count() as compiled:
        cf(x)
    assert compiled.ops == eager.ops
    kiln.reset()


_LATE = __import__("types").ModuleType("late")


@backends
def test_module_attribute_missing_when_compiled(backend):
    """An AttributeError the trace replays holds only while the attribute is missing."""
    def f(x):
        return x * _LATE.scale
    cf = kiln.compile(f, backend=backend)
    x = T(3)
    with pytest.raises(AttributeError):
        cf(x)
    _LATE.scale = 3.0
    try:
        torch.testing.assert_close(cf(x), x * 3.0)
    finally:
        del _LATE.scale
    kiln.reset()


@backends
def test_a_users_function_mode_sees_every_call(backend):
    from torch.overrides import TorchFunctionMode

    class Log(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls.append(func)
            return func(*args, **(kwargs or {}))

    def f(x):
        return (x * 2).sin()
    cf = kiln.compile(f, backend=backend)
    x = T(3)
    cf(x)
    with Log() as eager:
        f(x)
    with Log() as compiled:
        cf(x)
    assert compiled.calls == eager.calls
    kiln.reset()


@backends
def test_storage_offset_is_the_real_ones(backend):
    def f(x):
        return x * 2, x.storage_offset()
    check(f, lambda i: (T(6)[i + 1:],), backend=backend)
