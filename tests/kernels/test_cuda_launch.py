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


def test_ready_loads_on_the_device_it_is_given(monkeypatch):
    """A compile-pool thread starts on device 0: ``ready`` makes the graph's device
    current for the load (a kernel loaded into another device's context fails to launch
    with CUDA error 400)."""
    import contextlib
    entered, loaded = [], []

    @contextlib.contextmanager
    def device(d):
        entered.append(d)
        yield
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(cuda_launch, "prepare", lambda ck, n, dev: loaded.append((n, dev)) or "drv")
    assert cuda_launch.ready("ck", 3, 1) == ("ck", "drv")
    assert entered == [1] and loaded == [(3, 1)]


def test_kernels_compiled_in_pool_threads_launch_on_the_second_gpu(tmp_path):
    """Two GPUs: a graph compiled for cuda:1 with a cold kernel cache (its kernels
    compiled and loaded in the compile pool's threads) runs, compiled, on cuda:1."""
    import pytest
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    import kiln

    def f(x, y):
        return torch.sin(x) * y + torch.cos(y).sum(0)

    x, y = (torch.randn(64, 33, device="cuda:1") for _ in range(2))
    prev = torch.cuda.current_device()
    torch.cuda.set_device(1)
    try:
        with kiln.config.patch(cache_dir=str(tmp_path), suppress_errors=False, compile_threads=2,
                               perf_fallback=False):
            out = kiln.compile(f)(x, y)
    finally:
        torch.cuda.set_device(prev)
    torch.testing.assert_close(out, f(x, y))
