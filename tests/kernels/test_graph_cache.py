"""The whole-graph cache: a second compile of the same graph skips lowering, scheduling
and codegen; anything the plan depends on (input layout, tuning constants, constants'
values) gives a new entry; hits replay the fallback and output-code logs."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx

from kiln.debug import timing
from kiln.kernels import compile_aten_graph
from kiln.kernels.lowering import engine as lowering
from kiln.kernels.toolchain import graph_cache

aten = torch.ops.aten
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _f(x, y):
    a = aten.cumprod.default(aten.exp.default(x), 0)       # cumprod: an aten fallback
    return (aten._softmax.default(aten.add.Tensor(a, y), -1, False),)


def _ref(x, y):
    return torch.softmax(torch.cumprod(torch.exp(x), 0) + y, -1)


def _compile(x, y, f=_f):
    before = dict(graph_cache.stats)
    c = compile_aten_graph(fx.symbolic_trace(f), [x, y])
    torch.testing.assert_close(c(x, y)[0], _ref(x, y))
    return {k: graph_cache.stats[k] - before[k] for k in before}


def test_second_compile_is_a_hit_and_correct(tmp_path, monkeypatch):
    import kiln.config
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    x, y = torch.randn(6, 7), torch.randn(7)
    assert _compile(x, y) == {"hits": 0, "misses": 1, "stored": 1, "uncacheable": 0}
    timing.clear()
    assert _compile(torch.randn(6, 7), torch.randn(7))["hits"] == 1
    assert "kernels.lowering" not in timing.totals()


def test_what_the_plan_depends_on_is_in_the_key(tmp_path, monkeypatch):
    import kiln.config
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    x, y = torch.randn(6, 7), torch.randn(7)
    _compile(x, y)
    assert _compile(torch.randn(7, 6).t(), y)["misses"] == 1          # other strides
    assert _compile(x.double(), y.double())["misses"] == 1             # other dtype
    monkeypatch.setattr(lowering, "MAX_INLINE_OPS", 3)                 # a tuning constant
    assert _compile(x, y)["misses"] == 1
    monkeypatch.setattr(kiln.config, "graph_cache", False)
    assert _compile(x, y) == {"hits": 0, "misses": 0, "stored": 0, "uncacheable": 0}


def test_constant_values_are_in_the_key(tmp_path, monkeypatch):
    import kiln.config
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))

    class M(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.register_buffer("c", c)

        def forward(self, x):
            return (aten.mul.Tensor(x, self.c),)
    x = torch.randn(5)
    for c in (torch.full((5,), 2.0), torch.full((5,), 3.0), torch.tensor(4.0),
              torch.tensor(5.0)):                  # 0-d constants too (deberta, gpt-neo)
        gm = fx.symbolic_trace(M(c))
        got = compile_aten_graph(gm, [x])(x)[0]
        torch.testing.assert_close(got, x * c)


def test_hits_replay_fallback_and_code_logs(tmp_path, monkeypatch, caplog):
    import kiln.config
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    x, y = torch.randn(6, 7), torch.randn(7)
    _compile(x, y)
    with caplog.at_level(logging.INFO, logger="kiln.fallbacks"), \
            caplog.at_level(logging.INFO, logger="kiln.output_code"):
        assert _compile(x, y)["hits"] == 1
    assert "aten.cumprod.default falls back to aten" in caplog.text
    assert 'extern "C" void kiln_seg0' in caplog.text


@pytest.mark.slow
def test_second_process_lowers_nothing(tmp_path):
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        import torch, torch.fx as fx, torchvision
        import kiln, kiln.config; kiln.config.cache_dir = {str(tmp_path)!r}
        from kiln.debug import timing
        from kiln.kernels.toolchain import graph_cache
        torch.manual_seed(0)
        m = torchvision.models.resnet18().eval()
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            got, ref = kiln.compile(m)(x), m(x)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        print(graph_cache.stats["hits"], graph_cache.stats["stored"],
              "kernels.lowering" in timing.totals())
    """)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split() == ["0", "1", "True"]
    assert runs[1].stdout.split() == ["1", "0", "False"]
