"""kiln/shapes/fake_ops.call_on_fakes: a C++ composite kernel refusing symbolic sizes
(PyTorch 2.11's ``matmul`` of a 3-d tensor reads ``numel()``) is run again under the
Python dispatcher, through the op's Python composite kernel."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.capture.fake import FakeMode, FakeTensor
from kiln.shapes import fake_ops
from kiln.shapes.env import ShapeEnv


def _symbolic_fake():
    env = ShapeEnv()
    s = env.new_symbol("x.size(1)", "L['x'].size(1)", 5)
    return FakeTensor(torch.empty_strided((1, s, 8), (8 * s, 8, 1), device="meta"),
                      torch.device("cpu"))


def _refusing_once(message):
    calls = []

    def fn(a, b):
        calls.append(a)
        if len(calls) == 1:
            raise RuntimeError(message)
        return torch.matmul(a, b)
    return fn, calls


@pytest.mark.parametrize("message", [
    "Cannot call numel() on tensor with symbolic sizes/strides",
    "SymIntArrayRef expected to contain only concrete integers",
    "0 INTERNAL ASSERT FAILED: dispatch_on_subclass called with NO overloaded args that",
])
def test_a_composite_refusing_symbolic_sizes_runs_again(message):
    x, w = _symbolic_fake(), FakeTensor(torch.empty(8, 3, device="meta"), torch.device("cpu"))
    fn, calls = _refusing_once(message)
    with FakeMode():
        out = fake_ops.call_on_fakes(fn, (x, w), {})
    assert len(calls) == 2 and [str(n) for n in out.shape] == ["1", "s0", "3"]


def test_other_errors_and_static_sizes_are_not_retried():
    w = FakeTensor(torch.empty(8, 3, device="meta"), torch.device("cpu"))
    fn, calls = _refusing_once("mat1 and mat2 shapes cannot be multiplied")
    with FakeMode(), pytest.raises(RuntimeError, match="cannot be multiplied"):
        fake_ops.call_on_fakes(fn, (_symbolic_fake(), w), {})
    fn, calls = _refusing_once("Cannot call numel() on tensor with symbolic sizes/strides")
    static = FakeTensor(torch.empty(1, 5, 8, device="meta"), torch.device("cpu"))
    with FakeMode(), pytest.raises(RuntimeError, match="numel"):
        fake_ops.call_on_fakes(fn, (static, w), {})
    assert len(calls) == 1


def test_a_retry_that_never_ends_is_the_refusal_again():
    """A Python kernel that calls its own op again forever under the Python dispatcher
    (``_to_copy`` through ``prims.device_put`` on meta tensors crashed a CI process by
    overflowing the C stack) stops at the retry's recursion limit: the first error is
    raised (a graph break), and the caller's recursion limit is restored."""
    x, w = _symbolic_fake(), FakeTensor(torch.empty(8, 3, device="meta"), torch.device("cpu"))
    calls = []

    def fn(a, b):
        calls.append(a)
        if len(calls) == 1:
            raise RuntimeError("Cannot call numel() on tensor with symbolic sizes/strides")
        return fn(a, b)

    import sys
    limit = sys.getrecursionlimit()
    with FakeMode(), pytest.raises(RuntimeError, match="numel"):
        fake_ops.call_on_fakes(fn, (x, w), {})
    assert sys.getrecursionlimit() == limit and 2 < len(calls) <= fake_ops._RETRY_FRAMES + 2


def _under_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):    # autocast's probe of the op
        return F.linear(x, w).float().sum(-1)


@pytest.mark.parametrize("fn", [
    lambda x, w: F.linear(x, w),
    lambda x, w: torch.matmul(x, w.t()) + x @ x.transpose(1, 2) @ x,
    lambda x, w: _under_autocast(x, w),
    lambda x, w: x[:, None] @ x[:, None].transpose(-1, -2),
    lambda x, w: F.cross_entropy(x.reshape(-1, 8), (x.reshape(-1, 8) @ w).argmax(-1)),
], ids=["linear", "matmul", "linear_autocast", "matmul_4d", "cross_entropy"])
def test_composites_of_a_symbolic_input_are_one_graph(fn):
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    c = kiln.compile(fn, backend="eager", dynamic=True)
    with kiln.config.patch(suppress_errors=False):
        for s in (3, 5, 9):
            x = torch.randn(2, s, 8)
            torch.testing.assert_close(c(x, w), fn(x, w))
    assert c.skip is None and not c._callees
    assert sum(len(e.graphs) for e in c.entries) == 1
    kiln.reset()


def _squeezes(x):
    y = x * 2
    y.squeeze_(1)
    z = (x + 1).unsqueeze_(0)
    w = (x - 1).t_()
    return y, z.transpose_(0, 2), w


@pytest.mark.parametrize("grad", [False, True])
def test_in_place_view_ops_on_symbolic_sizes(grad):
    """``squeeze_`` on a tensor of symbolic sizes (fuzz seed 736 under dynamic shapes)
    crashed the process in PyTorch's C++ kernel: in capture and in the autograd trace it
    now takes the out-of-place view's geometry. A tensor that requires grad runs its graph
    eagerly instead (K0115); values and gradients as eager's, sizes varying."""
    cf = kiln.compile(_squeezes, dynamic=True)
    for n in (3, 5, 4):
        x = torch.randn(1, n, requires_grad=grad)
        xe = x.detach().clone().requires_grad_(grad)
        got, want = cf(x), _squeezes(xe)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride()
            torch.testing.assert_close(g, w)
        if grad:
            sum(o.sum() for o in got).backward()
            sum(o.sum() for o in want).backward()
            torch.testing.assert_close(x.grad, xe.grad)
