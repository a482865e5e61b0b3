"""Writes through views, as functionalization leaves them (``kiln/kernels/lowering/view.py``
and ``lowering_index.py``): ``copy``, ``new_empty_strided``, ``as_strided``,
``as_strided_scatter``, ``slice_scatter`` with a step, ``repeat`` and ``index.Tensor``
with several index tensors — against eager on awkward inputs (non-contiguous, broadcast,
size-1 and odd sizes, storage offsets), asserting that none of them falls back.

Each graph runs through the C++ path here and through the Triton path in a child pytest
with TRITON_INTERPRET=1 (``test_triton_interpreter``; CPU tensors, as ``test_triton.py``).
The ghostnet regression (a view into a fallback's memory read after that memory was
handed to another buffer) is reproduced on a hand-built graph and on a small module."""
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from kiln.kernels import compile_aten_graph
from kiln.kernels.compile import build

aten = torch.ops.aten
F64 = torch.float64
TRITON = os.environ.get("TRITON_INTERPRET") == "1"
TARGETS = [pytest.param("cpp", marks=pytest.mark.skipif(TRITON, reason="C++ run")),
           pytest.param("triton", marks=pytest.mark.skipif(not TRITON,
                                                           reason="needs TRITON_INTERPRET=1"))]


def _run(f, *args, target="cpp", fallbacks=()):
    """Compile ``f`` (aten ops), compare with eager exactly, check what fell back."""
    rt, art = build(fx.symbolic_trace(f), list(args), target)
    got, ref = rt(*args), f(*args)
    assert sorted(art["fallbacks"]) == sorted(fallbacks), art["fallbacks"]
    assert len(got) == len(ref)
    for g, e in zip(got, ref):
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    return art


def _nc(*shape, dtype=F64):
    """A non-contiguous tensor: the transpose of a contiguous one."""
    return torch.randn(*reversed(shape), dtype=dtype).permute(*reversed(range(len(shape))))


# --- the CopySlices pattern: new_empty_strided, copy, as_strided, as_strided_scatter -----
def _copy_slices(g, base):
    """What autograd's CopySlices does with the gradient of an in-place op on a view
    (``base[:, 1:4].relu_()``), as functionalization records it."""
    zeros = aten.mul.Tensor(aten.view.default(base, [60]), 0.0)         # a computed base
    w = aten.as_strided.default(zeros, [3, 4, 5], [20, 5, 1], 0)
    c = aten.copy.default(w, g)
    full = aten.as_strided_scatter.default(zeros, c, [3, 4, 5], [20, 5, 1], 0)
    v = aten.as_strided.default(full, [3, 4, 5], [20, 5, 1], 0)
    e = aten.new_empty_strided.default(v, [3, 4, 5], [20, 5, 1])
    r = aten.copy.default(e, v)
    win = aten.as_strided.default(r, [3, 3, 5], [20, 5, 1], 5)         # r[:, 1:4], offset 5
    grad = aten.mul.Tensor(aten.clone.default(win), aten.gt.Scalar(win, 0.0))
    c2 = aten.copy.default(win, grad)
    out = aten.as_strided_scatter.default(r, c2, [3, 3, 5], [20, 5, 1], 5)
    return (out, aten.sum.dim_IntList(out, [1]), win)


@pytest.mark.parametrize("target", TARGETS)
def test_copy_slices_pattern_is_index_arithmetic(target):
    g = _nc(3, 4, 5)                                   # the gradient, non-contiguous
    art = _run(_copy_slices, g, torch.randn(3, 4, 5, dtype=F64), target=target)
    # views stay views: the only stored values are the base, the scattered window and
    # the results (no kernel copies the gradient more than once)
    assert art["ir"].count("pointwise") <= 5, art["ir"]


@pytest.mark.parametrize("target", TARGETS)
def test_as_strided_windows(target):
    def f(x, y):
        s = aten.add.Tensor(x, 1.0)                                     # (4, 6), computed
        t = aten.permute.default(aten.mul.Tensor(y, 2.0), [1, 0])       # eager: (6, 5) strides (1, 6)
        return (aten.as_strided.default(s, [3, 2], [1, 6], 2),            # transposed, offset
                aten.as_strided.default(s, [5, 4], [4, 1], 3),            # overlapping rows
                aten.as_strided.default(s, [2, 1, 3], [12, 99, 0]),       # size 1, stride 0
                aten.as_strided.default(t, [30], [1], 0),                 # storage order
                aten.as_strided.default(s, [0, 3], [3, 1], 0))            # empty
    _run(f, _nc(4, 6), torch.randn(5, 6, dtype=F64), target=target)


def test_as_strided_of_a_graph_input_falls_back():
    """The storage of an input is the caller's (its offset, what else it holds): aten."""
    def f(x):
        return (aten.as_strided.default(x, [2, 2], [1, 3], 1),)
    base = torch.randn(20, dtype=F64)
    _run(f, base[4:16].view(3, 4), fallbacks=["aten.as_strided.default"])


