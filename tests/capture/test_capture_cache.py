"""The capture cache (kiln/capture/capture_cache.py): a second process rebuilds a traced
entry from disk instead of tracing, and anything the trace depended on that differs in
that process (an edited file, a patched function or method, a changed default, a global,
a module attribute, shapes) is a miss, traced again, with eager's result.

Each case runs small programs in fresh processes sharing one cache directory; each
prints JSON: whether the capture cache hit, whether a trace ran, and the largest
difference from eager on the same inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODULE = '''
import torch
SCALE = 2.0

def helper(x, k=3):
    return torch.relu(x) * k

def f(x, y):
    return helper(x) + y.sin() * SCALE

class Block(torch.nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.norm = torch.nn.LayerNorm(n, eps=eps)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.lin(x))) * SCALE

def with_break(x):
    y = x.cos()
    print("break", end="")
    return y + 1
'''

PROGRAM = '''
import json, sys, torch, kiln
sys.path.insert(0, {dir!r})
import mymod
from kiln.capture import capture_cache
from kiln.debug import timing
{setup}
torch.manual_seed(0)
target = {target}
compiled = kiln.compile(target, backend={backend!r})
args = {args}
with torch.no_grad():
    out = compiled(*args)
    ref = target(*args)
first = lambda t: t if isinstance(t, torch.Tensor) else t[0]
print()
print(json.dumps({{"hits": capture_cache.stats["hits"], "stored": capture_cache.stats["stored"],
                  "traced": "capture (incl. backend)" in timing.report(),
                  "err": (first(out) - first(ref)).abs().max().item()}}))
'''


def _run(tmp_path, target="mymod.f", args="(torch.randn(4, 5), torch.randn(4, 5))", setup="",
         backend="aot_eager", env=None):
    src = PROGRAM.format(dir=str(tmp_path), setup=textwrap.dedent(setup), target=target,
                         args=args, backend=backend)
    path = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    e = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CAPTURE_CACHE="1",
             KILN_TRACE_CACHE="1", PYTHONPATH=path, KILN_LOGS="cache")
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, env=e,
                       cwd=str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["log"] = p.stderr
    assert r["err"] <= 1e-5, r
    return r


@pytest.fixture
def mod(tmp_path):
    (tmp_path / "mymod.py").write_text(MODULE)
    return tmp_path


def _hit(r):
    return r["hits"] == 1 and not r["traced"]


def _miss(r):
    return r["hits"] == 0 and r["traced"]


def test_second_process_rebuilds_the_entry_without_tracing(mod):
    first = _run(mod)
    assert _miss(first) and first["stored"] == 1, first["log"]
    second = _run(mod)
    assert _hit(second), second["log"]


def test_kiln_backend_and_a_module(mod):
    """The kernel compiler behind it, an nn.Module with parameters and submodules."""
    kw = dict(target="mymod.Block(8)", args="(torch.randn(3, 8),)", backend="kiln")
    assert _miss(_run(mod, **kw))
    assert _hit(_run(mod, **kw))


def test_a_module_built_otherwise_is_traced_again(mod):
    kw = dict(args="(torch.randn(3, 8),)")
    assert _miss(_run(mod, target="mymod.Block(8)", **kw))
    assert _miss(_run(mod, target="mymod.Block(8, eps=1e-3)", **kw))       # a constant attribute
    swapped = "(lambda b: (setattr(b, 'lin', torch.nn.Identity()), b)[1])(mymod.Block(8))"
    assert _miss(_run(mod, target=swapped, **kw))                           # a submodule swapped
    assert _hit(_run(mod, target="mymod.Block(8)", **kw))


def test_other_shapes_and_dtypes_miss(mod):
    assert _miss(_run(mod))
    assert _miss(_run(mod, args="(torch.randn(6, 5), torch.randn(6, 5))"))
    assert _miss(_run(mod, args="(torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64))"))
    # both kept: each shape hits now
    assert _hit(_run(mod, args="(torch.randn(6, 5), torch.randn(6, 5))"))
    assert _hit(_run(mod))


def test_an_edited_source_file_misses(mod):
    assert _miss(_run(mod))
    (mod / "mymod.py").write_text(MODULE.replace("* k\n", "* k + 1\n"))
    r = _run(mod)
    assert _miss(r), r["log"]


@pytest.mark.parametrize("setup", [
    # another function under the same global name
    "mymod.helper = lambda x, k=3: torch.tanh(x) * k",
    # the same function object with another default
    "mymod.helper.__defaults__ = (5,)",
    # the same function object with other code
    "mymod.helper.__code__ = (lambda x, k=3: x * k).__code__",
    # a global the graph folded in
    "mymod.SCALE = 3.0",
])
def test_what_the_trace_read_changed_in_the_new_process(mod, setup):
    assert _miss(_run(mod))
    r = _run(mod, setup=setup)
    assert _miss(r), r["log"]


def test_a_method_patched_on_the_class_misses(mod):
    kw = dict(target="mymod.Block(8)", args="(torch.randn(3, 8),)")
    assert _miss(_run(mod, **kw))
    patched = "mymod.Block.forward = lambda self, x: self.norm(self.lin(x))"
    r = _run(mod, setup=patched, **kw)
    assert _miss(r), r["log"]
    # torch's own modules too: a patched LayerNorm.forward
    r = _run(mod, setup="torch.nn.LayerNorm.forward = lambda self, x: x * 2", **kw)
    assert _miss(r), r["log"]


def test_a_corrupt_entry_is_rejected_and_rebuilt(mod):
    assert _miss(_run(mod))
    files = [os.path.join(d, f) for d, _, fs in os.walk(mod / "cache" / "capture") for f in fs]
    assert files
    for path in files:
        with open(path, "r+b") as fh:
            fh.seek(40)
            fh.write(b"garbage!")
    r = _run(mod)
    assert _miss(r) and "rejected" in r["log"], r["log"]
    assert _hit(_run(mod))


def test_an_entry_with_a_graph_break_is_not_stored_its_resume_function_is(mod):
    """The frame with the break is traced again in every process (its entry calls a
    resume function made there); the resume function's own entry, one graph, is stored
    under its generated code and found again."""
    kw = dict(target="mymod.with_break", args="(torch.randn(3),)")
    r = _run(mod, **kw)
    assert "not storing with_break" in r["log"] and "graph break" in r["log"], r["log"]
    assert r["stored"] == 1 and r["hits"] == 0
    r = _run(mod, **kw)
    assert r["traced"] and r["hits"] == 1 and r["stored"] == 0, r["log"]


def test_switched_off(mod):
    env = {"KILN_CAPTURE_CACHE": "0"}
    assert _run(mod, env=env)["stored"] == 0
    assert _miss(_run(mod, env=env))
    assert not os.path.exists(mod / "cache" / "capture")


def test_another_kiln_setting_is_another_key(mod):
    assert _miss(_run(mod))
    assert _miss(_run(mod, env={"KILN_PARTITION_RECOMPUTE": "0"}))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet18/infer/fp32", "bert/infer/fp32",
                                   "mobilenet_v3_small/infer/fp32"])
def test_real_models_hit_with_eager_results(tmp_path, model):
    """Models from torchvision and transformers (the compile-time benchmark's rows)."""
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    setup = f'''
from benchmarks.workloads import find
w = find({model!r}, "cpu", quick=False)
inst = w.build("cpu")
'''
    kw = dict(target="inst.fn", args="inst.inputs[0]", setup=setup, backend="kiln")
    (tmp_path / "mymod.py").write_text("")
    assert _miss(_run(tmp_path, **kw))
    r = _run(tmp_path, **kw)
    assert _hit(r), r["log"]


def test_a_stored_graph_that_does_not_compile_is_traced_instead(mod):
    assert _miss(_run(mod))
    broken = '''
from kiln import ref_pickle
def fail(record):
    raise RuntimeError("no graph today")
ref_pickle.graph_from = fail
'''
    r = _run(mod, setup=broken)
    assert r["traced"] and "does not compile" in r["log"], r["log"]
