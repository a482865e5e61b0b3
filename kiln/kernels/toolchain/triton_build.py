"""Compiling a kiln kernel with Triton for the current GPU, without Triton's JIT.

Triton's JIT (``warmup`` or a launch) asks its driver for the target, and the driver's
first use builds its C helpers (a gcc run, 0.3 s on a cold cache): every compile of a
process would wait for it. kiln knows everything the JIT would work out — each
parameter is a pointer to a known dtype, aligned to 16 bytes (what the caching
allocator returns; the launcher checks it per call), and the rest are constexprs — so
it hands Triton the source, signature and target itself; the binary is then loaded
and launched by ``cuda_launch``, and Triton's driver is only needed by the fallbacks.
"""
from __future__ import annotations

import functools

import torch

from .triton_worker import compile_source

_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.float64: "fp64", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
          torch.int64: "i64", torch.uint8: "u8", torch.bool: "i1"}


@functools.lru_cache(None)
def target():
    """The current device's Triton target (what the driver would report)."""
    from triton.backends.compiler import GPUTarget
    major, minor = torch.cuda.get_device_capability()
    return GPUTarget("cuda", major * 10 + minor, 32)


def signature(fn, dtypes, consts) -> dict | None:
    """Triton's signature for ``fn`` (a JITFunction) with pointers to ``dtypes`` and
    constexprs ``consts``; None for a dtype Triton names otherwise."""
    names = list(fn.arg_names)
    if any(d not in _TYPES for d in dtypes) or set(names[len(dtypes):]) != set(consts):
        return None
    sig = {n: "*" + _TYPES[d] for n, d in zip(names, dtypes)}
    sig.update({n: "constexpr" for n in names[len(dtypes):]})
    return sig


def compile_kernel(fn, dtypes, consts: dict, options: dict):
    """A CompiledKernel of ``fn`` for this device, pointers taken as 16-byte aligned;
    None where kiln cannot say the signature (then the JIT compiles it)."""
    sig = signature(fn, dtypes, consts)
    if sig is None:
        return None
    return compile_source(fn, sig, consts, target(), options)
