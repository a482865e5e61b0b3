"""Kernels of one process by content (``launcher.kernel_key``): the same kernel text in two
module texts at different lines is one key (Triton's own key counts the line, and would
compile it again); another text, dtype, constexpr or option is another key. The reuse at
load time itself is GPU-only (``test_triton_gpu.py``)."""
import pytest
import torch

from kiln.kernels.codegen.triton import launcher
from kiln.kernels.toolchain import cxx_build

triton = pytest.importorskip("triton")

_KERNEL = """
@triton.jit
def kernel0(in0, out0, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out0 + x, tl.load(in0 + x) * 3.0)
"""
_HEAD = "import triton\nimport triton.language as tl\n"


def _kernel(src, tmp_path, monkeypatch):
    from kiln import config
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    mod, _ = cxx_build.load_module("triton", src)
    return mod.kernel0


def test_same_text_at_another_line_is_one_key(tmp_path, monkeypatch):
    a = _kernel(_HEAD + "# a\n" * 3 + _KERNEL, tmp_path, monkeypatch)
    b = _kernel(_HEAD + "# b\n" * 9 + _KERNEL, tmp_path, monkeypatch)
    c = _kernel(_HEAD + _KERNEL.replace("3.0", "5.0"), tmp_path, monkeypatch)
    dt = [torch.float32, torch.float32]
    key = launcher.kernel_key(a, dt, {"XBLOCK": 128}, {"num_warps": 4}, 0)
    assert launcher.kernel_key(b, dt, {"XBLOCK": 128}, {"num_warps": 4}, 0) == key
    others = [launcher.kernel_key(c, dt, {"XBLOCK": 128}, {"num_warps": 4}, 0),
              launcher.kernel_key(a, [torch.bfloat16, torch.float32], {"XBLOCK": 128},
                                  {"num_warps": 4}, 0),
              launcher.kernel_key(a, dt, {"XBLOCK": 256}, {"num_warps": 4}, 0),
              launcher.kernel_key(a, dt, {"XBLOCK": 128}, {"num_warps": 8}, 0),
              launcher.kernel_key(a, dt, {"XBLOCK": 128}, {"num_warps": 4}, 1)]
    assert all(k != key for k in others) and len(set(others)) == len(others)
