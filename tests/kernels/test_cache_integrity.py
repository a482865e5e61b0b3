"""The on-disk cache is untrusted input: a damaged, swapped or misplaced entry is a miss
that is rebuilt (and the next process hits the rebuilt entry), never a wrong value, a
crash or a signal; a cache directory that cannot be written degrades to a private one
with one warning; a failing C++ compiler is a clear error, or with suppress_errors an
eager run with a warning. Each case runs kiln in fresh processes (a library loaded by
one process, or a SIGBUS, would not show in this one), comparing with eager there."""
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

#: Compiles one small program with the kiln backend, compares it with eager, prints
#: the cache counters. Programs "f" and "g" give one graph each (one library, one
#: plan); "train" also runs a backward graph.
SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, kiln
    from kiln import disk_cache
    from kiln.kernels.toolchain import cxx_build as cache
    from kiln.kernels.toolchain import graph_cache
    programs = {"f": lambda x: torch.sin(x) * 2 + 1,
                "g": lambda x: torch.cos(x) - 3,
                "train": lambda x: (torch.tanh(x) * x).sum()}
    fn = programs[sys.argv[1]]
    torch.manual_seed(0)
    x = torch.randn(8, 5, requires_grad=sys.argv[1] == "train")
    got, want = kiln.compile(fn)(x), fn(x)
    ok = bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6))
    if x.requires_grad:
        g1, = torch.autograd.grad(got, x)
        g2, = torch.autograd.grad(want, x)
        ok = ok and bool(torch.allclose(g1, g2, rtol=1e-5, atol=1e-6))
    print(json.dumps({"ok": ok, "so": cache.stats, "graph": graph_cache.stats,
                      "disk": disk_cache.stats}))
""")


def _run(cache_dir, program="f", check=True, **env):
    e = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             KILN_SUPPRESS_ERRORS="0", PYTHONDONTWRITEBYTECODE="1")
    e.pop("KILN_TEST_CACHE_DIR", None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", SCRIPT, program], capture_output=True,
                       text=True, env=e, timeout=300)
    if not check:
        return r
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], f"wrong result\n{r.stderr[-3000:]}"
    out["stderr"] = r.stderr
    return out


def _files(d, suffix):
    return sorted(os.path.join(p, f) for p, _, fs in os.walk(d) for f in fs
                  if f.endswith(suffix))


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """Caches warmed by program f and by program g (made once, copied per test)."""
    base = tmp_path_factory.mktemp("warm")
    for prog in ("f", "g"):
        _run(base / prog, prog)
    return base


@pytest.fixture
def cache(warm, tmp_path):
    """(f's warm cache, a copy for this test; g's warm cache)."""
    d = tmp_path / "cache"
    shutil.copytree(warm / "f", d)
    return d, warm / "g"


def _rebuilt_then_hit(d):
    """Run twice: the first rebuilds the library and the plan, the second hits both."""
    out = _run(d)
    for which in ("so", "graph"):
        assert out[which]["misses"] == 1 and out[which]["hits"] == 0, out
    again = _run(d)
    for which in ("so", "graph"):
        assert again[which]["hits"] == 1 and again[which]["misses"] == 0, again
    assert again["disk"]["rejected"] == 0, again
    return out


def _damage(path, how, other):
    data = open(path, "rb").read()
    if how == "garbage":
        data = os.urandom(len(data))
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "emptied":
        data = b""
    elif how == "swapped":      # another graph's entry (trailer and all) copied over it
        data = open(other, "rb").read()
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", [pytest.param("garbage", marks=pytest.mark.slow), "truncated",
                                 pytest.param("emptied", marks=pytest.mark.slow),
                                 pytest.param("swapped", marks=pytest.mark.slow)])
def test_damaged_entries_are_rebuilt(cache, how):
    """The graph's library (.so) and its plan (.pkl) both damaged the same way."""
    d, other = cache
    for kind in (".so", ".pkl"):
        (path,), (theirs,) = _files(d, kind), _files(other, kind)
        _damage(path, how, theirs)
    out = _rebuilt_then_hit(d)
    assert out["disk"]["rejected"] == 2 and out["stderr"].count("rejected") == 2, out


@pytest.mark.slow
def test_damaged_compiler_probe_verdict_is_rebuilt(cache):
    """The remembered workaround flags of the C++ compiler: garbage there must not
    reach the compiler's command line (nor drop a workaround)."""
    d, _ = cache
    (flags,) = _files(d, ".flags")
    with open(flags, "w") as f:
        f.write("-fno-such-flag --garbage")
    for so in _files(d, ".so"):
        os.unlink(so)                          # so that a library is built again
    out = _run(d)
    assert out["disk"]["rejected"] == 1, out
    assert _run(d)["disk"]["rejected"] == 0


