"""The ``kiln`` backend end to end: autograd stage + kernel compiler, forward and backward."""
import torch

from kiln.backends import lookup_backend


def test_kiln_backend_mlp_forward_backward():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 4), torch.nn.Softmax(-1))
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(5, 8, requires_grad=True)
    f = lookup_backend("kiln")(gm, [x])
    out = f(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    ref = m(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    w = torch.randn(5, 4)
    (gx,) = torch.autograd.grad((out * w).sum(), [x])
    (rx,) = torch.autograd.grad((ref * w).sum(), [x])
    torch.testing.assert_close(gx, rx, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        x2 = torch.randn(5, 8)
        o = f(x2)
        o = o[0] if isinstance(o, (tuple, list)) else o
        torch.testing.assert_close(o, m(x2), rtol=1e-5, atol=1e-6)
