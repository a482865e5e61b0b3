"""``_foreach_addcdiv_/addcmul_`` with a ``Tensor`` of scalars (what a non-capturable
Adam passes: its step sizes stacked on the CPU) are traced without a graph break: the
meta kernels read the CPU ``scalars`` on the host, so fake propagation (capture, and
the autograd stage's trace) passes them a real CPU tensor of their shape
(``kiln/fast_meta.host_scalars_arg``). Values, and the in-place writes, against eager."""
import pytest
import torch

import kiln


def _update(xs, as_, bs, steps):
    sizes = torch.stack([-0.01 / (1 - 0.9 ** s) for s in steps])
    torch._foreach_addcdiv_(xs, as_, bs, sizes)
    torch._foreach_addcmul_(as_, xs, bs, sizes)
    return sizes


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (5,), ()]
    xs = [torch.randn(s, generator=g) for s in shapes]
    as_ = [torch.randn(s, generator=g) for s in shapes]
    bs = [torch.rand(s, generator=g) + 0.5 for s in shapes]
    return xs, as_, bs, [torch.tensor(float(seed + k + 1)) for k in range(3)]


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_tensor_scalars_are_traced_in_one_graph(backend):
    f = kiln.compile(_update, backend=backend, fullgraph=True)
    for seed in range(3):
        got, want = _inputs(seed), _inputs(seed)
        torch.testing.assert_close(f(*got), _update(*want), rtol=0, atol=0)
        for a, b in zip(got[:3], want[:3]):
            for x, y in zip(a, b):
                torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
