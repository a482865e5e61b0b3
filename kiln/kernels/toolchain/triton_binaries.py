"""Compiled Triton kernels, loaded in a later process without Triton's JIT.

Even when every kernel is in Triton's own disk cache, going through its JIT costs a
process the hash of Triton's installation, the parse of each kernel's source for its
cache key, and a launcher lookup per kernel: 0.3 s for resnet18's kernels, most of a
warm-cache compile. So once a module's kernels are compiled, kiln keeps their binaries
(the cubin and Triton's metadata, copied under ``cache_dir``) and, per module, a
manifest: for each kernel, the compiled hash, its files and the argument signature the
launcher is built from. A later process with the same module source builds each
``CompiledKernel`` straight from those files.

The manifest is a sealed entry (``kiln.disk_cache``: its key and content hash are
checked before it is unpickled); each kernel file is stored under the sha256 of its
bytes, which the manifest names and ``load`` checks before Triton reads the file. A
manifest or file that fails its check makes ``load`` return None: the module then goes
through Triton's JIT and ``save`` writes everything again.

Loaded kernels were compiled for 16-byte-aligned pointers (what the caching allocator
returns); the launcher checks the alignment per call and sends anything else through
Triton's JIT. Any mismatch with the installed Triton (another layout of its classes)
makes ``load`` return None and the JIT path is taken, so this is only ever a shortcut.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
from types import SimpleNamespace

import torch

from ...debug.logs import log_for
from . import cxx_build

_log = log_for("cache")
#: Bumped when the manifest's layout changes.
FORMAT = 2
stats = {"loaded": 0, "saved": 0}


@functools.lru_cache(None)
def _toolchain() -> str:
    import triton
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else ""
    return f"{triton.__version__}|{cap}|{FORMAT}"


def _manifest_key(source: str, kinfo) -> str:
    return cxx_build.key_of(source, repr([(k[0], k[3], k[4]) for k in kinfo]), _toolchain())


def _file_path(fname: str, digest: str) -> str | None:
    """Where a kept kernel file whose bytes have sha256 ``digest`` is, checked; None
    when nowhere (a file there with other bytes is rejected)."""
    ext = os.path.splitext(fname)[1]
    for path in cxx_build.locations("triton_bin", digest, ext):
        try:
            with open(path, "rb") as f:
                ok = hashlib.sha256(f.read()).hexdigest() == digest
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            cxx_build.reject(path, f"{type(e).__name__}: {e.strerror or e}")
            continue
        if ok:
            return path
        cxx_build.reject(path, "its content does not match its sha256")
    return None


def save(source: str, kinfo, compiled: dict) -> bool:
    """Remember ``compiled`` (kernel name -> CompiledKernel; for an autotuned kernel the
    winner) for ``source``'s module; only when every kernel of ``kinfo`` is there."""
    wanted = [k[0] for k in kinfo]
    if not wanted or any(n not in compiled for n in wanted):
        return False
    try:
        entries = {}
        for name in wanted:
            ck = compiled[name]
            files = {}
            for fname, src_path in ck.metadata_group.items():
                with open(src_path, "rb") as f:
                    data = f.read()
                digest = hashlib.sha256(data).hexdigest()
                if _file_path(fname, digest) is None:
                    cxx_build.store_file("triton_bin", digest, os.path.splitext(fname)[1], data)
                files[fname] = digest
            src = ck.src
            entries[name] = {
                "hash": ck.hash, "files": files,
                "signature": dict(src.signature),
                "constants": dict(getattr(src, "constants", {}) or {}),
                "attrs": dict(getattr(src, "attrs", {}) or {}),
                "arg_names": list(src.fn.arg_names),
            }
        cxx_build.write_entry("triton_manifest", _manifest_key(source, kinfo), ".pkl",
                          pickle.dumps(entries))
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


def kept(source: str, kinfo) -> bool:
    """Are the binaries of ``source``'s module kept (``load`` would find a manifest)?"""
    try:
        return cxx_build.read_entry("triton_manifest", _manifest_key(source, kinfo), ".pkl") \
            is not None
    except Exception:                      # noqa: BLE001  (then it is not)
        return False


def load(source: str, kinfo, device: int | None = None) -> dict | None:
    """Kernel name -> (CompiledKernel, its ``cuda_launch`` kernel or None), loaded for
    launching on ``device`` (default: the current one), for every kernel of the
    module; or None (then the JIT compiles them)."""
    try:
        found = cxx_build.read_entry("triton_manifest", _manifest_key(source, kinfo), ".pkl")
        if found is None:
            return None
        entries = pickle.loads(found[1])
        n_args = {k[0]: len(k[1]) for k in kinfo}
        if set(entries) != set(n_args):
            raise ValueError(f"kernels {sorted(entries)}, not {sorted(n_args)}")
        groups = {}
        for name, e in entries.items():
            group = {fname: _file_path(fname, digest) for fname, digest in e["files"].items()}
            if None in group.values():
                return None                # rejected (logged): compiled again, kept again
            groups[name] = group
        from ..runtime.cuda_launch import ready
        out = {}
        for name, e in entries.items():
            out[name] = ready(compiled_kernel(dict(e, group=groups[name]), e["arg_names"]),
                              n_args[name], device)
        stats["loaded"] += 1
        return out
    except Exception as e:                 # noqa: BLE001  (fall back to Triton's JIT)
        _log.info("kernels: Triton binaries not loaded (%s: %s)", type(e).__name__, e)
        return None
