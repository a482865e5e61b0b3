"""A C++ segment over more buffers than a ctypes call takes arguments (1024): an
optimizer's update over a GPT-2's parameters and state is one such segment. Its entry
point takes the buffers as one array of pointers, so it is built and run, not left to
eager."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.kernels import compile_aten_graph
from kiln.kernels.compile import EagerGraph

N = 360          # 3 buffers each (two inputs, one output): 1080 pointers


def _update(xs, ys):
    return [x + 0.5 * x * y for x, y in zip(xs, ys)]


@pytest.mark.slow     # g++ over 360 kernels: about 12 s
def test_a_segment_of_more_than_1024_buffers_runs_compiled():
    xs = [torch.randn(64 + i % 5) for i in range(N)]
    ys = [torch.randn(64 + i % 5) for i in range(N)]
    gm = make_fx(lambda *a: _update(list(a[:N]), list(a[N:])))(*xs, *ys)
    compiled = compile_aten_graph(gm, xs + ys, "cpp", perf_fallback=False)
    assert not any(isinstance(v, EagerGraph) for v in compiled.variants.values()), compiled.variants
    out = compiled(*xs, *ys)
    for o, r in zip(out, _update(xs, ys)):
        torch.testing.assert_close(o, r)
