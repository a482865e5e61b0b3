"""PYTEST_DONT_REWRITE

Views and indexing: view/reshape/permute/transpose/expand/unsqueeze/flatten/chunk/
split/unbind, basic and advanced indexing, setitem, in-place ops through views.
"""
import pytest
import torch

from .harness import T, check, flip, shapes


def test_view_reshape():
    def f(x):
        return x.view(2, -1), x.reshape(-1), x.view(x.size(0) * x.size(1), 1)
    check(f, shapes((2, 6)), graphs=1, breaks=0)


def test_permute_transpose():
    def f(x):
        return x.permute(2, 0, 1), x.transpose(0, 2).contiguous(), x.swapaxes(1, 2)
    check(f, shapes((2, 3, 4)), graphs=1, breaks=0)


def test_expand_unsqueeze_squeeze():
    def f(x):
        y = x.unsqueeze(0).expand(3, -1, -1)
        return y + 1, y.squeeze(0).shape, x[None].squeeze(), x.unsqueeze(-1).expand_as(torch.empty(2, 4, 5))
    check(f, shapes((2, 4)), graphs=1, breaks=0)


def test_flatten_unflatten():
    def f(x):
        return x.flatten(), x.flatten(1), torch.flatten(x, 0, 1), x.flatten(1).unflatten(1, (3, 4))
    check(f, shapes((2, 3, 4)), graphs=1, breaks=0)


def test_chunk_split_unbind():
    def f(x):
        a, b = x.chunk(2, dim=1)
        parts = x.split([1, 3], dim=1)
        rows = x.unbind(0)
        return a * b, parts[1].sum(), rows[-1] + rows[0], len(rows)
    check(f, shapes((3, 4)), graphs=1, breaks=0)


def test_split_size_loop():
    def f(x):
        return [p.sum() for p in torch.split(x, 2)]
    check(f, shapes((7, 2)), graphs=1, breaks=0)


def test_basic_slicing():
    def f(x):
        return x[1:], x[:, ::2], x[-1], x[..., -2:], x[1:3, 1:-1], x[::2, ::-1] if x.dim() > 5 else x[::3]
    check(f, shapes((4, 5)), graphs=1, breaks=0)


def test_none_and_ellipsis_index():
    def f(x):
        return x[None, ..., None], x[..., 0], x[:, None, 1]
    check(f, shapes((2, 3, 4)), graphs=1, breaks=0)


def test_negative_step_via_flip():
    def f(x):
        return x.flip(0), torch.flip(x, [0, 1]), x.roll(1, 0)
    check(f, shapes((3, 4)), graphs=1, breaks=0)


def test_list_index():
    def f(x):
        return x[[0, 2]], x[:, [1, 1, 0]], x[[0, 1], [2, 0]]
    check(f, shapes((3, 4)), graphs=1, breaks=0)


def test_tensor_index():
    def f(x, idx):
        return x[idx], x[:, idx], torch.index_select(x, 0, idx), x.gather(1, idx.view(1, -1).expand(x.size(0), -1))
    check(f, lambda i: (T(4, 4), torch.tensor([3, 0, 1])), graphs=1, breaks=0)


def test_boolean_mask_index():
    # Data-dependent output shape: dynamo breaks (no dynamic output shapes by default);
    # the eager result must still match.
    def f(x):
        return x[x > 0] * 2
    check(f, shapes((10,)), graphs=None, breaks=None)


def test_masked_fill_and_where_mask():
    def f(x):
        m = x < 0
        return x.masked_fill(m, 0.0), torch.where(m, -x, x)
    check(f, shapes((3, 3)), graphs=1, breaks=0)


def test_setitem_slice():
    def f(x):
        y = x.clone()
        y[0] = 0.0
        y[1:, 1] = torch.ones(2)
        y[..., -1] = y[..., 0] * 3
        return y
    check(f, shapes((3, 3)), graphs=1, breaks=0)


def test_setitem_on_input():
    def f(x, v):
        x[:, 0] = v
        x[-1] += 1
        return x.sum(0)
    check(f, shapes((3, 2), (3,)), graphs=1, breaks=0)


def test_setitem_bool_mask():
    def f(x):
        y = x.clone()
        y[y < 0] = 0.0
        return y
    check(f, shapes((4, 4)), graphs=1, breaks=0)


def test_setitem_tensor_index():
    def f(x, idx):
        y = torch.zeros(5)
        y[idx] = x
        return y
    check(f, lambda i: (T(2), torch.tensor([4, 1])), graphs=1, breaks=0)


