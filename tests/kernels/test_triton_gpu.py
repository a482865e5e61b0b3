"""The shared cases on a real GPU through Triton (skipped without CUDA)."""
import pytest
import torch

from kiln.kernels import compile_aten_graph

from .cases import CASES, run_case

# factories and tensor constants in these graphs are CPU tensors: eager refuses to mix
GPU_CASES = [c for c in CASES if c[0] not in ("full_arange", "tensor_constant")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_case_triton_gpu(case):
    name, fn, make, tol = case
    compiled = run_case(name, fn, make, tol, None, compile_aten_graph, device="cuda")
    assert compiled.target == "triton"
