"""The GELU step of ``recompute_cases.py`` through the Triton path (bf16 autocast, fp32), run
under TRITON_INTERPRET=1 by ``test_recompute_pointwise.py`` (no ``test_`` prefix: the
interpreter must be switched on before triton is imported)."""
import os

import pytest
import torch

from kiln import config

from .recompute_cases import check_gelu_step

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_recompute_pointwise.py)")


@pytest.mark.parametrize("dtype,float_pow", [(torch.bfloat16, False), (torch.bfloat16, True),
                                             (None, False)],
                         ids=["bf16_autocast", "bf16_autocast_float32_pieces", "fp32"])
def test_gelu_backward_recomputes_triton(dtype, float_pow, monkeypatch):
    monkeypatch.setattr(config, "kernel_target", "triton")
    check_gelu_step(dtype, 3e-2 if dtype else 1e-5, monkeypatch, float_pow)