def test_view_aliasing_write_through():
    def f(x):
        y = x.view(-1)
        y[0] = 100.0
        t = x.t()
        t.mul_(2)
        return x, y
    check(f, shapes((2, 3)), graphs=1, breaks=0)


def test_inplace_on_input_view_pair():
    # The inputs alias: b is a view of a; deepcopy keeps the aliasing.
    def f(a, b):
        b.add_(1)
        return a.sum()
    def make(i):
        a = T(4, 4)
        return a, a[1:3]
    check(f, make, graphs=1, breaks=0)


def test_narrow_select_diagonal():
    def f(x):
        return x.narrow(1, 1, 2), x.select(0, 1), x.diagonal(), torch.diag(x)
    check(f, shapes((3, 3)), graphs=1, breaks=0)


def test_as_strided_free_unfold():
    def f(x):
        return x.unfold(0, 2, 1), x.repeat(2, 1), x.tile((1, 2)), x.repeat_interleave(2, dim=0)
    check(f, shapes((4, 2)), graphs=1, breaks=0)


def test_index_with_python_int_variable():
    def f(x, k):
        return x[k], x[k:k + 2], x[-k]
    check(f, lambda i: (T(6, 2), 1 + i % 2), graphs=1, breaks=0)


def test_scatter_index_add():
    def f(x, idx, src):
        return x.scatter(0, idx, src), x.index_add(0, idx[:, 0], src), torch.zeros(3, 2).scatter_add_(0, idx, src)
    check(f, lambda i: (T(3, 2), torch.tensor([[0, 1], [2, 0]]), T(2, 2)), graphs=1, breaks=0)


def test_getitem_tuple_variable():
    def f(x):
        idx = (slice(None), 1)
        return x[idx], x[(0,)]
    check(f, shapes((3, 3)), graphs=1, breaks=0)


# --- in-place geometry changes of a view another input aliases (fuzz seed 1354) -------
# After the break, ``e`` and ``v`` (a view of it) are separate inputs of the resumed
# graph sharing one version counter. ``unsqueeze_``/``transpose_`` bump it in eager
# before ``max`` saves ``v``; kiln replays them on ``e`` after its graph, and saved ``v``
# at the version before: the backward was refused ("modified by an inplace operation").

def _geometry_after_break(b):
    e = (b * 1).expand(1, 5, 2)
    v = e[None]
    if e.sum().item() > 0:
        w = v * 2
    else:
        w = v * 3
    e.unsqueeze_(-1)
    e.transpose_(3, 1)
    m = torch.max(v)
    return e + m, w, e.shape, e.stride()


def _saved_before_geometry(b):
    e = (b * 1).expand(1, 5, 2)
    v = e[None]
    if e.sum().item() > 0:
        pass
    m = torch.max(v)            # saves v before e's geometry changes: eager's backward fails
    e.unsqueeze_(-1)
    return m


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_geometry_change_of_an_input_another_views(backend):
    check(_geometry_after_break, lambda i: (flip(i, T(2)).requires_grad_(),), backend=backend,
          backward=True)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_geometry_change_after_a_view_of_it_was_saved(backend):
    import kiln
    kiln.reset()
    try:
        cfn = kiln.compile(_saved_before_geometry, backend=backend)
        for fn in (_saved_before_geometry, cfn):
            b = T(2).requires_grad_()
            out = fn(b)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.backward()
    finally:
        kiln.reset()


# --- an in-place write of no elements to a view another input aliases (fuzz seed 2011) --
# After the break, ``x`` and ``u`` (a view of it) are separate inputs of the resumed
# graph. ``relu_`` of ``u`` writes nothing but bumps the version counter they share, in
# eager before ``mul`` saves ``x``; kiln copied the write into ``u`` after its graph had
# saved ``x`` at the version before: the backward was refused ("modified by an inplace
# operation", of CopySlices). Such a call now runs that graph eagerly.

def _empty_write_after_break(b, w):
    x = b * 1
    u = x.unsqueeze(0) if b.numel() == 0 else x[:0]
    if x.sum().item() > 0:
        y = x * 2
    else:
        y = x * 3
    u.relu_()
    return torch.mul(x, w), y


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("n", [0, 4])
def test_empty_write_to_an_input_another_views(backend, n):
    check(_empty_write_after_break,
          lambda i: (T(n, dtype=torch.float64).requires_grad_(),
                     T(n, dtype=torch.float64).requires_grad_()),
          backend=backend, backward=True)
