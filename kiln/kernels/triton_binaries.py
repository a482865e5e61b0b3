"""Compiled Triton kernels, loaded in a later process without Triton's JIT.

Even when every kernel is in Triton's own disk cache, going through its JIT costs a
process the hash of Triton's installation, the parse of each kernel's source for its
cache key, and a launcher lookup per kernel: 0.3 s for resnet18's kernels, most of a
warm-cache compile. So once a module's kernels are compiled, kiln keeps their binaries
(the cubin and Triton's metadata, copied under ``cache_dir``) and, per module, a
manifest: for each kernel, the compiled hash, its files and the argument signature the
launcher is built from. A later process with the same module source builds each
``CompiledKernel`` straight from those files.

Loaded kernels were compiled for 16-byte-aligned pointers (what the caching allocator
returns); the launcher checks the alignment per call and sends anything else through
Triton's JIT. Any mismatch with the installed Triton (another layout of its classes)
makes ``load`` return None and the JIT path is taken, so this is only ever a shortcut.
"""
from __future__ import annotations

import functools
import os
import pickle
from types import SimpleNamespace

import torch

from ..debug.logs import log_for
from . import cache

_log = log_for("cache")
FORMAT = 1
stats = {"loaded": 0, "saved": 0}


@functools.lru_cache(None)
def _toolchain() -> str:
    import triton
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else ""
    return f"{triton.__version__}|{cap}|{FORMAT}"


def _bin_dir(kernel_hash: str) -> str:
    """Where one compiled kernel's files (cubin, metadata JSON, IRs) are kept."""
    return cache.cache_path("triton_bin", kernel_hash, "")


def _manifest_path(source: str, kinfo) -> str:
    key = cache.key_of(source, repr([(k[0], k[3], k[4]) for k in kinfo]), _toolchain())
    return cache.cache_path("triton_manifest", key, ".pkl")


def save(source: str, kinfo, compiled: dict) -> bool:
    """Remember ``compiled`` (kernel name -> CompiledKernel; for an autotuned kernel the
    winner) for ``source``'s module; only when every kernel of ``kinfo`` is there."""
    wanted = [k[0] for k in kinfo]
    if not wanted or any(n not in compiled for n in wanted):
        return False
    try:
        path = _manifest_path(source, kinfo)
        if os.path.exists(path):
            return True
        entries = {}
        for name in wanted:
            ck = compiled[name]
            files = []
            d = _bin_dir(ck.hash)
            os.makedirs(d, exist_ok=True)
            for fname, src_path in ck.metadata_group.items():
                dst = os.path.join(d, fname)
                if not os.path.exists(dst):
                    with open(src_path, "rb") as f:
                        cache.write_bytes(dst, f.read())
                files.append(fname)
            src = ck.src
            entries[name] = {
                "hash": ck.hash, "files": files,
                "signature": dict(src.signature),
                "constants": dict(getattr(src, "constants", {}) or {}),
                "attrs": dict(getattr(src, "attrs", {}) or {}),
                "arg_names": list(src.fn.arg_names),
            }
        cache.write_bytes(path, pickle.dumps(entries))
        stats["saved"] += 1
        return True
    except Exception as e:                 # noqa: BLE001  (a shortcut: never fatal)
        _log.info("kernels: Triton binaries not kept (%s: %s)", type(e).__name__, e)
        return False


def compiled_kernel(entry: dict, arg_names):
    """Triton's CompiledKernel from its files (``entry["group"]``: file name -> path),
    hash, signature, constants and attrs, as kept here or sent by a compile worker."""
    from triton.compiler.compiler import CompiledKernel
    src = SimpleNamespace(signature=entry["signature"], constants=entry["constants"],
                          attrs=entry["attrs"], fn=SimpleNamespace(arg_names=list(arg_names)))
    return CompiledKernel(src, entry["group"], entry["hash"])


def load(source: str, kinfo) -> dict | None:
    """Kernel name -> (CompiledKernel, its ``cuda_launch`` kernel or None), loaded for
    launching, for every kernel of the module; or None."""
    try:
        path = _manifest_path(source, kinfo)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            entries = pickle.load(f)
        from .cuda_launch import ready
        n_args = {k[0]: len(k[1]) for k in kinfo}
        out = {}
        for name, e in entries.items():
            d = _bin_dir(e["hash"])
            group = {fname: os.path.join(d, fname) for fname in e["files"]}
            out[name] = ready(compiled_kernel(dict(e, group=group), e["arg_names"]),
                              n_args[name])
        stats["loaded"] += 1
        return out
    except Exception as e:                 # noqa: BLE001  (fall back to Triton's JIT)
        _log.info("kernels: Triton binaries not loaded (%s: %s)", type(e).__name__, e)
        return None
