"""Pointwise values several ops read: computed again in each reader, or stored
(``kernels/lowering/recompute.py``). The GELU(tanh) backward of a training step (C++
here, Triton under the interpreter in a child process), and one graph per rule that
keeps a value stored."""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import ir
from kiln.kernels.lowering.engine import GraphLowering

from .recompute_cases import check_gelu_step

aten = torch.ops.aten
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_gelu_backward_recomputes_cpp(monkeypatch):
    monkeypatch.setattr(config, "kernel_target", "cpp")
    check_gelu_step(None, 1e-5, monkeypatch)


@pytest.mark.slow   # (the quick subset's time: run in full CI)
def test_gelu_backward_recomputes_triton_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "recompute_triton_cases.py"), "--rootdir", ROOT]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "3 passed" in r.stdout.splitlines()[-1], r.stdout[-2000:]


# --- one rule at a time, on hand-built aten graphs (C++ target) ---------------------
def _lower(fn, *inputs):
    gm = fx.symbolic_trace(fn)
    lo = GraphLowering(gm, list(inputs), "cpp").run()
    ir.verify(lo.buffers)
    return lo


def _pointwise(lo):
    return [b for b in lo.buffers if isinstance(b, ir.Pointwise)]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _decisions(fn, *inputs):
    """(the lowering, the lines logged under ``passes`` while lowering ``fn``'s graph)."""
    log, h = logging.getLogger("kiln.passes"), _Lines()
    level = log.level
    log.addHandler(h)
    log.setLevel(logging.INFO)
    try:
        lo = _lower(fn, *inputs)
    finally:
        log.removeHandler(h)
        log.setLevel(level)
    return lo, h.lines


def _cheap(x):
    a = aten.mul.Tensor(x, 0.5)
    return aten.exp.default(a), aten.add.Tensor(a, 1.0)


def test_a_cheap_value_is_computed_in_each_reader():
    x = torch.randn(8, 32)
    lo, lines = _decisions(_cheap, x)
    assert len(_pointwise(lo)) == 2 and any("recompute mul" in s for s in lines), lines


def _through_views(x):
    a = aten.mul.Tensor(x, 0.5)
    t = aten.t.default(a)
    return aten.exp.default(t), aten.add.Tensor(aten.view.default(a, [8, 1, 32]), 1.0)


def test_readers_through_views_compute_it_too():
    """Views of a shared value are the value re-indexed: their readers are its readers
    (each computes ``x * 0.5`` at its own index), and results are eager's."""
    from kiln.kernels.compile import build
    x = torch.randn(8, 32)
    lo, lines = _decisions(_through_views, x)
    assert len(_pointwise(lo)) == 2 and any("recompute mul_tensor in each of its 2" in s
                                            for s in lines), lines
    gm = fx.symbolic_trace(_through_views)
    rt, _ = build(gm, [x], "cpp")
    for g, e in zip(rt(x), gm(x)):
        assert g.shape == e.shape and g.stride() == e.stride()
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def test_switched_off_every_shared_value_is_stored(monkeypatch):
    monkeypatch.setattr(config, "recompute_pointwise", False)
    assert len(_pointwise(_lower(_cheap, torch.randn(8, 32)))) == 3


def _chain(x, n):
    for i in range(n):
        x = aten.add.Tensor(aten.mul.Tensor(x, 0.5), 0.25 * i)
    return x


def _expensive(x):
    a = _chain(x, 13)                       # 26 ops
    return aten.exp.default(a), aten.add.Tensor(a, 1.0)


def _many_readers(x):
    a = _chain(x, 5)                        # 10 ops, read by 8 ops
    return tuple(aten.add.Tensor(a, float(i)) for i in range(8))


def _two_inputs(x, y):
    a = aten.mul.Tensor(x, y)               # 8 bytes read per 4 stored
    return aten.exp.default(a), aten.add.Tensor(a, 1.0)


def _broadcast(x, y):
    a = aten.mul.Tensor(x, 0.5)             # [8, 1], read over [8, 32]
    return aten.add.Tensor(a, y), aten.sub.Tensor(y, a)


def _read_by_softmax(x):
    a = aten.mul.Tensor(x, 0.5)
    return aten._softmax.default(a, -1, False), aten.add.Tensor(a, 1.0)


def _read_by_matmul(x, w):
    a = aten.mul.Tensor(x, 0.5)                 # the product reads it through a view
    return aten.mm.default(aten.t.default(a), w), aten.add.Tensor(a, 1.0)


def _reshaped(x):
    a = aten.mul.Tensor(x, 0.5)                 # reshaping a lazy value stores it
    return aten.exp.default(a), aten.add.Tensor(aten.view.default(a, [4, 64]), 1.0)


def _gathered(x, i):
    a = aten.mul.Tensor(aten.index_select.default(x, 0, i), 0.5)
    return aten.exp.default(a), aten.add.Tensor(a, 1.0)


STORED = [
    ("ops", _expensive, lambda: [torch.randn(8, 32)]),
    ("work", _many_readers, lambda: [torch.randn(8, 32)]),
    ("bytes", _two_inputs, lambda: [torch.randn(8, 32), torch.randn(8, 32)]),
    ("broadcast", _broadcast, lambda: [torch.randn(8, 1), torch.randn(8, 32)]),
    ("repeats", _read_by_softmax, lambda: [torch.randn(8, 32)]),
    ("library", _read_by_matmul, lambda: [torch.randn(64, 64), torch.randn(64, 64)]),
    ("library", _reshaped, lambda: [torch.randn(8, 32)]),
    ("indirect", _gathered, lambda: [torch.randn(8, 32), torch.tensor([3, 1, 3, 0])]),
]


def test_values_better_stored_stay_stored(monkeypatch):
    """Each rule of ``STORE_RULES`` on a graph it decides: the shared value is stored
    (one buffer beside the readers'), for the reason logged; and values agree with
    eager through the compiled graph."""
    from kiln.kernels.compile import build
    monkeypatch.setattr(config, "small_matmul_macs", 0)
    for rule, fn, make in STORED:
        inputs = make()
        lo, lines = _decisions(fn, *inputs)
        names = [m.group(1) for m in map(re.compile(rf"store (\S+) \[{rule}\]").search, lines)
                 if m]
        assert len(names) == 1, (rule, lines)
        assert any(b.origin == names[0] for b in _pointwise(lo)), (rule, ir.format_program(lo.buffers))
        gm = fx.symbolic_trace(fn)
        rt, _ = build(gm, inputs, "cpp")
        for g, e in zip(rt(*inputs), gm(*inputs)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