@pytest.mark.parametrize("target", TARGETS)
def test_as_strided_scatter(target):
    def f(x, s1, s2, s3, y):
        xs = aten.add.Tensor(x, 0.5)
        return (aten.as_strided_scatter.default(xs, s1, [3, 2], [2, 1], 5),    # a run inside
                aten.as_strided_scatter.default(x, s2, [4, 3], [1, 4], 0),     # all, transposed
                aten.as_strided_scatter.default(y, s3, [1, 7], [7, 1], 5),     # input x, size 1
                aten.as_strided_scatter.default(x, aten.mul.Tensor(s2, s2), [4, 3], [3, 1], 0))
    _run(f, _nc(3, 4), torch.randn(3, 2, dtype=F64), _nc(4, 3), torch.randn(1, 7, dtype=F64),
         torch.randn(17, dtype=F64), target=target)


def test_as_strided_scatter_window_with_gaps_falls_back():
    def f(x, s):
        return (aten.as_strided_scatter.default(aten.add.Tensor(x, 1.0), s, [3], [3], 1),)
    _run(f, torch.randn(11, dtype=F64), torch.randn(3, dtype=F64),
         fallbacks=["aten.as_strided_scatter.default"])


@pytest.mark.parametrize("target", TARGETS)
def test_copy_and_new_empty_strided(target):
    def f(x, b, i):
        big = aten.mul.Tensor(x, 3.0)
        view = aten.slice.Tensor(big, 1, 1, 4)                               # into a view
        e = aten.new_empty_strided.default(x, [5, 3], [1, 5])
        return (aten.copy.default(view, b),                                  # broadcast (1, 3)
                aten.copy.default(e, aten.slice.Tensor(big, 1, 0, 3)),       # transposed dst
                aten.copy.default(aten.select.int(big, 1, 0), i),            # int64 -> float64
                aten.copy.default(aten.permute.default(big, [1, 0]), aten.permute.default(x, [1, 0])))
    _run(f, _nc(5, 7), torch.randn(1, 3, dtype=F64), torch.arange(5), target=target)


# --- slice_scatter with a step, repeat, several index tensors ----------------------------
@pytest.mark.parametrize("target", TARGETS)
def test_slice_scatter_with_step(target):
    def f(x, a, b, c, d):
        lazy = aten.mul.Tensor(b, -1.0)
        return (aten.slice_scatter.default(x, a, 1, 1, None, 2),     # odd rows of 5
                aten.slice_scatter.default(x, lazy, 2, 0, 7, 3),     # 0, 3, 6 of 7
                aten.slice_scatter.default(x, c, 0, -3, None, 5),    # one row (step > size)
                # swin's patch merging backward: two steps, nested
                aten.slice_scatter.default(
                    x, aten.slice_scatter.default(aten.slice.Tensor(x, 1, 0, None, 2),
                                                  d, 2, 2, 6, 3), 1, 0, None, 2))
    x = _nc(4, 5, 7)
    _run(f, x, _nc(4, 2, 7), torch.randn(4, 5, 3, dtype=F64), torch.randn(1, 5, 7, dtype=F64),
         _nc(4, 3, 2), target=target)


@pytest.mark.parametrize("target", TARGETS)
def test_repeat(target):
    def f(x, y):
        return (aten.repeat.default(x, [2, 1, 3]),            # tiled dims: i % size
                aten.repeat.default(x, [2, 1, 1, 1]),         # a new leading dim
                aten.repeat.default(y, [1, 4, 1]),            # a size-1 dim tiled: a view
                aten.repeat.default(x, [1, 1, 1]),
                aten.repeat.default(aten.add.Tensor(x, 1.0), [3, 2, 1]))
    _run(f, _nc(3, 5, 2), torch.randn(2, 1, 3, dtype=F64), target=target)


@pytest.mark.parametrize("target", TARGETS)
def test_index_with_several_tensors(target):
    def f(x, i, j, k):
        return (aten.index.Tensor(x, [i, j]),                 # adjacent: in place, broadcast
                aten.index.Tensor(x, [None, i, j]),
                aten.index.Tensor(x, [i, None, k]),           # apart: broadcast dims first
                aten.index.Tensor(x, [i, j, k]),
                aten.index.Tensor(aten.mul.Tensor(x, 2.0), [None, j, k]))
    x = _nc(4, 5, 6)
    i = torch.tensor([[0, -1, 3]])                  # (1, 3), negative wraps
    j = torch.tensor([[1], [-4]], dtype=torch.int32)  # (2, 1), int32
    k = torch.tensor([5, 0, -6])
    _run(f, x, i, j, k, target=target)


