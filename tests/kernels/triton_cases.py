"""The shared cases through the Triton path, run under TRITON_INTERPRET=1.

Not collected by the normal run (the name has no ``test_`` prefix): ``test_triton.py``
runs this file in a child pytest with the interpreter switched on before triton is
imported.
"""
import os

import pytest

from kiln.kernels import compile_aten_graph

from .cases import CASES, run_case

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_triton.py)")

# The interpreter runs every program in Python: the large reduction case (thousands of
# programs) is left to the C++ run; the rest keep the C++ tolerances.
TRITON_CASES = [c for c in CASES if c[0] != "reductions_large"]


@pytest.mark.parametrize("case", TRITON_CASES, ids=[c[0] for c in TRITON_CASES])
def test_case_triton(case):
    name, fn, make, tol = case
    compiled = run_case(name, fn, make, tol, "triton", compile_aten_graph)
    assert compiled.target == "triton"
    assert "@triton.jit" in compiled.artefacts["source"]
