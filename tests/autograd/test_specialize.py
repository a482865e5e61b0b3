"""``autograd/specialize.py`` and ``shapes/variants.py``: every size of a stream runs
compiled kernels (a stream of more sizes than the old bound of 32), the variants kept
bounded (least recently used dropped), a stream cycling past the bound not compiling on
every call; each call compared with eager (values, dtypes, strides)."""
import pytest
import torch

import kiln
from kiln.shapes import variants as variants_mod
from kiln.shapes.variants import SizeVariants


@pytest.fixture
def tables(monkeypatch):
    """The SizeVariants tables made while the test runs (one per symbolic aten graph
    a per-size compiler serves)."""
    made = []
    init = SizeVariants.__init__

    def kept(self):
        init(self)
        made.append(self)
    monkeypatch.setattr(variants_mod.SizeVariants, "__init__", kept)
    with kiln.config.patch(suppress_errors=False, perf_fallback=False):
        yield made
    kiln.reset()


def _graphs(c) -> int:
    return sum(len(e.graphs) for e in c.entries)


def _same(got, ref):
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,)):
        assert g.dtype == r.dtype and g.shape == r.shape and g.stride() == r.stride()


def _pointwise_reduce(x):
    y = torch.sin(x) * 2 + x.exp()
    return y, y.sum(-1), x.amax(0)


def test_a_stream_of_forty_sizes_all_compiled(tables):
    """40 sizes (more than the old bound of 32): one symbolic graph after the first
    size, every size compiled (no call runs op by op), each equal to eager."""
    c = kiln.compile(_pointwise_reduce, backend="kiln")
    sizes = list(range(17, 57))
    for s in sizes + sizes[:5]:
        x = torch.randn(s, 24)
        _same(c(x), _pointwise_reduce(x))
    assert _graphs(c) == 2                       # static at 17, dynamic from 18
    (t,) = [t for t in tables if t.compiles]
    assert t.uncompiled_calls == 0
    # newest entry first (as torch.compile): 17 again is a size of the symbolic graph too
    assert t.compiles == len(sizes)
    assert t.compiled_calls == len(sizes) - 1 + 5


def test_a_stream_past_the_bound_runs_new_sizes_uncompiled(tables):
    c = kiln.compile(_pointwise_reduce, backend="kiln")
    with kiln.config.patch(dynamic_specializations=2):
        for s in (17, 18, 19, 20, 21, 18, 22, 21):
            x = torch.randn(s, 8)
            _same(c(x), _pointwise_reduce(x))
    (t,) = [t for t in tables if t.compiles]
    # 18, 19 kept; 20 drops 18, 21 drops 19: the bound's worth dropped, so 18 (gone)
    # and 22 run op by op; 21 is still kept
    assert (t.compiles, t.evictions, t.uncompiled_calls) == (4, 2, 2)
    assert len(t) == 2


@pytest.mark.slow
def test_resnet18_over_a_stream_of_batch_sizes(tables):
    """torchvision's resnet18 (inference, 32 px) over batch sizes in a shuffled order:
    two graphs (batch 5 static, then dynamic), every later size compiled, each equal to
    eager."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()

    def run(x):
        return model(x)
    c = kiln.compile(run)
    sizes = [5, 17, 3, 33, 18, 40, 2, 17]
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, 3, 32, 32)
            got, ref = c(x), model(x)
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
            assert got.dtype == ref.dtype and got.stride() == ref.stride()
    assert _graphs(c) == 2
    (t,) = [t for t in tables if t.compiles]
    assert t.uncompiled_calls == 0 and t.compiles == len(set(sizes)) - 1


def test_one_cpp_library_for_a_stream_of_batch_sizes(tables, tmp_path, monkeypatch):
    """The sizes of a dynamic graph's variants make one C++ text: the batch lifted
    however small (``size_args.lifting``), OpenMP's parallel region decided at run
    time (work below and above ``PARALLEL_WORK``), each size's arguments its own
    (``size_args.each_own``). With the dims merged (``codegen/dim_merge``: one loop over
    the map, the mean's kept and reduced dims one each) the static graph's text, whose
    sizes are all above the lifting minimum, is the dynamic one's too: one compiler run
    in all."""
    import torch.nn.functional as F
    from kiln.kernels.toolchain import cxx_build
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))     # a cold disk cache
    runs = []
    real = cxx_build._run_compiler
    monkeypatch.setattr(cxx_build, "_run_compiler", lambda cmd: (runs.append(cmd), real(cmd))[1])
    w = torch.randn(8, 4, 3, 3)

    def f(x):
        y = F.relu(F.conv2d(x, w, padding=1))
        return y * 2, y.mean((2, 3))
    c = kiln.compile(f, backend="kiln")
    with torch.no_grad():
        for b in (3, 5, 9, 17, 33, 7):       # conv output b*4608: 5 below 32768, 9 above
            x = torch.randn(b, 4, 24, 24)
            _same(c(x), f(x))
    assert _graphs(c) == 2
    (t,) = [t for t in tables if t.compiles]
    assert t.compiles == 5 and t.uncompiled_calls == 0
    assert len(runs) == 1, len(runs)


@pytest.mark.slow
def test_one_triton_module_for_a_stream_of_batch_sizes(tmp_path):
    """The same through the Triton code generator (interpreted, in a child process:
    ``specialize_triton_case.py``): the static graph's module, then one module for
    batches 5, 9, 17 and 7 of the dynamic graph, each call equal to eager."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(here, "specialize_triton_case.py")],
                       env=env, capture_output=True, text=True, cwd=root, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "OK [1, 1, 0, 0, 0]", r.stdout[-2000:]
