"""Group norm through the ``kiln`` backend: expanded by the autograd stage into
reductions and pointwise ops the kernel compiler fuses (whole, ``native_group_norm``
fell back to aten: 14% of poolformer's graph). Forward and gradients against eager in
float64, on a non-contiguous input, and no fallback in either graph."""
import torch
import torch.nn.functional as F

import kiln
from tests.models.zoo import kernel_graphs


def f(x, w, b):
    return F.group_norm(x * 2, 3, w, b, 1e-5).relu()


def test_group_norm_forward_and_backward_without_fallbacks():
    kiln.reset()
    torch.manual_seed(0)
    x = torch.randn(2, 7, 6, 5, dtype=torch.float64).transpose(2, 3).mul(3)
    x = x[:, :6].requires_grad_()                   # 6 channels in 3 groups, non-contiguous
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 6, 5, 6, dtype=torch.float64)
    with kernel_graphs() as seen:
        out = kiln.compile(f, backend="kiln")(x, w, b)
        grads = torch.autograd.grad(out, (x, w, b), g)
    ref = f(x, w, b)
    ref_grads = torch.autograd.grad(ref, (x, w, b), g)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, e in zip(grads, ref_grads):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)
    assert len(seen) == 2, seen                     # forward and backward graphs
    assert all(fallbacks == [] for _, fallbacks in seen), seen
