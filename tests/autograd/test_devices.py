"""A CUDA program traced on a machine without a GPU: meta stand-ins with the device
recorded. Here (CPU only) the trace, partition and graphs are built and checked for
their recorded devices; where CUDA is available the very same graphs, built from meta
stand-ins without touching the GPU, then run on CUDA tensors and match eager CUDA."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from kiln.autograd import aot_compile, verify_aten_graph
from kiln.autograd.eager_calls import eager_calls
from kiln.autograd.lift import lift
from tests.autograd.helpers import assert_close, grads_of
from tests.autograd.test_aot_eager import ConvBN
from tests.autograd.test_op_sets import Block

CUDA = torch.device("cuda", 0)
has_cuda = torch.cuda.is_available()


class Positional(nn.Module):
    """Factory ops inside the program: their device must come back as the input's."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        pos = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype)
        return self.lin(x + pos) * torch.ones(x.shape[-1], device=x.device)


MODELS = {
    "convbn": (lambda: ConvBN().train(), (4, 3, 10, 10), 1e-4),
    "attention": (lambda: Block(), (2, 8, 32), 1e-4),
    "positional": (lambda: Positional(), (3, 8), 1e-5),
}


def _meta_like(t):
    m = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")
    return m.requires_grad_(t.requires_grad)


def _compile_for_cuda(module, shape, profile):
    """aot_compile from meta stand-ins, recording CUDA as every input's device."""
    gm, state = lift(module)
    x = torch.randn(shape, requires_grad=True)
    examples = [_meta_like(t) for t in [*state, x]]
    # as the backends do: aot_eager calls ops through eager's bindings (eager_calls)
    compiler = eager_calls if profile == "eager" else None
    fn = aot_compile(gm, examples, compiler, compiler, compiler, decompositions=profile,
                     devices=[CUDA] * len(examples))
    return fn


def _factory_devices(gm):
    return [n.kwargs["device"] for n in gm.graph.nodes
            if n.op == "call_function" and "device" in n.kwargs]


@pytest.mark.parametrize("profile", ["eager", "core"])
@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_graphs_built_without_a_gpu(name, profile):
    make, shape, _ = MODELS[name]
    torch.manual_seed(0)
    fn = _compile_for_cuda(make(), shape, profile)
    entry, = fn._training.values()
    for g in (entry.fw_module, entry.bw_module):
        verify_aten_graph(g, profile)
        for n in g.graph.nodes:
            if isinstance(n.meta.get("val"), torch.Tensor):
                assert n.meta["device"] == CUDA, n.format_node()
        assert all(torch.device(d) == CUDA for d in _factory_devices(g))
    if name == "positional":
        assert _factory_devices(entry.fw_module)
    if name == "attention" and profile == "eager":
        from kiln.autograd.sdpa import BLHE
        sdpa, = [n for n in entry.fw_module.graph.nodes       # the fused kernel's op
                 if n.target in (torch.ops.kiln.sdpa.default,  # where a GPU can name it
                                 torch.ops.kiln.sdpa_fused.default)]
        assert sdpa.args[-1] == BLHE or sdpa.kwargs.get("layout") == BLHE


@pytest.mark.skipif(not has_cuda, reason="needs a CUDA device (runs on the GPU machine)")
@pytest.mark.parametrize("profile", ["eager", "core"])
@pytest.mark.parametrize("name", list(MODELS))
def test_graphs_traced_without_gpu_run_on_cuda(name, profile):
    make, shape, tol = MODELS[name]
    torch.manual_seed(0)
    module = make()
    ref = copy.deepcopy(module).to(CUDA)
    run = copy.deepcopy(module)
    fn = _compile_for_cuda(run, shape, profile)        # traced on meta, no CUDA touched
    run.to(CUDA)
    # The graph's inputs are the module's state (in lift's order) and the input.
    state = [*dict(run.named_parameters()).values(), *dict(run.named_buffers()).values()]
    x = torch.randn(shape, device=CUDA)
    xa, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = fn(*state, xa)
    r = ref(xr)
    assert out[0].device.type == "cuda"
    assert_close(out[0], r, rtol=tol, atol=tol)
    ga = grads_of(out, [*state, xa])
    gr = grads_of([r], [*ref.parameters(), *ref.buffers(), xr])
    for a, b in zip(ga, gr):
        assert_close(a, b, rtol=tol, atol=tol)
    for a, b in zip(run.buffers(), ref.buffers()):
        assert_close(a, b, rtol=tol, atol=tol)
    with torch.no_grad():                               # the inference graph too
        out2 = fn(*state, x)
        assert_close(out2[0], ref(x), rtol=tol, atol=tol)
