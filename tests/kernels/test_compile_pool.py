"""Compile workers (``kiln/kernels/toolchain/triton_pool.py``, ``triton_worker.py``), checked on
the CPU: Triton's compiler needs no GPU, so a worker compiles a generated module's
kernels for an H100 (sm_90) here too."""
import os
import time

import pytest
import torch
import torch.fx as fx

from kiln.kernels.toolchain import triton_pool as compile_pool
from kiln.kernels.toolchain import triton_binaries
from kiln.kernels.toolchain import triton_build as triton_compile
from kiln.kernels.codegen.triton import prelude
from kiln.kernels.codegen.triton import source as triton_gen
from kiln.kernels.toolchain import triton_setup
from kiln.kernels.lowering import GraphLowering
from kiln.kernels.scheduler import schedule

aten = torch.ops.aten
pytest.importorskip("triton")


def _module(tmp_path):
    """A generated module with a pointwise kernel and an autotuned reduction, written
    where the workers can read it."""
    def f(x):
        return (aten._softmax.default(x, -1, False), aten.sum.dim_IntList(x, [0]))
    x = torch.randn(256, 3000)
    gm = fx.symbolic_trace(f)
    lo = GraphLowering(gm, [x], "triton").run()
    sched = schedule(lo.buffers, {b.name for b in lo.buffers})
    source, _, kinfo = triton_gen.generate_detailed(sched, lo.buffers, interpret=False)
    path = tmp_path / "kiln_mod.py"
    path.write_text(source)
    return str(path), kinfo


@pytest.fixture
def workers(monkeypatch):
    """Two real workers compiling for sm_90, whatever this machine has."""
    monkeypatch.setattr(compile_pool, "_workers", [])
    monkeypatch.setattr(compile_pool, "_jobs", compile_pool.queue.Queue())
    ws = [compile_pool._Worker(triton_setup.triton_stamp(), 90, 32) for _ in range(2)]
    compile_pool._workers.extend(ws)
    for w in ws:
        assert w.started.wait(120) and w.hello is not None, "a worker did not start"
    yield ws
    for w in ws:
        w.stop()
        w.proc.wait(30)


def _specs(path, kinfo, monkeypatch):
    from triton.backends.compiler import GPUTarget
    monkeypatch.setattr(triton_compile, "target", lambda: GPUTarget("cuda", 90, 32))
    import importlib.util
    spec = importlib.util.spec_from_file_location("kiln_mod_parent", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    specs, fns = [], []
    for name, params, dtypes, consts, nw, tune in kinfo:
        k = getattr(mod, name)
        fn = k.fn if hasattr(k, "configs") else k
        fns.append(fn)
        specs.append({"path": path, "name": name, "consts": dict(consts),
                      "signature": triton_compile.signature(fn, dtypes, consts),
                      "options": {"num_warps": nw}})
    return specs, fns


def test_workers_compile_without_importing_torch(workers, tmp_path, monkeypatch):
    """Each worker starts on Triton alone (no torch import: its start-up is what a cold
    compile waits for), and what it compiles rebuilds into a CompiledKernel here."""
    assert all(w.hello == {"ready": True, "torch_imported": False} for w in workers)
    path, kinfo = _module(tmp_path)
    specs, fns = _specs(path, kinfo, monkeypatch)
    assert len(specs) >= 2
    done_here = []
    monkeypatch.setattr(compile_pool.config, "compile_threads", 1)

    def slow_local(i):          # this process busy: the workers take the other jobs
        time.sleep(1.0)
        done_here.append(i)
    replies = compile_pool.run(specs, slow_local)
    remote = [i for i, r in enumerate(replies) if r is not None]
    assert sorted(remote + done_here) == list(range(len(specs)))    # each job once
    assert remote and compile_pool.stats["remote"] >= len(remote)
    # whatever the workers did is a whole kernel: its cubin and PTX, for sm_90
    for i in remote:
        ck = triton_binaries.compiled_kernel(replies[i], fns[i].arg_names)
        assert ck.name == specs[i]["name"] and ck.metadata.target.arch == 90
        assert ck.kernel and ".entry " + ck.name in ck.asm["ptx"]


def test_every_job_is_done_even_when_workers_fail(workers, tmp_path, monkeypatch):
    """A job a worker cannot do (here: its module is missing) is done here instead; a
    job kiln cannot describe to a worker (None) is done here first."""
    path, kinfo = _module(tmp_path)
    specs, _ = _specs(path, kinfo, monkeypatch)
    bad = [dict(s, path=str(tmp_path / "missing.py")) for s in specs]
    done_here = []
    replies = compile_pool.run(bad + [None], done_here.append)
    assert replies == [None] * (len(bad) + 1)
    assert sorted(done_here) == list(range(len(bad) + 1))


@pytest.mark.parametrize("threads", [1, 3])
def test_no_workers_means_everything_here(monkeypatch, threads):
    monkeypatch.setattr(compile_pool, "_workers", [])
    monkeypatch.setattr(compile_pool.config, "compile_threads", threads)
    done_here = []
    assert compile_pool.run([{"x": 1}, None, {"y": 2}], done_here.append) == [None] * 3
    assert sorted(done_here) == [0, 1, 2]


def test_worker_blanks_host_only_lines(tmp_path):
    """A worker executes a module with its host-only imports blanked (no torch), line
    numbers kept, so Triton reads each kernel's own source from the file."""
    from kiln.kernels.toolchain import triton_worker as compile_worker
    p = tmp_path / "m.py"
    p.write_text("import nonexistent_module  # host only\nX = 1\n")
    mod = compile_worker._module(str(p), {})
    assert mod.X == 1
    assert "host only" in prelude.PRELUDE and "import torch  # host only" in prelude.PRELUDE
    assert os.path.exists(compile_worker.__file__)