@pytest.mark.slow
def test_entry_paths_that_are_directories(cache):
    d, _ = cache
    paths = _files(d, ".so") + _files(d, ".pkl")
    assert len(paths) == 2
    for path in paths:
        os.unlink(path)
        os.mkdir(path)                         # empty: replaced by the rebuilt entry
    _rebuilt_then_hit(d)
    for path in paths:
        os.unlink(path)
        os.makedirs(os.path.join(path, "x"))   # not empty: left alone, kept privately
    out = _run(d)
    assert out["disk"]["private_writes"] == 2, out
    assert out["stderr"].count("cannot hold compiled artefacts") == 1, out["stderr"]
    assert all(os.path.isdir(p) for p in paths)


@pytest.mark.parametrize("where", ["file", pytest.param("under_file", marks=pytest.mark.slow)])
def test_cache_dir_that_cannot_be_a_directory(tmp_path, where):
    f = tmp_path / "plain-file"
    f.write_text("not a directory")
    d = f if where == "file" else f / "cache"
    out = _run(d)
    assert out["so"]["misses"] == 1 and out["disk"]["private_writes"] >= 1, out
    assert out["stderr"].count("cannot hold compiled artefacts") == 1, out["stderr"]
    assert f.read_text() == "not a directory"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="permissions do not stop root")
def test_read_only_cache_dir(cache):
    """Existing entries are still used; new ones are kept privately, one warning."""
    d, _ = cache
    modes = {}
    for p, dirs, files in os.walk(d):
        for name in dirs + files:
            q = os.path.join(p, name)
            modes[q] = os.stat(q).st_mode
    try:
        for q in list(modes) + [str(d)]:
            os.chmod(q, os.stat(q).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        hit = _run(d, "f")
        assert hit["so"]["hits"] == 1 and hit["disk"]["private_writes"] == 0, hit
        new = _run(d, "g")
        assert new["so"]["misses"] == 1 and new["disk"]["private_writes"] >= 1, new
        assert new["stderr"].count("cannot hold compiled artefacts") == 1, new["stderr"]
    finally:
        for q in [str(d)] + list(modes):
            os.chmod(q, os.stat(q).st_mode | stat.S_IWUSR)


@pytest.fixture
def failing_cxx(tmp_path):
    cxx = tmp_path / "failing-cxx"
    cxx.write_text("#!/bin/sh\necho 'error: the test compiler refuses' >&2\nexit 1\n")
    cxx.chmod(0o755)
    return str(cxx)


@pytest.mark.parametrize("program", ["f", pytest.param("train", marks=pytest.mark.slow)])
def test_failing_compiler_with_suppress_errors_runs_eagerly(tmp_path, failing_cxx, program):
    out = _run(tmp_path / "c", program, CXX=failing_cxx, KILN_SUPPRESS_ERRORS="1")
    err = out["stderr"]
    assert "running that graph with PyTorch eagerly" in err, err
    assert failing_cxx in err and "the test compiler refuses" in err, err


@pytest.mark.parametrize("cxx", ["script", pytest.param("/no/such/compiler", marks=pytest.mark.slow)])
def test_failing_compiler_without_suppress_errors_says_what_failed(tmp_path, failing_cxx,
                                                                   cxx):
    cxx = failing_cxx if cxx == "script" else cxx
    r = _run(tmp_path / "c", "f", check=False, CXX=cxx, KILN_SUPPRESS_ERRORS="0")
    assert r.returncode != 0
    assert "BuildError" in r.stderr and cxx in r.stderr, r.stderr[-3000:]
    if cxx == failing_cxx:
        assert "the test compiler refuses" in r.stderr
    assert "Traceback" in r.stderr and "-fopenmp" in r.stderr     # the whole command


def test_failing_compiler_in_process_falls_back_per_graph(monkeypatch, tmp_path, failing_cxx):
    """In-process: the compiled graph keeps running eagerly for that signature,
    without building again, and still matches eager on fresh inputs."""
    import torch
    import torch.fx as fx
    import kiln.config
    from kiln.kernels import compile_aten_graph
    from kiln.kernels.toolchain import cxx_build as kcache
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kiln.config, "suppress_errors", True)
    monkeypatch.setattr(kiln.config, "graph_cache", False)
    monkeypatch.setattr(kcache, "CXX", failing_cxx)
    kcache.cxx_flags.cache_clear()
    kcache.toolchain_version.cache_clear()
    try:
        aten = torch.ops.aten

        def f(x):
            return (aten.mul.Tensor(aten.exp.default(x), 3.0),)
        c = compile_aten_graph(fx.symbolic_trace(f), [torch.randn(4, 3)])
        assert c.target == "eager"
        before = dict(kcache.stats)
        for _ in range(2):
            x = torch.randn(4, 3)
            torch.testing.assert_close(c(x)[0], torch.exp(x) * 3)
            args = [x]
            torch.testing.assert_close(c.call_boxed(args)[0], torch.exp(x) * 3)
            assert args == []
        assert kcache.stats == before        # no second build attempt
    finally:
        kcache.cxx_flags.cache_clear()
        kcache.toolchain_version.cache_clear()


