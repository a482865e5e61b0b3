"""A training forward stores its saved activations in layouts of kiln's choosing
(``lowering/outputs.INTERNAL_OUTPUTS``), while the backward graph was traced on eager's:
a ``view`` there that eager's layout allows may be refused by kiln's
(``GraphLowering._run_recorder`` records it as the reshape the lowering makes).
Found by ``python -m benchmarks.numerics --zoo``: OPT and MobileBERT's training steps
raised "view size is not compatible" from their backward."""
import copy

import torch
import torch.nn.functional as F

import kiln


class _Attention(torch.nn.Module):
    """OPT's attention: the query projection scaled, split into heads by a transpose
    (a permuted view eager saves for the attention's backward)."""

    def __init__(self, width=64, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        b, s, w = x.shape
        split = lambda t: t.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        q = split(self.q(x) * 0.125)
        a = F.scaled_dot_product_attention(q, split(self.k(x)), split(self.v(x)),
                                           is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, s, w))


def _grads(model, x):
    model(x).square().sum().backward()
    return [p.grad for p in model.parameters()]


def test_a_backward_viewing_a_saved_head_split_compiles_and_matches_eager():
    torch.manual_seed(0)
    eager = _Attention().double()
    ours = copy.deepcopy(eager)
    x = torch.randn(2, 8, 64, dtype=torch.float64)
    want = _grads(eager, x)
    with kiln.config.patch(suppress_errors=False, perf_fallback=False):
        got = _grads(kiln.compile(ours, fullgraph=True), x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
