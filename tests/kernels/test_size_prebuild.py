"""A later size of a stream whose kernels need a compiler run compiles them on a thread
while its calls run the graph op by op (``kernels/size_prebuild.py``); the C++ path
here (``KILN_BACKGROUND_SIZE_BUILDS=1``), Triton's on the GPU."""
import sys
import threading
import time
import types

import pytest
import torch

import kiln
from kiln.debug import timing
from kiln.kernels import compile as compile_mod
from kiln.kernels import plan_process, size_prebuild
from kiln.kernels.toolchain import cxx_build


def _f(x, w):
    return torch.softmax(x @ w, -1).sum(0) + x.mean() * 2


@pytest.fixture
def background(monkeypatch):
    monkeypatch.setattr(kiln.config, "background_size_builds", "1")


def test_a_new_size_class_compiles_on_a_thread_its_calls_run_op_by_op(background, monkeypatch):
    """Every size after the dynamic one made to need a compiler run: its first calls run
    op by op (as eager), values as eager's; once the thread is done (waited for), the
    next call runs the kernels, no call op by op any more."""
    real = compile_mod._needs_compiler
    monkeypatch.setattr(compile_mod, "_needs_compiler", lambda p, t: True)
    monkeypatch.setattr(kiln.config, "perf_fallback", False)   # every call through kiln
    gate, compile_cpp = threading.Event(), cxx_build.compile_cpp

    def gated(source):             # the thread's compile ends when the test says
        if threading.current_thread().name == "kiln-size-prebuild":
            assert gate.wait(60)
        return compile_cpp(source)
    monkeypatch.setattr(cxx_build, "compile_cpp", gated)
    cf = kiln.compile(_f)
    w = torch.randn(16, 16)
    for n in (33, 34):        # static (built here), then the symbolic graph's first size
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    before = size_prebuild.eager_calls
    for n in (35, 36, 35):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    assert size_prebuild.eager_calls - before == 3, "sizes compiling on a thread run op by op"
    gate.set()
    assert kiln.wait_for_compiles(120) and not size_prebuild._pending
    assert timing.totals().get("kernels.background", 0) > 0
    monkeypatch.setattr(compile_mod, "_needs_compiler", real)
    before = size_prebuild.eager_calls
    for n in (35, 36, 34):        # (a size new to the symbolic graph would run op by op)
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    assert size_prebuild.eager_calls == before, "built once the thread is done"


def test_off_builds_every_size_in_the_calling_thread(monkeypatch):
    monkeypatch.setattr(kiln.config, "background_size_builds", "0")
    monkeypatch.setattr(compile_mod, "_needs_compiler", lambda p, t: True)
    cf = kiln.compile(_f)
    w = torch.randn(16, 16)
    before = size_prebuild.eager_calls
    for n in (41, 42, 43, 44):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    assert size_prebuild.eager_calls == before and not size_prebuild._pending


def test_a_llama_stream_compiles_later_size_classes_on_a_thread(background, monkeypatch, tmp_path):
    """A small transformers LLaMA over 10 lengths, cold cache: every C++ library
    compiled after the first size's was compiled on a thread (that size ran op by op
    meanwhile), outputs as eager's in both passes; after the wait, no call runs op by
    op."""
    pytest.importorskip("transformers")
    from benchmarks.dynamic_shapes import llama
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    model, inputs, run, _ = llama("cpu", True)
    cf = kiln.compile(model)
    with torch.no_grad():
        ref = [run(model, x) for x in inputs]
        run(cf, inputs[0])
        misses, before = cxx_build.stats["misses"], size_prebuild.eager_calls
        for x, r in zip(inputs, ref):
            torch.testing.assert_close(run(cf, x), r, atol=1e-4, rtol=1e-4)
        run(cf, inputs[0])        # its size, new to the symbolic graph: planned elsewhere
        kiln.wait_for_compiles(300)
        later_compiles = cxx_build.stats["misses"] - misses
        assert size_prebuild.eager_calls - before >= (1 if later_compiles else 0)
        before = size_prebuild.eager_calls
        for x, r in zip(inputs, ref):
            torch.testing.assert_close(run(cf, x), r, atol=1e-4, rtol=1e-4)
        assert size_prebuild.eager_calls == before


