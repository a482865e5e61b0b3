"""Outputs as eager lays them out: strides, storage offsets, sharing, writability.

The programs are in ``output_layout_cases.py``; here they run through the C++ kernels
(inference, and training with a backward), and a few through the Triton kernels on the
CPU (Triton's interpreter, in a child process: it must be switched on before triton is
imported).
"""
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.fx as fx

from kiln.kernels import compile_aten_graph

from . import output_layout_cases as cases

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
aten = torch.ops.aten

#: writes of values that require grad into outputs of ``unbind`` refuse in eager (views
#: of a multi-output view op); the autograd stage records unbind as single views, whose
#: outputs take them
KNOWN = {"unbind"}


@pytest.mark.parametrize("name", [n for n in cases.PROGRAMS if n not in KNOWN])
def test_inference(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cases.mismatches([name]) == []


@pytest.mark.parametrize("name", [n for n in cases.PROGRAMS if n not in KNOWN])
def test_training(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cases.mismatches([name], train=True) == []


TRITON_QUICK = ["pointwise_read_twice", "slice_of_intermediate", "t_in_place",
                "transpose_in_place_then_write", "reduction_of_permuted", "fuzz_1154"]


@pytest.mark.slow      # the Triton interpreter: minutes of the quick subset's budget
def test_triton_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_KERNEL_TARGET="triton",
               KILN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(HERE, "output_layout_cases.py"),
                        *TRITON_QUICK], env=env, capture_output=True, text=True, cwd=ROOT,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]


# --- the kernel compiler alone, on aten graphs ----------------------------------------
def _views_of_intermediates(x):
    y = aten.add.Tensor(aten.permute.default(x, [1, 0]), 1)     # eager: x's memory order
    return (y, aten.select.int(y, 1, 2), aten.slice.Tensor(y, 0, 1, 3),
            aten.mul.Tensor(aten.permute.default(x, [1, 0]), 2))


def _diagonal_and_slice(x):
    y = aten.exp.default(aten.permute.default(x, [1, 0]))
    return (aten.diagonal.default(aten.slice.Tensor(y, 0, 0, 4)),
            aten.slice.Tensor(y, 1, 1, 5, 2), aten.sum.dim_IntList(y, [0]))


@pytest.mark.parametrize("fn", [_views_of_intermediates, _diagonal_and_slice])
def test_aten_graph_outputs_are_views_of_the_computed_buffer(fn):
    """Views of an intermediate are returned as views of the buffer the intermediate is
    stored in (eager's strides and storage offset, memory shared as in eager); a
    pointwise result of a transposed input keeps eager's memory order."""
    gm = fx.symbolic_trace(fn)
    x = torch.randn(4, 5)
    expect = fn(x)
    got = compile_aten_graph(gm, [x])(x)
    for e, g in zip(expect, got):
        assert (e.shape, e.stride(), e.storage_offset()) == \
            (g.shape, g.stride(), g.storage_offset())
        torch.testing.assert_close(g, e)
    shared = [[a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
               for b in got] for a in got]
    eager_shared = [[a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                     for b in expect] for a in expect]
    assert shared == eager_shared
