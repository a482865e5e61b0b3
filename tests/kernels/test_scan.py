"""``cumsum`` as an ``ir.Scan`` on the C++ target: every dim, strided and broadcast
inputs, integer and bool inputs (summed as int64), a ``dtype=`` argument, 0-d and empty
tensors, a fused producer, the parallel path — bit for bit against eager, which sums
float32 in double as kiln does."""
import pytest
import torch
import torch.fx as fx

from kiln.kernels import compile_aten_graph

aten = torch.ops.aten


def _check(f, *args):
    c = compile_aten_graph(fx.symbolic_trace(f), list(args), target="cpp")
    got, want = c(*args), f(*args)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.equal(g, e), (g, e)
    assert c.artefacts["fallbacks"] == [], c.artefacts["fallbacks"]
    return c


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cumsum_every_dim_of_a_strided_tensor(dim):
    x = torch.randn(4, 6, 5).transpose(0, 2)              # (5, 6, 4), not contiguous
    c = _check(lambda t: (aten.cumsum.default(aten.mul.Tensor(t, 3.0), dim),), x)
    assert "scan along" in c.artefacts["schedule"]
    assert "mul" in c.artefacts["ir"].splitlines()[-1]     # the producer is in the scan


def test_integer_bool_and_dtype_argument():
    m = torch.randint(0, 2, (3, 9))
    b = m.bool()
    _check(lambda m, b: (aten.cumsum.default(m, 1), aten.cumsum.default(b, 1),
                         aten.cumsum.default(m, 0, dtype=torch.float64),
                         aten.cumsum.default(m, -1, dtype=torch.int32)), m, b)


def test_zero_dim_empty_and_size_one():
    _check(lambda t: (aten.cumsum.default(t, 0),), torch.tensor(2.5))
    _check(lambda t: (aten.cumsum.default(t, 1),), torch.randn(3, 0))
    _check(lambda t: (aten.cumsum.default(t, 0),), torch.randn(1, 7))


def test_long_rows_in_parallel_and_float64():
    _check(lambda t: (aten.cumsum.default(t, 1),), torch.randn(64, 4096))
    _check(lambda t: (aten.cumsum.default(t, 0),), torch.randn(5000, 9, dtype=torch.float64))
