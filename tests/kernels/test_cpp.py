"""Every lowered op and fused combinations through the C++ path, against eager."""
import pytest

from kiln.kernels import compile_aten_graph

from .cases import CASES, run_case


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_case_cpp(case):
    name, fn, make, tol = case
    run_case(name, fn, make, tol, "cpp", compile_aten_graph)
