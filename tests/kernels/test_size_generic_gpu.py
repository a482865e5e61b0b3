"""Size-generic Triton kernels and bounded CUDA-graph recordings on a real GPU (skipped
without CUDA): a new size of a class loads no module and compiles no kernel; a graph's
size variants keep at most ``cudagraph_max_recordings`` recordings, results as eager's."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.kernels import compile_aten_graph
from kiln.kernels.codegen.triton import launcher
from kiln.kernels.runtime.replay_lru import Recordings

from .size_generic_cases import CASES, compare, run_sizes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cuda(make):
    return lambda *sz: tuple(t.cuda() for t in make(*sz))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_module_per_size_class_gpu(case, monkeypatch):
    # the sharing itself, as symbolic graphs use it: a static graph's kernels divide
    # by literals (``config.triton_literal_divisors``), a text per size where they divide
    monkeypatch.setattr(kiln.config, "triton_literal_divisors", False)
    name, fn, make, sizes = case
    costs, alive = run_sizes(fn, _cuda(make), sizes, None, lambda: launcher.stats["loaded"])
    assert costs[0] == 1 and costs[1:] == [0] * (len(sizes) - 1), costs
    for cg in alive:
        assert cg.target == "triton"
    # each size again, now launched directly (the compiled kernels, no Triton JIT)
    for sz, cg in zip(sizes, alive):
        args = _cuda(make)(*sz)
        compare(cg(*args), fn(*args))


def _chain(x, w):
    for _ in range(5):
        x = torch.tanh(x * w + 1).softmax(-1) * 2
    return x.sum(-1), x


def test_cuda_graph_recordings_bounded_across_sizes(monkeypatch):
    """Five sizes of one launch-bound graph sharing a bound of 2 recordings: values as
    eager's on every call; never more than 2 recordings held; a size dropped twice
    makes plain launches."""
    monkeypatch.setattr(kiln.config, "cudagraphs", "1")
    family = Recordings(limit=2)
    graphs = {}
    for rows in (35, 37, 39, 41, 43):
        x, w = torch.randn(rows, 53, device="cuda"), torch.randn(53, device="cuda")
        graphs[rows] = compile_aten_graph(make_fx(_chain)(x, w), [x, w], "triton",
                                          perf_fallback=False, recordings=family)
    replays = []
    for rnd in range(4):
        for rows, cg in graphs.items():
            for _ in range(3):
                x, w = torch.randn(rows, 53, device="cuda"), torch.randn(53, device="cuda")
                compare(cg(x, w), _chain(x, w))
            assert len(family) <= 2
    for cg in graphs.values():
        (rt,) = cg.variants.values()
        replays.append(rt.graphs)
    assert all(r is not None and r.family is family for r in replays)
    assert sum(r.disabled for r in replays) >= 3
    assert all("dropped twice" in r.reason for r in replays if r.disabled)


def test_a_new_size_class_compiles_in_the_workers_while_its_calls_run_op_by_op(monkeypatch):
    """rows 33 (static), 35 (the dynamic graph's first size), 48: a multiple of 16, a
    size class of its own (``tl.multiple_of``), whose module the workers compile while
    its calls run the graph op by op; waited for, its next call loads the prepared
    kernels. Values as eager's throughout."""
    from kiln.kernels import size_prebuild
    monkeypatch.setattr(kiln.config, "perf_fallback", False)
    monkeypatch.setattr(kiln.config, "background_size_builds", "auto")
    cf = kiln.compile(_chain)
    w = torch.randn(53, device="cuda")
    for rows in (33, 35):
        x = torch.randn(rows, 53, device="cuda")
        compare(cf(x, w), _chain(x, w))
    before, prepared = size_prebuild.eager_calls, launcher.stats["kernels_prepared"]
    x = torch.randn(48, 53, device="cuda")
    compare(cf(x, w), _chain(x, w))
    assert size_prebuild.eager_calls == before + 1
    kiln.wait_for_compiles(120)
    for _ in range(3):
        x = torch.randn(48, 53, device="cuda")
        compare(cf(x, w), _chain(x, w))
    assert size_prebuild.eager_calls == before + 1
    assert launcher.stats["kernels_prepared"] > prepared