def test_index_with_several_tensors_out_of_range_raises():
    def f(x, i, j):
        return (aten.index.Tensor(x, [i, j]),)
    x, i, j = torch.randn(4, 5), torch.tensor([0, 1]), torch.tensor([2, 3])
    rt, art = build(fx.symbolic_trace(f), [x, i, j], "cpp")
    assert art["fallbacks"] == []
    with pytest.raises(IndexError, match="index out of range"):  # eager's type
        rt(x, i, torch.tensor([2, 5]))


# --- the ghostnet regression ---------------------------------------------------------------
def test_view_into_a_fallbacks_memory_outlives_its_last_direct_reader(monkeypatch):
    """ghostnet's wrong gradients (conv_stem's off ~16x): ``copy`` lowered made its
    result a kernel buffer in a reusable memory slot; ``as_strided`` (then a fallback)
    returned a view into that slot; the slot's last *direct* reader was the fallback,
    so a later buffer of the same size took it and the view read that buffer's values.
    With as_strided's own lowering out of the way the fallback path is exercised: the
    aliased buffer must keep its slot (``GraphLowering.pinned``)."""
    from kiln.kernels.lowering import LOWERINGS
    monkeypatch.delitem(LOWERINGS, aten.as_strided.default)

    def f(g, h):
        c = aten.copy.default(h, aten.mul.Tensor(g, 2.0))          # a kernel buffer
        a = aten.as_strided.default(c, [5, 4], [1, 5], 0)          # a view into its memory
        q = aten.add.Tensor(aten.mul.Tensor(h, 3.0), 1.0)          # same size: wants that slot
        m = aten.mm.default(q, aten.permute.default(q, [1, 0]))    # read by a library call
        return (aten.add.Tensor(aten.permute.default(a, [1, 0]),
                                aten.sum.dim_IntList(m, [1], True)),)
    args = [torch.randn(4, 5, dtype=F64), torch.randn(4, 5, dtype=F64)]
    rt, art = build(fx.symbolic_trace(f), args, "cpp")
    assert art["fallbacks"] == ["aten.as_strided.default"]
    torch.testing.assert_close(rt(*args)[0], f(*args)[0])


class _GhostLike(nn.Module):
    """ghostnet's pattern: a slice of a cat (a view) updated in place (``x += shortcut``)
    — autograd's CopySlices in the backward — then an in-place activation."""

    def __init__(self):
        super().__init__()
        self.primary = nn.Conv2d(3, 4, 1)
        self.cheap = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.bn = nn.BatchNorm2d(6)
        self.shortcut = nn.Conv2d(3, 6, 1)

    def forward(self, x):
        x1 = self.primary(x)
        out = torch.cat([x1, self.cheap(x1)], dim=1)[:, :6]
        out += self.shortcut(x)
        return torch.relu_(self.bn(out)).mean(dim=(2, 3))


def test_ghostnet_like_module_gradients_match_eager():
    import copy

    import kiln
    torch.manual_seed(0)
    ref = _GhostLike().to(F64).train()
    mod = copy.deepcopy(ref)
    x = torch.randn(2, 3, 7, 5, dtype=F64)
    kiln.reset()
    try:
        got = kiln.compile(mod, backend="kiln", fullgraph=True)(x)
        want = ref(x)
        torch.testing.assert_close(got, want)
        (got * torch.arange(6, dtype=F64)).sum().backward()
        (want * torch.arange(6, dtype=F64)).sum().backward()
        for (n, p), (_, q) in zip(mod.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=f"grad of {n}")
        for (n, b), (_, c) in zip(mod.named_buffers(), ref.named_buffers()):
            torch.testing.assert_close(b, c, msg=f"buffer {n}")
    finally:
        kiln.reset()


# --- the Triton path ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(TRITON, reason="this is the parent run")
def test_triton_interpreter(tmp_path):
    """This file's ``triton`` cases in a child pytest with TRITON_INTERPRET=1, which must
    be set before triton is first imported."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
           "--rootdir", root, "-k", "triton and not interpreter"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "7 passed" in r.stdout.splitlines()[-1], r.stdout[-2000:]


@pytest.mark.parametrize("pad", [[-1, 2, 1, -2], [-2, -1], [0, 0, -3, 1], [2, -4]])
def test_negative_padding_is_a_lowered_crop(pad):
    """constant_pad_nd with negative pads (the backward of padding) crops by index
    arithmetic instead of falling back."""
    x = torch.randn(6, 7)
    gm = fx.symbolic_trace(lambda t: (torch.ops.aten.constant_pad_nd.default(
        torch.ops.aten.mul.Tensor(t, 2.0), pad, 0.25),))
    rt, arte = build(gm, [x], "cpp")
    assert arte["fallbacks"] == []
    assert torch.equal(rt(x)[0], torch.constant_pad_nd(x * 2.0, pad, 0.25))
