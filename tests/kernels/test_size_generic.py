"""C++ kernels reused across sizes (``kiln/kernels/codegen/size_args.py``): a graph
compiled at several sizes of one size class runs g++ for the first size only, and
every size matches eager."""
from __future__ import annotations

import weakref

import pytest
import torch

import kiln
from kiln.kernels import compile as kcompile
from kiln.kernels.codegen import size_args
from kiln.kernels.toolchain import cxx_build

from .size_generic_cases import CASES, SIZES, lifting, mlp_training_step_costs, pointwise, run_odd, run_sizes


@pytest.fixture
def gxx(monkeypatch):
    """A running count of C++ compiler runs."""
    runs = []
    real = cxx_build._run_compiler
    monkeypatch.setattr(cxx_build, "_run_compiler", lambda cmd: (runs.append(cmd), real(cmd)))
    return lambda: len(runs)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_build_per_size_class(case, gxx, tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))     # a cold disk cache
    name, fn, make, sizes = case
    costs, _ = run_sizes(fn, make, sizes, "cpp", gxx)
    assert costs[0] >= 1 and costs[1:] == [0] * (len(sizes) - 1), costs


def test_without_size_args_every_size_builds(gxx, tmp_path, monkeypatch):
    """The control: with sizes as literals each size is a new library."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    with lifting(False):
        costs, _ = run_sizes(pointwise, CASES[0][2], SIZES, "cpp", gxx)
    assert all(c >= 1 for c in costs), costs


def test_reuse_across_processes_through_the_disk_cache(gxx, tmp_path, monkeypatch):
    """A graph gone (its library unloaded from this process's table), the next size of
    its class finds the library in the disk cache: no compiler run either."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kcompile, "_LIBRARIES", weakref.WeakValueDictionary())
    costs, alive = run_sizes(pointwise, CASES[0][2], SIZES[:1], "cpp", gxx)
    del alive
    monkeypatch.setattr(kcompile, "_LIBRARIES", weakref.WeakValueDictionary())  # a new process
    costs2, _ = run_sizes(pointwise, CASES[0][2], SIZES[1:], "cpp", gxx)
    assert costs[0] >= 1 and costs2 == [0, 0]


@pytest.mark.parametrize("case", CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_odd_sizes_and_layouts(case):
    run_odd(case[1], "cpp")


def test_source_names_size_arguments():
    """The source names lifted sizes (``ks0``…, one per mark: ``size_args.each_own``)
    and says their values; small sizes stay literals; a reduction's divisor (the
    graph's float constant) is one of them."""
    from .size_generic_cases import reductions, trace
    x, y = torch.randn(20, 37), torch.randn(37)
    cg = kcompile.compile_aten_graph(trace(reductions, (x, y)), [x, y], "cpp",
                                     perf_fallback=False)
    src, vals = cg.artefacts["source"], cg.artefacts["size_args"]
    assert 20 in vals and 37 in vals and 740 in vals
    named = {v: [i for i, w in enumerate(vals) if w == v] for v in (37, 740)}
    assert any(f"ks{i}" in src for i in named[37]) and "x1 < 37" not in src
    assert any(f"float(ks{i})" in src for i in named[740])    # the mean's divisor
    assert not size_args.is_lifted(size_args.size(16)) and size_args.is_lifted(size_args.size(17))


def test_size_constant_is_exact():
    """A float constant becomes an argument only where the type holds it exactly."""
    assert size_args.constant(37.0, torch.float32) is not None
    assert size_args.constant(37.5, torch.float32) is None
    assert size_args.constant(float(2 ** 24 + 2), torch.float32) is None
    assert size_args.constant(300.0, torch.bfloat16) is None
    assert size_args.constant(True, torch.bool) is None


def test_reuse_is_logged(caplog):
    import logging
    from kiln.debug.logs import log_for
    log_for("output_code").setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="kiln.output_code"):
            run_sizes(pointwise, CASES[0][2], SIZES[:2], "cpp", lambda: 0)
    finally:
        log_for("output_code").setLevel(logging.NOTSET)
    assert "C++ library reused for new sizes" in caplog.text


def test_mlp_training_step_through_kiln_compile(gxx, tmp_path, monkeypatch):
    """A small MLP's training step through ``kiln.compile`` at several batch sizes:
    gradients as eager's; g++ runs for the first batch size only."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    costs = mlp_training_step_costs(gxx)
    assert costs[0] >= 1 and costs[1:] == [0, 0], costs