def test_sizes_of_one_class_share_one_compile(background, monkeypatch):
    """Sizes met while their class compiles join that compile (one thread, not one
    each); once it has ended, its source needs no compiler run, though its library is
    neither loaded nor (here, made to look) on disk: a new size of the class builds at
    once."""
    monkeypatch.setattr(kiln.config, "perf_fallback", False)
    gate, compile_cpp = threading.Event(), cxx_build.compile_cpp
    compiles = []

    def gated(source):
        if threading.current_thread().name == "kiln-size-prebuild":
            compiles.append(source)
            assert gate.wait(60)
        return compile_cpp(source)
    monkeypatch.setattr(cxx_build, "compile_cpp", gated)
    interval = sys.getswitchinterval()
    cf = kiln.compile(_f)
    w = torch.randn(16, 16)
    for n in (51, 53):                                 # static, then dynamic
        cf(torch.randn(n, 16), w)
    real = compile_mod._needs_compiler
    monkeypatch.setattr(compile_mod, "_needs_compiler", lambda p, t: True)
    before = size_prebuild.eager_calls
    for n in (55, 57, 59):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    assert size_prebuild.eager_calls - before == 3
    plan_process.wait(60)           # the three plans back, their compile started
    assert len(size_prebuild._pending) == 1, "one compile for the class's three sizes"
    assert abs(sys.getswitchinterval() - size_prebuild.SWITCH_INTERVAL) < 1e-6 < interval - 1e-3
    gate.set()
    assert kiln.wait_for_compiles(120) and not size_prebuild._pending and len(compiles) == 1
    for _ in range(100):            # (the thread restores it just before ``done``)
        if abs(sys.getswitchinterval() - interval) < 1e-6:
            break
        time.sleep(0.01)
    assert abs(sys.getswitchinterval() - interval) < 1e-6, "restored once no compile runs"
    source = compiles[0]
    monkeypatch.setattr(compile_mod, "_needs_compiler", real)
    monkeypatch.setattr(compile_mod, "_LIBRARIES", {})
    monkeypatch.setattr(cxx_build, "library_cached", lambda source: False)
    plan = types.SimpleNamespace(entries=[1], source=source)
    assert size_prebuild.compiled("cpp", source) and not real(plan, "cpp")
    assert real(types.SimpleNamespace(entries=[1], source=source + " "), "cpp")
    before = size_prebuild.eager_calls
    # planned here (a size the planner process plans runs op by op until it is back)
    monkeypatch.setattr(kiln.config, "background_size_plans", False)
    for n in (61, 55):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    assert size_prebuild.eager_calls == before, "the class's compile ended: built at once"


def _g(x, w):
    return torch.softmax(x @ w * 0.75, -1).sum(0) - x.amax() * 3


def test_a_symbolic_graphs_first_size_compiles_on_a_thread_once_a_graph_was_built(
        background, monkeypatch, tmp_path):
    """Automatic dynamic shapes: the first call builds its static graph in the calling
    thread; the second, the symbolic graph's first size, compiles on a thread while
    its call runs op by op; built at its next call once the thread is done. Before
    any graph was built, that first size builds in the calling thread."""
    monkeypatch.setattr(kiln.config, "perf_fallback", False)
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    gate, compile_cpp = threading.Event(), cxx_build.compile_cpp

    def gated(source):
        if threading.current_thread().name == "kiln-size-prebuild":
            assert gate.wait(60)
        return compile_cpp(source)
    monkeypatch.setattr(cxx_build, "compile_cpp", gated)
    monkeypatch.setattr(size_prebuild, "_built", [0])
    w = torch.randn(16, 16)
    cf = kiln.compile(_g, dynamic=True)         # symbolic at once: nothing built before
    before = size_prebuild.eager_calls
    x = torch.randn(21, 16)
    torch.testing.assert_close(cf(x, w), _g(x, w))
    assert size_prebuild.eager_calls == before and not size_prebuild._pending
    cf = kiln.compile(lambda x, w: _g(x, w) * 2)  # automatic: static, then symbolic
    x = torch.randn(3, 16)           # (small sizes: literals in the static graph's text)
    torch.testing.assert_close(cf(x, w), _g(x, w) * 2)
    assert size_prebuild.eager_calls == before
    x = torch.randn(5, 16)
    torch.testing.assert_close(cf(x, w), _g(x, w) * 2)
    plan_process.wait(60)
    assert size_prebuild.eager_calls == before + 1 and len(size_prebuild._pending) == 1
    gate.set()
    assert kiln.wait_for_compiles(120) and not size_prebuild._pending
    torch.testing.assert_close(cf(x, w), _g(x, w) * 2)
    assert size_prebuild.eager_calls == before + 1, "built once the thread is done"


def test_a_size_of_one_in_a_stream_builds_as_a_later_size(background, monkeypatch, tmp_path):
    """Automatic dynamic shapes: once the batch is symbolic, a batch of 1 traces a
    graph of its own (sizes 0 and 1 stay static, as PyTorch's). That graph is one size
    of the stream, so its kernels compile on a thread, its first call op by op
    meanwhile; built once the thread is done. Before the batch became dynamic, a
    batch of 1 builds in the calling thread."""
    monkeypatch.setattr(kiln.config, "perf_fallback", False)
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))    # its library not on disk
    w = torch.randn(16, 16)
    cf = kiln.compile(lambda x, w: _g(x, w) - 1)
    before = size_prebuild.eager_calls
    x = torch.randn(1, 16)
    torch.testing.assert_close(cf(x, w), _g(x, w) - 1)
    assert size_prebuild.eager_calls == before, "not a stream yet: built here"
    cf = kiln.compile(lambda x, w: _g(x, w) + 1)
    for n in (23, 25):                                 # static, then dynamic
        cf(torch.randn(n, 16), w)
    kiln.wait_for_compiles(120)
    before = size_prebuild.eager_calls
    x = torch.randn(1, 16)
    torch.testing.assert_close(cf(x, w), _g(x, w) + 1)
    assert size_prebuild.eager_calls == before + 1, "batch 1 of a stream: op by op at first"
    assert kiln.wait_for_compiles(120)
    for _ in range(2):
        torch.testing.assert_close(cf(x, w), _g(x, w) + 1)
    assert size_prebuild.eager_calls == before + 1, "then built"
    assert sum(len(e.graphs) for e in cf.entries) == 3
