"""Triton's one-time set-up in a process: started early, in the background, and its
installation hash remembered between processes.

Before its first compile in a process Triton (1) builds or loads its driver helpers (a
C compile on a cold cache, 0.4 s on the H100 machine) and (2) hashes its own sources
and its ``libtriton`` for cache keys (``triton.runtime.cache.triton_key``: 0.8 s cold,
0.35 s with the file in the page cache) — one after the other, before any kernel of
the first graph can start compiling. So

* ``start()`` runs both in background threads as soon as kiln is called with CUDA
  tensors (``backend.prepare``), overlapping the capture, the autograd stage and the
  lowering (gcc and hashing release the GIL), and ``wait()`` joins them before the
  first Triton compile; after both, a third thread compiles a one-line kernel
  (``triton_warmup``), so MLIR's and LLVM's set-up is paid meanwhile too;
* the hash is stored under ``cache_dir``, keyed by the path, size and modification time
  of every file it covers (what ``make`` trusts), and handed to Triton by later
  processes. Anything unexpected (another Triton layout) leaves Triton's own function
  in place.
"""
from __future__ import annotations

import functools
import os
import sys
import threading

from . import cache

_installed = False
_lock = threading.Lock()


def _stamp(triton_dir: str) -> str:
    parts = []
    for sub in ("compiler", "backends", "language", "runtime", "_C"):
        top = os.path.join(triton_dir, sub)
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".py", ".so")):
                    p = os.path.join(root, f)
                    st = os.stat(p)
                    parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
    return cache.key_of(*parts)


def install() -> None:
    """Replace ``triton_key`` (wherever Triton imported it) by the remembered value."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        import triton
        from triton.runtime import cache as tcache
        original = tcache.triton_key
        triton_dir = os.path.dirname(os.path.abspath(triton.__file__))
    except (ImportError, AttributeError):
        return

    @functools.lru_cache(None)
    def remembered_triton_key():
        try:
            path = cache.cache_path("triton_key", _stamp(triton_dir), ".txt")
            if os.path.exists(path):
                with open(path) as f:
                    value = f.read()
                if value:
                    return value
            value = original()
            cache.write_text(path, value)
            return value
        except OSError:
            return original()

    for name, mod in list(sys.modules.items()):
        if name.startswith("triton") and getattr(mod, "triton_key", None) is original:
            mod.triton_key = remembered_triton_key


def _driver() -> None:
    try:
        from triton.runtime.driver import driver
        driver.active                    # noqa: B018  (builds/loads the driver helpers)
    except Exception:                    # noqa: BLE001  (Triton then does it itself)
        pass


def _key() -> None:
    try:
        install()
        from triton.runtime import cache as tcache
        tcache.triton_key()
    except Exception:                    # noqa: BLE001
        pass


_threads: list = []
_warm = threading.Event()


def _warmup() -> None:
    try:
        from . import triton_warmup
        triton_warmup.compile_once()
        _warm.set()
    except Exception:                    # noqa: BLE001  (the first real kernel pays it)
        pass


def warmed() -> bool:
    """Has the warm-up kernel compiled (so MLIR and LLVM are set up)?"""
    return _warm.is_set()


def _setup() -> None:
    import triton  # noqa: F401  (imported once, here, not by both threads)
    both = [threading.Thread(target=fn, name=f"kiln-triton{fn.__name__}", daemon=True)
            for fn in (_driver, _key)]
    for t in both:
        t.start()
    for t in both:
        t.join()
    # not joined by wait(): the first real compiles may run beside it
    threading.Thread(target=_warmup, name="kiln-triton-warmup",
                     daemon=True).start()


def start() -> None:
    """Begin Triton's set-up in background threads (once per process): its import, then
    the driver's C helpers and the installation hash side by side, then the warm-up
    compile."""
    with _lock:
        if not _threads:
            t = threading.Thread(target=_setup, name="kiln-triton-setup", daemon=True)
            t.start()
            _threads.append(t)


def wait() -> None:
    """Block until the set-up is done (starting it if nobody has)."""
    start()
    for t in _threads:
        t.join()
