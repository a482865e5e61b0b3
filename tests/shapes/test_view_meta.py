"""kiln/shapes/view_meta.py (``view`` of symbolic sizes, on every PyTorch version) and
fake_ops' fallback for C++ kernels that refuse SymInts."""
import pytest
import torch

from kiln.capture.fake import FakeMode, FakeTensor
from kiln.shapes import fake_ops, view_meta
from kiln.shapes.env import ShapeEnv


def _hint(n):
    return n.node.hint if isinstance(n, torch.SymInt) else n


def _fake_of(real, env, dims):
    """A fake laid out as ``real`` with the sizes of ``dims`` symbolic (strides as
    products of the sizes, as capture makes them)."""
    sizes = [env.new_symbol(f"x.size({d})", f"L['x'].size({d})", n) if d in dims else n
             for d, n in enumerate(real.shape)]
    order = sorted(range(real.dim()), key=lambda d: real.stride(d))
    strides, acc = [0] * real.dim(), 1
    for d in order:
        strides[d] = acc
        acc = acc * sizes[d]
    return FakeTensor(torch.empty_strided(sizes, strides, device="meta"), torch.device("cpu"))


CASES = [   # (real input, symbolic dims, the view's shape from the sizes s)
    (lambda: torch.randn(6, 4), {0}, lambda s: (-1,)),
    (lambda: torch.randn(6, 4), {0}, lambda s: (s[0] // 2, 8)),
    (lambda: torch.randn(6, 4), {0, 1}, lambda s: (s[0], 2, s[1] // 2)),
    (lambda: torch.randn(6, 5, 4), {0, 1}, lambda s: (-1, 4)),
    (lambda: torch.randn(3, 6, 4).transpose(0, 1), {1}, lambda s: (2, 3, s[1], 4)),  # split
    (lambda: torch.randn(3, 6, 4).transpose(0, 1), {0, 1}, lambda s: (s[0], -1, 2, 2)),
    (lambda: torch.randn(5, 1, 4).transpose(0, 1), {0}, lambda s: (-1, 4)),
]


@pytest.mark.parametrize("make,dims,shape", CASES)
def test_a_symbolic_view_has_the_sizes_and_strides_eager_gives(make, dims, shape):
    real = make()
    env = ShapeEnv()
    fake = _fake_of(real, env, dims)
    with FakeMode():
        got = view_meta.view(fake, shape(list(fake.shape)))
    ref = real.view(shape(list(real.shape)))
    assert [_hint(n) for n in got.shape] == list(ref.shape)
    assert [_hint(n) for n in got.stride()] == list(ref.stride())


@pytest.mark.parametrize("make,shape", [
    (lambda: torch.randn(6, 4).t(), (-1,)),          # not one chunk of memory
    (lambda: torch.randn(6, 4), (5, -1)),            # 24 is not a multiple of 5
    (lambda: torch.randn(6, 4), (-1, -1)),
])
def test_a_view_eager_refuses_is_refused(make, shape):
    real = make()
    with pytest.raises(RuntimeError):
        real.view(shape)
    env = ShapeEnv()
    fake = _fake_of(real, env, {0} if real.is_contiguous() else {1})
    with FakeMode(), pytest.raises(RuntimeError):
        view_meta.view(fake, shape)


def test_view_of_a_symbolic_fake_goes_through_kilns_kernel():
    """Through fake dispatch (``Tensor.view``), on any PyTorch: the same two questions
    the C++ kernel asks, s0 % 2 == 0 kept as the guard."""
    env = ShapeEnv()
    fake = _fake_of(torch.randn(6, 4), env, {0})
    s = fake.shape[0]
    with FakeMode():
        y = fake.view(s // 2, 8)
    assert (str(y.shape[0]), y.shape[1], y.stride()) == ("FloorDiv(s0, 2)", 8, (8, 1))
    assert [str(g) for g, _ in env.final_guards()][-1] == "Eq(Mod(s0, 2), 0)"


def test_a_cpp_kernel_refusing_symints_is_decomposed_from_then_on(monkeypatch):
    """An op taken as it is (its C++ kernel) whose kernel converts SymInts to ints (as
    ``stack``'s and ``view``'s do in some PyTorch versions; ``expand``'s here) runs as
    its decomposition instead, and is remembered."""
    aten = torch.ops.aten
    monkeypatch.setattr(fake_ops, "_AS_IS", fake_ops._AS_IS | {aten.expand.default})
    monkeypatch.setattr(fake_ops, "_refused", set())
    env = ShapeEnv()
    fake = _fake_of(torch.randn(6, 1), env, {0})
    s = fake.shape[0]
    with FakeMode():
        y = fake.expand(3, s, 4)
    assert [str(n) for n in y.shape] == ["3", "s0", "4"] and y.stride() == (0, 1, 0)
    assert fake_ops._refused == {aten.expand.default}
