"""Launching compiled Triton kernels through the CUDA driver with ctypes.

Triton (3.6) builds a C launcher for every argument signature it meets — a gcc run,
0.3 s each on a cold cache, in front of a process's first launch of each kernel.
kiln's kernels take only tensor pointers (every size is a constexpr), so one generic
path does for all of them: the binary is loaded with the driver calls Triton's helper
makes (so Triton's driver, itself a gcc build on a cold cache, is not needed either),
and each launch packs the pointers into a ``void*`` array for ``cuLaunchKernel``. Per
launch that is a few microseconds of Python, less than Triton's own launcher wrapper.

Only plain launches are taken here: one CTA per cluster, no cooperative or programmatic
launch, no scratch memory, no tensor descriptors, and a kernel whose parameters are its
pointers plus at most two trailing scratch pointers (Triton passes null ones, as here).
For anything else ``prepare`` returns None and Triton's launcher is used.
"""
from __future__ import annotations

import ctypes
import functools
import re
import threading

_P = ctypes.c_void_p
_U = ctypes.c_uint


_I = ctypes.c_int
_REF = ctypes.POINTER
# CUDA driver enums
_FUNC_MAX_THREADS_PER_BLOCK, _FUNC_SHARED_SIZE_BYTES, _FUNC_MAX_DYNAMIC_SHARED = 0, 1, 8
_DEV_MAX_SHARED_PER_BLOCK_OPTIN = 97
_CACHE_PREFER_SHARED = 1


@functools.lru_cache(None)
def _cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    for name, args in {
        "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P],
        "cuCtxGetCurrent": [_REF(_P)],
        "cuCtxSetCurrent": [_P],
        "cuDeviceGet": [_REF(_I), _I],
        "cuDevicePrimaryCtxRetain": [_REF(_P), _I],
        "cuDeviceGetAttribute": [_REF(_I), _I, _I],
        "cuModuleLoadData": [_REF(_P), ctypes.c_char_p],
        "cuModuleGetFunction": [_REF(_P), _P, ctypes.c_char_p],
        "cuFuncGetAttribute": [_REF(_I), _I, _P],
        "cuFuncSetAttribute": [_P, _I, _I],
        "cuFuncSetCacheConfig": [_P, _I],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, _I
    return lib


def _cu_launch():
    return _cuda().cuLaunchKernel


def _check(err, what):
    if err:
        raise RuntimeError(f"{what} failed with CUDA error {err}")


def load_binary(name: str, cubin: bytes, shared: int, device: int):
    """(module, function, max threads per block) of kernel ``name`` in ``cubin``, loaded
    into the device's primary context, with ``shared`` bytes of dynamic shared memory
    allowed — what Triton's driver helper ``load_binary`` does; None if the device
    cannot give that much shared memory."""
    cu = _cuda()
    dev, ctx = _I(), _P()
    _check(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    _check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        _check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    optin = _I()
    _check(cu.cuDeviceGetAttribute(ctypes.byref(optin), _DEV_MAX_SHARED_PER_BLOCK_OPTIN, dev),
           "cuDeviceGetAttribute")
    if shared > optin.value:
        return None
    mod, fn = _P(), _P()
    _check(cu.cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
    _check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction")
    threads = _I()
    _check(cu.cuFuncGetAttribute(ctypes.byref(threads), _FUNC_MAX_THREADS_PER_BLOCK, fn),
           "cuFuncGetAttribute")
    if shared > 49152:
        static = _I()
        _check(cu.cuFuncSetCacheConfig(fn, _CACHE_PREFER_SHARED), "cuFuncSetCacheConfig")
        _check(cu.cuFuncGetAttribute(ctypes.byref(static), _FUNC_SHARED_SIZE_BYTES, fn),
               "cuFuncGetAttribute")
        _check(cu.cuFuncSetAttribute(fn, _FUNC_MAX_DYNAMIC_SHARED, optin.value - static.value),
               "cuFuncSetAttribute")
    return mod.value, fn.value, threads.value


def param_count(ptx: str, name: str) -> int | None:
    """How many parameters the PTX entry ``name`` declares."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\(([^)]*)\)", ptx)
    return None if m is None else len(re.findall(r"\.param\s", m.group(1)))


class DriverKernel:
    """One loaded kernel: ``launch(gx, gy, stream, ptrs)`` with the arguments' device
    addresses. The parameter array is allocated once (trailing scratch pointers stay
    null); a lock keeps two threads from filling it at once, since the driver reads it
    while the GIL is released."""

    def __init__(self, name, module, function, threads, shared, n_params):
        self.name, self.module, self.function = name, module, function
        self.threads, self.shared = threads, shared
        self._vals = (ctypes.c_uint64 * max(n_params, 1))()
        base = ctypes.addressof(self._vals)
        self._params = (_P * max(n_params, 1))(*range(base, base + 8 * max(n_params, 1), 8))
        self._lock = threading.Lock()

    def launch(self, gx, gy, stream, ptrs):
        if gx * gy == 0:
            return
        with self._lock:
            self._vals[0:len(ptrs)] = ptrs
            err = _cu_launch()(self.function, gx, gy, 1, self.threads, 1, 1, self.shared,
                               stream, self._params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel({self.name}) failed with CUDA error {err}")


def _plain(md) -> bool:
    return (getattr(md, "num_ctas", 1) == 1
            and not getattr(md, "launch_cooperative_grid", False)
            and not getattr(md, "launch_pdl", False)
            and not getattr(md, "global_scratch_size", 0)
            and not getattr(md, "profile_scratch_size", 0)
            and not getattr(md, "tensordesc_meta", None))


def prepare(ck, n_args: int, device: int | None = None) -> DriverKernel | None:
    """Load ``ck`` (a Triton CompiledKernel taking ``n_args`` pointers) for launching
    on ``device`` (default: the current one), or None where Triton's own launcher must
    do it."""
    try:
        md = ck.metadata
        if not _plain(md) or getattr(md.target, "backend", "cuda") != "cuda":
            return None
        n_params = param_count(ck.asm["ptx"], ck.name)
        if n_params is None or not 0 <= n_params - n_args <= 2:
            return None
        import torch
        device = torch.cuda.current_device() if device is None else device
        loaded = load_binary(ck.name, ck.kernel, md.shared, device)
        if loaded is None:
            return None
        module, function, max_threads = loaded
        threads = 32 * md.num_warps
        if threads > max_threads:
            return None
        return DriverKernel(ck.name, module, function, threads, md.shared, n_params)
    except Exception:                 # noqa: BLE001  (Triton's launcher instead)
        return None


def ready(ck, n_args: int, device: int | None = None):
    """``ck`` loaded for launching on ``device`` (default: the current one):
    ``(ck, DriverKernel)`` where this module can launch it, else ``(ck, None)`` with
    Triton's handles and launcher built (a C compile per argument signature, 0.3 s each
    on a cold cache). Loading binds a kernel to the context that is current in the
    loading thread, so the device is made current for the load: a compile-pool thread
    starts on device 0, and a kernel loaded there fails with CUDA error 400 (invalid
    handle) when another device's process launches it."""
    import torch
    device = torch.cuda.current_device() if device is None else device
    with torch.cuda.device(device):
        drv = prepare(ck, n_args, device)
        if drv is None:
            from ..toolchain import triton_setup
            triton_setup.wait_for("driver")
            ck._init_handles()
    return ck, drv
