"""The cyclic garbage collector is off while a frame compiles and while its kernels build
(kiln/gc_pause.py), and on again afterwards — after a failed compile too — unless it was
off before or ``config.pause_gc`` is unset; results are eager's."""
import gc

import pytest
import torch

import kiln
from kiln import config


def _compile_seeing_gc(fn, *args, backend_error=None):
    """Compile and run ``fn``; whether the collector was on in each backend call."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.isenabled())
        if backend_error is not None:
            raise backend_error
        return gm.forward

    return kiln.compile(fn, backend=backend)(*args), seen


def f(x):
    return torch.sin(x) * 2 + x.cos()


def test_paused_during_the_compile_only():
    assert gc.isenabled()
    x = torch.randn(8)
    out, seen = _compile_seeing_gc(f, x)
    assert seen == [False]
    assert gc.isenabled()
    torch.testing.assert_close(out, f(x))


def test_setting_off_leaves_the_collector_on():
    with config.patch(pause_gc=False):
        _, seen = _compile_seeing_gc(f, torch.randn(8))
    assert seen == [True] and gc.isenabled()


def test_a_collector_already_off_stays_off():
    gc.disable()
    try:
        _, seen = _compile_seeing_gc(f, torch.randn(8))
        assert seen == [False] and not gc.isenabled()
    finally:
        gc.enable()


def test_on_again_after_a_failed_compile():
    with config.patch(suppress_errors=False), pytest.raises(Exception):
        _compile_seeing_gc(f, torch.randn(8), backend_error=ValueError("no"))
    assert gc.isenabled()


def test_paused_while_kernels_build_at_the_first_call(monkeypatch):
    # the autograd stage hands meta examples: forward and backward kernels are built at
    # their first calls, outside the frame's compile
    from kiln.kernels import compile as kernels_compile
    seen = []
    real = kernels_compile.build

    def build(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(kernels_compile, "build", build)
    x = torch.randn(8, requires_grad=True)
    with config.patch(graph_cache=False, perf_fallback=False):
        out = kiln.compile(f)(x)
        assert gc.isenabled()
        out.sum().backward()
    assert seen == [False, False] and gc.isenabled()
    xr = x.detach().clone().requires_grad_(True)
    f(xr).sum().backward()
    torch.testing.assert_close(out, f(xr))
    torch.testing.assert_close(x.grad, xr.grad)


def test_paused_while_a_named_backend_is_imported(monkeypatch):
    # kiln.compile imports a named backend's modules on first use: a full collection set
    # off by that import would walk the user's whole heap before the first call
    from kiln import backends
    seen = []

    def import_module(name):
        seen.append(gc.isenabled())
        return __import__(name, fromlist=["*"])

    monkeypatch.setattr(backends.importlib, "import_module", import_module)
    monkeypatch.setitem(backends._registry, "kiln-test-lazy", "kiln.backends.eager")
    assert backends.lookup_backend("kiln-test-lazy") is backends.eager
    assert seen == [False] and gc.isenabled()
