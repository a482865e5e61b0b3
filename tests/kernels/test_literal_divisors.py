"""Triton kernels of a graph without size symbols divide by literal divisors
(``config.triton_literal_divisors``; ``size_args.divisor``), while its other sizes stay
arguments. Checked on the CPU: the plan's text, and the sm_90 PTX Triton compiles from
it, where a literal divisor keeps loads and stores vectors that a divisor read from
``kiln_ks`` (the multiply by a host magic number) makes scalar."""
import importlib.util
import os
import re

import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import compile as kc

aten = torch.ops.aten
triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles for a GPU: needs the real compiler, not the interpreter",
                allow_module_level=True)


def _stem(x):
    """resnet's stem after its convolution and BatchNorm: ReLU and the 3x3 max pool over
    a channels-last activation (the flat index split into four dims by division)."""
    y = aten.relu.default(x)
    return (aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0],)


def _inputs(batch=2):
    x = torch.randn(batch, 64, 40, 40).to(torch.bfloat16)
    return [x.to(memory_format=torch.channels_last)]


def _plan(symbol_values=()):
    gm = fx.symbolic_trace(_stem)
    if symbol_values:
        gm.meta[kc.SYMBOL_VALUES] = symbol_values
    return kc.plan(gm, _inputs(), "triton")


def _ptx(p, tmp_path):
    from triton.backends.compiler import GPUTarget
    from kiln.kernels.toolchain import triton_build
    path = tmp_path / f"mod{abs(hash(p.source))}.py"
    path.write_text(p.source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    old, triton_build.target = triton_build.target, lambda: GPUTarget("cuda", 90, 32)
    try:
        out = []
        for name, params, dtypes, consts, nw, _ in p.kinfo:
            k = getattr(mod, name)
            ck = triton_build.compile_kernel(k, dtypes, consts, {"num_warps": nw})
            out.append(ck.asm["ptx"].split(".entry")[1])
        return out
    finally:
        triton_build.target = old


def _vector_stores(ptx: str) -> int:
    return len(re.findall(r"st\.global[.a-z0-9]*\.v[248]", ptx))


def test_a_static_graph_divides_by_literals_and_stores_vectors(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "kernel_size_args", True)
    p = _plan()
    assert "kiln_udiv" not in p.source.split("def kernel", 1)[1]
    assert "kiln_ks" in p.source          # its other sizes are still arguments
    (ptx,) = _ptx(p, tmp_path)
    assert _vector_stores(ptx) > 0, "the pool's channels-last stores are not vectors"


def test_divisors_as_arguments_make_scalar_stores(tmp_path, monkeypatch):
    """The control: without literal divisors, the same kernel's stores are scalar."""
    monkeypatch.setattr(config, "kernel_size_args", True)
    monkeypatch.setattr(config, "triton_literal_divisors", False)
    p = _plan()
    assert "kiln_udivm" in p.source
    (ptx,) = _ptx(p, tmp_path)
    assert _vector_stores(ptx) == 0


def test_a_symbolic_graphs_divisors_stay_arguments(monkeypatch):
    """A graph specialised from a symbolic one shares its texts across sizes, so its
    divisors (which may come from a symbol) stay size arguments."""
    monkeypatch.setattr(config, "kernel_size_args", True)
    p = _plan(symbol_values=(2,))
    assert "kiln_udivm" in p.source
