"""Computed matrix-product operands stored in the order their reads run
(``kernels/lowering/operand_layout.py``), on the C++ path; the Triton path runs
``mm_operand_layout_cases.py`` in a child pytest under TRITON_INTERPRET=1.

Each case compares values with eager and reads the lowered program: the kernel that
computes a transposed operand loops over it in its input's order (no strided reads),
and the library product gets the transposed view (strides (1, rows)), not a copy."""
import os
import subprocess
import sys

import pytest
import torch

from kiln import config

from .mm_operand_layout_cases import (bmm_t, check_transposed, linear_scaled, matmul_args,
                                      mm_natural, planned, close, saved_twice,
                                      strided_feeders, train_and_check, wgrad)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(autouse=True)
def library_products():
    """Every product a library call (small ones would be kiln's own loops)."""
    with config.patch(small_matmul_macs=0):
        yield


def test_weight_gradient_of_an_activation_reads_it_in_order():
    torch.manual_seed(0)
    a, g = torch.randn(64, 48), torch.randn(64, 32)
    bufs = check_transposed(wgrad, [a, g], "cpp", 64)
    (src, arg), = matmul_args(bufs)
    assert tuple(src.sizes) == (64, 48) and tuple(arg.strides) == (1, 48)


def test_linear_with_a_computed_weight():
    torch.manual_seed(0)
    b, x, w = torch.randn(40), torch.randn(16, 24), torch.randn(40, 24)
    check_transposed(linear_scaled, [b, x, w], "cpp", 24)


def test_bmm_with_a_transposed_computed_operand():
    torch.manual_seed(0)
    q, k = torch.randn(3, 16, 8), torch.randn(3, 24, 8)
    bufs = check_transposed(bmm_t, [q, k], "cpp", 8)
    (src, arg), = matmul_args(bufs)
    assert tuple(src.sizes) == (3, 24, 8) and tuple(arg.strides) == (192, 1, 8)


def test_operand_read_in_its_own_order_is_stored_as_it_is():
    torch.manual_seed(0)
    a, b = torch.randn(32, 48), torch.randn(48, 16)
    rt, bufs = planned(mm_natural, [a, b], "cpp")
    close(rt(a, b)[0], mm_natural(a, b)[0], 48)
    (src, arg), = matmul_args(bufs)
    assert tuple(src.sizes) == (32, 48) and tuple(arg.strides) == (48, 1)


def test_transposed_value_read_by_two_products_is_stored_once_in_order():
    torch.manual_seed(0)
    w, x, y = torch.randn(40, 24), torch.randn(16, 24), torch.randn(8, 24)
    rt, bufs = planned(saved_twice, [w, x, y], "cpp")
    for g, e in zip(rt(w, x, y), saved_twice(w, x, y)):
        close(g, e, 24)
    assert strided_feeders(bufs) == []
    args = matmul_args(bufs)
    assert len(args) == 2 and len({src.name for src, _ in args}) == 1
    src, arg = args[0]
    assert tuple(src.sizes) == (40, 24) and tuple(arg.strides) == (1, 24)


def test_training_step_matches_eager(monkeypatch):
    plans = train_and_check(monkeypatch, None, k=256, target="cpp")
    for p in plans:
        assert strided_feeders(p.lowered.buffers) == [], p.artefacts["ir"]


@pytest.mark.slow
def test_triton_interpreter_cases(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "mm_operand_layout_cases.py"), "--rootdir", ROOT]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    last = r.stdout.splitlines()[-1]
    assert "passed" in last and "skipped" not in last and "failed" not in last, r.stdout[-2000:]
