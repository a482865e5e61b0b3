"""Nothing kiln keeps outlives the user's compiled object: a compiled function, its
closure, the tensors the closure holds, its resume functions and graphs are freed once
the user drops the compiled callable; compiling many distinct closures does not grow
memory."""
import gc
import tracemalloc
import weakref

import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", "kiln"]
_BIG = 4 * 1024 * 1024          # float32 elements: 16 MB


def _closure_over_big_tensor(breaks: bool):
    big = torch.randn(_BIG)

    def f(x):
        y = x + big[:3]
        if breaks:
            kiln.graph_break()
        return y * 2

    return f, big


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("breaks", [False, True])
def test_compiled_closure_and_captured_tensor_are_freed(backend, breaks):
    f, big = _closure_over_big_tensor(breaks)
    cf = kiln.compile(f, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), f(x))
    refs = [weakref.ref(o) for o in (f, big, cf)]
    del f, big, cf
    gc.collect()
    alive = [r() is not None for r in refs]
    assert alive == [False, False, False], f"still alive (fn, tensor, compiled): {alive}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_module_is_freed(backend):
    mod = torch.nn.Linear(1024, 1024)
    cm = kiln.compile(mod, backend=backend)
    x = torch.randn(2, 1024)
    torch.testing.assert_close(cm(x), mod(x))
    refs = [weakref.ref(mod), weakref.ref(mod.weight), weakref.ref(cm)]
    del mod, cm
    gc.collect()
    assert [r() is not None for r in refs] == [False, False, False]


def test_reset_still_reaches_live_compiled_functions():
    def f(x):
        return x + 1

    cf = kiln.compile(f, backend="eager")
    cf(torch.randn(2))
    assert cf.entries
    kiln.reset()
    assert not cf.entries


def _live(cls) -> int:
    return sum(1 for o in gc.get_objects() if issubclass(type(o), cls))


def _compile_distinct_closures(n, backend):
    for i in range(n):
        def g(x, i=i):
            y = x + i
            kiln.graph_break()
            return y * 2

        c = kiln.compile(g, backend=backend)
        torch.testing.assert_close(c(torch.ones(3)), (torch.ones(3) + i) * 2)
        del c, g
    gc.collect()


@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_distinct_closures_do_not_grow_memory(backend):
    from kiln.capture.eval_frame import CompiledFunction

    _compile_distinct_closures(5, backend)        # warm: one-time imports and tables
    compiled0, graphs0 = _live(CompiledFunction), _live(torch.fx.GraphModule)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        _compile_distinct_closures(100, backend)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert _live(CompiledFunction) == compiled0
    assert _live(torch.fx.GraphModule) == graphs0
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    # what remains is process-wide memo tables keyed by op metadata and constants
    # (bounded), and torch.fx's own linecache entries: well under 10 KB a closure
    assert growth < 1_000_000, f"{growth / 1e6:.2f} MB kept by 100 dropped closures"


def test_code_objects_are_not_kept_by_kiln():
    """A function made from source at run time (its own code object): once dropped,
    nothing kiln cached for it (decoded bytecode, resume code) keeps its code alive."""
    ns = {"kiln": kiln}
    exec("def made(x):\n    y = x + 1\n    kiln.graph_break()\n    return y * 2\n", ns)
    made = ns.pop("made")
    cf = kiln.compile(made, backend="eager")
    torch.testing.assert_close(cf(torch.ones(2)), torch.full((2,), 4.0))
    ref = weakref.ref(made.__code__)
    del made, cf, ns
    gc.collect()
    assert ref() is None
