"""The size-generic cases (``size_generic_cases.py``) through the Triton path, under
TRITON_INTERPRET=1: a new size of a class loads no new module (on a GPU: compiles no
kernel). Not collected by the normal run: ``test_size_generic_triton.py`` runs this
file in a child pytest with the interpreter on before triton is imported."""
import os

import pytest
import torch

from kiln.kernels.codegen.triton import launcher

from .size_generic_cases import CASES, SIZES, lifting, mlp_training_step_costs, pointwise, run_odd, run_sizes

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_size_generic_triton.py)")


def loads():
    return launcher.stats["loaded"]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_module_per_size_class(case):
    name, fn, make, sizes = case
    costs, alive = run_sizes(fn, make, sizes, "triton", loads)
    assert costs[0] == 1 and costs[1:] == [0] * (len(sizes) - 1), costs
    src = alive[0].artefacts["source"]
    assert "kiln_ks" in src and "G[0]" in src


def test_a_multiple_of_16_is_its_own_class():
    """Triton's divisibility specialisation, decided by kiln: a size that becomes a
    multiple of 16 is declared one (vector loads), in a module of its own."""
    costs, alive = run_sizes(pointwise, CASES[0][2], [(34, 39), (32, 39), (48, 39)],
                             "triton", loads)
    assert costs == [1, 1, 0], costs
    assert "tl.multiple_of" in alive[1].artefacts["source"]
    assert "tl.multiple_of" not in alive[0].artefacts["source"]


def test_without_size_args_every_size_loads():
    with lifting(False):
        costs, _ = run_sizes(pointwise, CASES[0][2], SIZES, "triton", loads)
    assert costs == [1, 1, 1], costs


@pytest.mark.parametrize("case", CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_odd_sizes_and_layouts(case):
    run_odd(case[1], "triton")


def test_mlp_training_step_through_kiln_compile():
    costs = mlp_training_step_costs(loads, kernel_target="triton")
    assert costs[0] >= 1 and costs[1:] == [0, 0], costs


def test_looped_reductions_share_across_lengths():
    """Rows longer than a persistent block loop over RBLOCK steps up to a size
    argument: lengths of one class share the module."""
    def f(x):
        return x.sum(-1), torch.softmax(x, -1)
    costs, _ = run_sizes(f, lambda r, c: (torch.randn(r, c),), [(3, 9001), (3, 10007), (3, 12011)],
                         "triton", loads)
    assert costs == [1, 0, 0], costs
