"""The memo of meta results in kiln.capture.fake: identical functional calls reuse the
metadata, every call still gets its own fake tensor, and mutating or aliasing ops are
never memoized."""
import torch

from kiln.capture import fake


def _fakes(*shapes):
    return [fake.to_fake(torch.empty(s)) for s in shapes]


def test_functional_results_are_memoized_as_fresh_tensors():
    fake._MEMO.clear()
    a, b = _fakes((3, 4), (4, 5))
    with fake.FakeMode():
        r1 = torch.mm(a, b)
        n = len(fake._MEMO)
        r2 = torch.mm(a, b)
    assert n >= 1 and len(fake._MEMO) == n  # the second call was a hit
    assert r1 is not r2 and r1.shape == r2.shape == (3, 5) and r1.stride() == r2.stride()
    assert r2.fake_device == a.fake_device


def test_views_and_inplace_ops_are_not_memoized():
    assert not fake._is_functional(torch.ops.aten.add_.Tensor)
    assert not fake._is_functional(torch.ops.aten.view.default)
    assert not fake._is_functional(torch.ops.aten.transpose.int)
    assert fake._is_functional(torch.ops.aten.mm.default)
    (a,) = _fakes((2, 3))
    with fake.FakeMode():
        t = a.t()
        assert t.shape == (3, 2) and t.stride() == (1, 3)
        a.add_(1)  # the in-place op hands back its input
        assert a.add_(1) is a