def test_failure_at_first_call_of_built_kernels(monkeypatch, tmp_path):
    """Triton compiles at a kernel's first launch and CUDA loads modules then: a failure
    at the first call of a built specialisation is a build failure too. With
    suppress_errors the call (inputs untouched: the graph is functional) runs eagerly,
    and later calls too; without it the error is raised."""
    import torch
    import torch.fx as fx
    import kiln.config
    from kiln.kernels import compile_aten_graph
    from kiln.kernels.runtime import runner as runtime
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    calls = []

    def failing_launch(self, *args):
        calls.append(1)
        raise RuntimeError("kernel launch failed (test)")
    monkeypatch.setattr(runtime.Runtime, "__call__", failing_launch)
    aten = torch.ops.aten

    def f(x, y):
        return (aten.add.Tensor(aten.sin.default(x), y), aten.mul.Tensor(x, 2))
    x, y = torch.randn(5, 4), torch.randn(4)
    monkeypatch.setattr(kiln.config, "suppress_errors", True)
    c = compile_aten_graph(fx.symbolic_trace(f), [x, y])
    for _ in range(2):
        x, y = torch.randn(5, 4), torch.randn(4)
        x0 = x.clone()
        a, b = c(x, y)
        torch.testing.assert_close(a, torch.sin(x) + y)
        torch.testing.assert_close(b, x * 2)
        assert torch.equal(x, x0)
    assert calls == [1]                  # the failed specialisation is not tried again
    monkeypatch.setattr(kiln.config, "suppress_errors", False)
    c = compile_aten_graph(fx.symbolic_trace(f), [x, y])
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        c(x, y)


TRITON = dict(TRITON_INTERPRET="1", KILN_KERNEL_TARGET="triton")


@pytest.mark.slow
def test_triton_module_swapped_or_code_damaged_is_rebuilt(tmp_path):
    """The generated Triton module (imported from the cache) and its code object."""
    pytest.importorskip("triton")
    mine, theirs = tmp_path / "f", tmp_path / "g"
    _run(mine, "f", **TRITON)
    _run(theirs, "g", **TRITON)
    (py,), (py_other,) = _files(mine, ".py"), _files(theirs, ".py")
    shutil.copyfile(py_other, py)               # another graph's module in its place
    assert _run(mine, "f", **TRITON)["disk"]["rejected"] == 1
    (code,) = _files(mine, ".marshal")
    with open(code, "r+b") as f:
        f.truncate(os.path.getsize(code) // 2)
    assert _run(mine, "f", **TRITON)["disk"]["rejected"] == 1
    assert _run(mine, "f", **TRITON)["disk"]["rejected"] == 0


GPU_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.fx as fx
    from kiln import disk_cache
    from kiln.kernels import compile_aten_graph
    from kiln.kernels.toolchain import triton_binaries
    aten = torch.ops.aten
    def f(x, y):
        return (aten._softmax.default(aten.mul.Tensor(x, y), -1, False),
                aten.sum.dim_IntList(aten.relu.default(x), [0]))
    x, y = torch.randn(300, 257, device="cuda"), torch.randn(257, device="cuda")
    c = compile_aten_graph(fx.symbolic_trace(f), [x, y])
    for _ in range(2):
        a, b = c(x, y)
    torch.cuda.synchronize()
    ok = bool(torch.allclose(a, torch.softmax(x * y, -1)) and
              torch.allclose(b, torch.relu(x).sum(0), rtol=1e-5, atol=1e-4))
    print(json.dumps({"ok": ok, "bin": triton_binaries.stats, "disk": disk_cache.stats}))
""")


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("what", [".cubin", "manifest"])
def test_kept_triton_binary_damaged_is_compiled_again(tmp_path, what):
    """A kept kernel binary (or the module's manifest) that fails its check is not
    loaded: the kernels go through Triton again and are kept again."""
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "kiln"), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITON_CACHE_DIR=str(tmp_path / "triton"), KILN_GRAPH_CACHE="0")

    def run():
        r = subprocess.run([sys.executable, "-c", GPU_SCRIPT], capture_output=True,
                           text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["ok"], r.stderr[-3000:]
        return out
    assert run()["bin"]["saved"] == 1
    if what == "manifest":
        paths = _files(tmp_path / "kiln" / "triton_manifest", ".pkl")
    else:
        paths = _files(tmp_path / "kiln" / "triton_bin", what)
    assert paths
    for p in paths:
        with open(p, "r+b") as f:
            f.seek(os.path.getsize(p) // 2)
            f.write(b"\0" * 64)
    out = run()
    assert out["bin"] == {"loaded": 0, "saved": 1} and out["disk"]["rejected"] >= 1, out
    out = run()
    assert out["bin"] == {"loaded": 1, "saved": 0} and out["disk"]["rejected"] == 0, out
