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


class _Block(torch.nn.Module):
    """Attention + MLP with layer norm: matmuls, softmax, gelu(tanh), views, chunk."""

    def __init__(self, d=16):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.q = torch.nn.Linear(d, 3 * d)
        self.o = torch.nn.Linear(d, d)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d),
                                      torch.nn.GELU(approximate="tanh"),
                                      torch.nn.Linear(4 * d, d))

    def forward(self, x):
        q, k, v = self.q(self.ln(x)).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v
        x = x + self.o(a)
        return x + self.ff(x)


def test_kiln_backend_transformer_block_and_cnn():
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 4, 3), torch.nn.SiLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 5),
        torch.nn.LogSoftmax(-1))
    for m, x in [(_Block(), torch.randn(2, 7, 16)), (cnn, torch.randn(4, 3, 12, 12))]:
        x.requires_grad_(True)
        f = lookup_backend("kiln")(torch.fx.symbolic_trace(m), [x])
        out = f(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        ref = m(x)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        w = torch.randn_like(ref)
        (g,) = torch.autograd.grad((out * w).sum(), [x])
        (r,) = torch.autograd.grad((ref * w).sum(), [x])
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_kiln_backend_keeps_attention_whole(caplog):
    """``F.scaled_dot_product_attention`` reaches the kernel compiler as one
    ``kiln.sdpa_fused`` library call (forward) and ``kiln.sdpa_fused_backward``, not as
    the math path's matmuls
    (which upcast half precision to float32): PyTorch's fused kernels run, as in eager.
    Neither is reported as a fallback."""
    import logging

    import kiln
    import torch.nn.functional as F
    from kiln.debug.logs import set_logs

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sin()

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, requires_grad=True) for _ in range(3))
    set_logs("aot_graphs,fallbacks")
    try:
        with caplog.at_level(logging.INFO, logger="kiln"):
            c = kiln.compile(f, backend="kiln")
            out = c(q, k, v)
    finally:
        set_logs("")
    ref = f(q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), g)
    exp = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    text = caplog.text
    assert "kiln.sdpa_fused.default" in text and "kiln.sdpa_fused_backward.default" in text
    assert "aten.bmm" not in text and "_softmax" not in text
    assert "falls back" not in text
