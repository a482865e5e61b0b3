"""aot_eager against eager PyTorch: outputs, input/parameter grads, buffer updates."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._python_dispatch

from kiln.autograd import aot_compile, verify_aten_graph
from kiln.autograd.backend import aot_eager
from tests.autograd.helpers import assert_close, clone_inputs, compare_module, grads_of, lift


def _verify_all(fn):
    for entry in fn._training.values():
        verify_aten_graph(entry.fw_module, fn.ops)
        verify_aten_graph(entry.bw_module, fn.ops)
    if fn._inference is not None:
        verify_aten_graph(fn._inference.module, fn.ops)


def _compare_fn(f, inputs, rtol=1e-5, atol=1e-5):
    gm = fx.symbolic_trace(f)
    a, b = clone_inputs(inputs), clone_inputs(inputs)
    fn = aot_eager(gm, a)
    out = fn(*a)
    ref = f(*b)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for x, y in zip(out, ref):
        assert_close(x, y, rtol=rtol, atol=atol)
    for x, y in zip(a, b):           # input mutations
        if isinstance(x, torch.Tensor) and not x.requires_grad:
            assert_close(x, y)
    if any(isinstance(o, torch.Tensor) and o.requires_grad for o in ref):
        for x, y in zip(grads_of(out, a), grads_of(ref, b)):
            assert_close(x, y, rtol=rtol, atol=atol)
    _verify_all(fn)
    return fn, out, a


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.l3(torch.tanh(self.l2(torch.relu(self.l1(x)))))


def test_mlp():
    torch.manual_seed(0)
    fn = compare_module(MLP(), [torch.randn(8, 16)], aot_eager)
    _verify_all(fn)


def test_mlp_input_grad():
    torch.manual_seed(0)
    compare_module(MLP(), [torch.randn(8, 16, requires_grad=True)], aot_eager)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = self.bn2(self.conv2(x))
        return torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)


def test_conv_bn_train():
    torch.manual_seed(0)
    fn = compare_module(ConvBN().train(), [torch.randn(4, 3, 10, 10)], aot_eager,
                        rtol=1e-4, atol=1e-5)
    _verify_all(fn)


def test_conv_bn_eval_no_grad():
    torch.manual_seed(0)
    m = ConvBN().eval()
    with torch.no_grad():
        fn = compare_module(m, [torch.randn(4, 3, 10, 10)], aot_eager, rtol=1e-4)
    assert fn._inference is not None and not fn._training
    _verify_all(fn)


def test_inplace_on_input():
    def f(x, y):
        x.mul_(2)
        y.add_(x)
        return (x + y,)
    _, out, (x, y) = _compare_fn(f, [torch.randn(5), torch.randn(5)])


def test_inplace_on_input_view():
    def f(x, w):
        x[1:3].mul_(2)
        x[0].add_(1)
        x.t()[0].zero_()
        return (x * w,)
    _compare_fn(f, [torch.randn(4, 3), torch.randn(4, 3, requires_grad=True)])


def test_inplace_on_intermediate_view_with_grad():
    def f(x):
        y = x * 2
        y[0].mul_(3)
        y[:, 1:].sin_()
        return (y.sum(1),)
    _compare_fn(f, [torch.randn(3, 4, requires_grad=True)])


def test_inplace_then_read_stale_view():
    def f(x):
        y = x.clone()
        v = y[1]
        y.add_(1)
        return (v * 1, y)
    _compare_fn(f, [torch.randn(3, 2, requires_grad=True)])


def test_output_aliases_input():
    def f(x, y):
        return (x.view(-1), x[0], y * 2)
    fn, out, (x, y) = _compare_fn(f, [torch.randn(3, 4, requires_grad=True),
                                      torch.randn(3)])
    assert out[0].data_ptr() == x.data_ptr()
    assert out[0]._base is x and out[1]._base is x


def test_outputs_alias_each_other():
    def f(x):
        y = x + 1
        return (y, y.view(-1), y[1])
    fn, out, _ = _compare_fn(f, [torch.randn(3, 4, requires_grad=True)])
    assert out[1].data_ptr() == out[0].data_ptr()
    assert out[2].untyped_storage().data_ptr() == out[0].untyped_storage().data_ptr()


def test_mutated_input_returned():
    def f(x):
        x.add_(1)
        return (x,)
    fn, out, (x,) = _compare_fn(f, [torch.randn(4)])
    assert out[0] is x


def test_constant_outputs_pass_through():
    gm = fx.symbolic_trace(lambda x: (x * 2, 3))
    fn = aot_eager(gm, [torch.randn(2)])
    out = fn(torch.ones(2))
    assert out[1] == 3 and torch.equal(out[0], torch.full((2,), 2.0))


def test_dropout_mask_consistent():
    def f(x, w):
        return (torch.nn.functional.dropout(x * w, 0.5, training=True),)
    gm = fx.symbolic_trace(f)
    x = torch.randn(64, 32)
    w = torch.randn(64, 32, requires_grad=True)
    fn = aot_eager(gm, [x, w])
    torch.manual_seed(123)
    out, = fn(x, w)
    out.sum().backward()
    # The gradient is zero exactly where the output is (the mask is drawn once).
    assert torch.equal(w.grad == 0, (out == 0) | (x == 0))
    assert 0.3 < (out == 0).float().mean() < 0.7
    # Same seed, same mask as eager.
    w2 = w.detach().clone().requires_grad_()
    torch.manual_seed(123)
    ref, = f(x, w2)
    ref.sum().backward()
    assert_close(out, ref)
    assert_close(w.grad, w2.grad)
    _verify_all(fn)


def test_no_grad_uses_inference_graph():
    gm = fx.symbolic_trace(lambda x, w: (torch.relu(x @ w),))
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    fn = aot_eager(gm, [x, w])
    with torch.no_grad():
        out, = fn(x, w)
    assert not out.requires_grad and fn._inference is not None
    assert_close(out, torch.relu(x @ w))
    out, = fn(x, w)                         # and training still works
    assert out.requires_grad


def test_retain_graph_and_second_backward_error():
    gm = fx.symbolic_trace(lambda x: (torch.sin(x).exp(),))
    x = torch.randn(5, requires_grad=True)
    fn = aot_eager(gm, [x])
    out, = fn(x)
    out.sum().backward(retain_graph=True)
    g1 = x.grad.clone()
    out.sum().backward()
    assert_close(x.grad, 2 * g1)
    with pytest.raises(RuntimeError):
        out.sum().backward()


def test_double_backward_is_a_clear_error():
    gm = fx.symbolic_trace(lambda x: (x.pow(3),))
    x = torch.randn(5, requires_grad=True)
    fn = aot_eager(gm, [x])
    out, = fn(x)
    g, = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.sum(), x)


def test_mixes_with_eager_ops():
    gm = fx.symbolic_trace(lambda x: (torch.tanh(x) * x,))
    x = torch.randn(6, requires_grad=True)
    fn = aot_eager(gm, [x])
    y = fn(x * 3)[0].cos().sum()
    y.backward()
    x2 = x.detach().clone().requires_grad_()
    z = x2 * 3
    (torch.tanh(z) * z).cos().sum().backward()
    assert_close(x.grad, x2.grad)


def test_compilers_are_called():
    seen = []

    def comp(name):
        def c(gm, ex):
            seen.append((name, len(ex)))
            return gm
        return c
    gm = fx.symbolic_trace(lambda x: (x.sin(),))
    fn = aot_compile(gm, [torch.randn(3, requires_grad=True)], comp("fw"), comp("bw"),
                     comp("inf"))
    fn(torch.randn(3, requires_grad=True))
    with torch.no_grad():
        fn(torch.randn(3))
    assert [s[0] for s in seen] == ["fw", "bw", "inf"]


def test_cuda_device_recorded_on_meta():
    # Traced on meta: a factory op's device comes back as the input's real device.
    from kiln.autograd.trace import trace_joint
    def f(x):
        return (x + torch.ones(3, device=x.device),)
    gm = fx.symbolic_trace(f)
    meta = torch.empty(3, device="meta")
    tr = trace_joint(gm, [meta], train=False, devices=[torch.device("cuda", 0)])
    devs = {n.meta["device"] for n in tr.graph.nodes if "device" in n.meta}
    assert devs == {torch.device("cuda", 0)}
    factory = [n for n in tr.graph.nodes if n.kwargs.get("device") is not None]
    assert factory and all(n.kwargs["device"] == torch.device("cuda", 0) for n in factory)


def test_double_backward_refused_for_non_leaf_inputs_mixed_with_eager_terms():
    # The compiled gradient flows into an eager term with its own second derivative:
    # differentiating the sum again must raise, never drop kiln's term silently.
    gm = fx.symbolic_trace(lambda x, w: ((x * w).pow(3).sum(),))
    w = torch.randn(4, requires_grad=True)
    base = torch.randn(4, requires_grad=True)
    fn = aot_eager(gm, [base * 2, w])
    x = base * 2
    out, = fn(x, w)
    total = out + (base ** 3).sum()
    g, = torch.autograd.grad(total, base, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.sum(), [base, w])
    # first-order gradients are right
    x2, w2 = (base * 2).detach().requires_grad_(), w.detach().requires_grad_()
    ref, = torch.autograd.grad(((x2 * w2).pow(3).sum()), x2)
    assert_close(g, ref * 2 + 3 * base.detach() ** 2)


class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops run inside it, with their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def _conv_bn_step():
    """A compiled ConvBN training call, its output and the ops its backward runs."""
    torch.manual_seed(0)
    m = ConvBN().train()
    gm, state = lift(m)
    x = torch.randn(4, 3, 10, 10)
    fn = aot_eager(gm, [*state, x])
    out = fn(*state, x)
    log = _OpLog()
    with log:
        out[0].sum().backward()
    return fn, state, log


def test_backward_makes_no_zero_gradients_for_running_stats():
    # the new running statistics are outputs the loss never reaches: autograd would
    # fill a zero gradient for each (three per BatchNorm), which the backward never reads
    _, _, log = _conv_bn_step()
    fills = [f for f, _ in log.calls if f.overloadpacket in
             (torch.ops.aten.zeros, torch.ops.aten.zero_, torch.ops.aten.fill_,
              torch.ops.aten.new_zeros, torch.ops.aten.zeros_like)]
    assert not fills, fills


def test_unreached_differentiable_output_adds_nothing():
    # a differentiable output the loss does not use adds nothing to the gradients
    def f(x, w):
        return (x * w, (x + w).sin())

    gm = fx.symbolic_trace(f)
    x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    fn = aot_eager(gm, [x, w])
    a, _ = fn(x, w)
    a.sum().backward()
    assert_close(x.grad, w.detach())
    assert_close(w.grad, x.detach())


def test_mutated_inputs_copied_back_one_dtype_per_foreach_copy():
    # BatchNorm writes float running stats and the int64 num_batches_tracked: one
    # _foreach_copy_ of mixed dtypes takes its slow path (a copy launch per tensor)
    torch.manual_seed(0)
    m = ConvBN().train()
    ref = copy.deepcopy(m)
    gm, state = lift(m)
    x = torch.randn(4, 3, 10, 10)
    fn = aot_eager(gm, [*state, x])
    log = _OpLog()
    with log, torch.no_grad():
        fn(*state, x)
        ref(x)
    copies = [args for f, args in log.calls if f is torch.ops.aten._foreach_copy_.default]
    assert len(copies) == 2
    for dst, src in copies:
        assert len({t.dtype for t in dst} | {t.dtype for t in src}) == 1
    for (name, a), b in zip(m.named_buffers(), ref.buffers()):
        assert_close(a, b, rtol=1e-5, atol=1e-6), name
