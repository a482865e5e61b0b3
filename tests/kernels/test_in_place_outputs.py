"""Mutated inputs written in place by the kernels that compute their new values
(kernels/runtime/in_place.py): the Triton path under the interpreter (a child pytest
runs ``in_place_cases.py``), the C++ path (which keeps the copy), and a GPU check of
CUDA-graph replay with an input that moves every call."""
import os
import subprocess
import sys

import pytest
import torch

import kiln

from .in_place_cases import record_runtimes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_triton_cases_under_the_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(HERE, "in_place_cases.py"), "--rootdir", ROOT],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


def _step(p, g, m):
    m.mul_(0.9).add_(g)
    p.add_(m, alpha=-0.1)


def test_cpp_kernels_keep_the_copy(monkeypatch):
    made = record_runtimes(monkeypatch)
    p, g, m = torch.randn(40, 9), torch.randn(40, 9), torch.zeros(40, 9)
    p2, m2 = p.clone(), m.clone()
    f = kiln.compile(_step, backend="kiln")
    with torch.no_grad():
        f(p, g, m)
        _step(p2, g, m2)
    torch.testing.assert_close(p, p2)
    torch.testing.assert_close(m, m2)
    assert made and not any(rt.in_place_inputs for rt in made)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_replayed_graph_writes_moving_and_static_inputs(monkeypatch):
    """Parameters stay put; a state tensor passed fresh each call is copied into the
    recorded graph's static buffer, written there, and copied back."""
    from kiln import config
    monkeypatch.setattr(config, "cudagraphs", "1")     # replay however few its kernels
    made = record_runtimes(monkeypatch)
    torch.manual_seed(0)
    ps = [torch.randn(256, 128, device="cuda") for _ in range(6)]
    ms = [torch.zeros_like(p) for p in ps]
    ps2, ms2 = [p.clone() for p in ps], [m.clone() for m in ms]

    def step(ps, gs, ms, extra):
        for p, g, m in zip(ps, gs, ms):
            m.mul_(0.9).add_(g)
            p.add_(m, alpha=-0.1)
        extra.add_(1)

    f = kiln.compile(step, backend="kiln")
    with torch.no_grad():
        for i in range(6):
            gs = [torch.randn_like(p) for p in ps]
            extra = torch.full((256,), float(i), device="cuda")
            extra2 = extra.clone()
            f(ps, gs, ms, extra)
            step(ps2, gs, ms2, extra2)
            torch.testing.assert_close(extra, extra2)
    for a, b in zip(ps + ms, ps2 + ms2):
        torch.testing.assert_close(a, b)
    assert any(rt.in_place_inputs for rt in made)
    replayed = [rt.graphs for rt in made if rt.graphs is not None and rt.graphs.replays]
    assert replayed and any(g.write_back for g in replayed)   # ``extra`` was copied back
