"""``cuda_launch``'s parts that need no GPU: reading a PTX entry's parameter count, the
parameter array each launch hands the driver, and which kernels it declines."""
import ctypes
from types import SimpleNamespace

import torch

from kiln.kernels.runtime import cuda_launch

PTX = """
.visible .entry kernel0(
	.param .u64 .ptr .global .align 1 kernel0_param_0,
	.param .u64 .ptr .global .align 1 kernel0_param_1,
	.param .u64 .ptr .global .align 1 kernel0_param_2,
	.param .u64 .ptr .global .align 1 kernel0_param_3
)
.reqntid 128
{
"""


def test_param_count_reads_the_entry():
    assert cuda_launch.param_count(PTX, "kernel0") == 4
    assert cuda_launch.param_count(PTX, "kernel1") is None


def test_launch_passes_addresses_and_null_scratch(monkeypatch):
    seen = []

    def fake_launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        vals = [ctypes.c_uint64.from_address(params[i]).value for i in range(4)]
        seen.append((fn, gx, gy, gz, bx, shared, stream, vals, extra))
        return 0
    monkeypatch.setattr(cuda_launch, "_cu_launch", lambda: fake_launch)
    k = cuda_launch.DriverKernel("kernel0", 1, 777, 128, 0, 4)
    a, b = torch.empty(3), torch.empty(5)
    k.launch(10, 2, 5, [a.data_ptr(), b.data_ptr()])
    k.launch(0, 2, 5, [a.data_ptr(), b.data_ptr()])          # empty grid: no launch
    assert seen == [(777, 10, 2, 1, 128, 0, 5, [a.data_ptr(), b.data_ptr(), 0, 0], None)]


def test_declines_what_it_cannot_launch():
    md = SimpleNamespace(num_ctas=2, launch_cooperative_grid=False, launch_pdl=False,
                         global_scratch_size=0, profile_scratch_size=0, shared=0,
                         num_warps=4, target=SimpleNamespace(backend="cuda"))
    ck = SimpleNamespace(metadata=md, asm={"ptx": PTX}, name="kernel0")
    assert cuda_launch.prepare(ck, 4) is None            # clusters
    md.num_ctas, md.global_scratch_size = 1, 64
    assert cuda_launch.prepare(ck, 4) is None            # scratch memory
    md.global_scratch_size = 0
    assert cuda_launch.prepare(ck, 1) is None            # 3 unexplained parameters
