"""Triton's one-time set-up in a process: started early, in the background, with its
installation key taken from file stamps instead of file contents.

Before its first compile in a process Triton (1) builds or loads its driver helpers (a
C compile on a cold cache, 0.4 s on the H100 machine), (2) hashes its own sources and
its ``libtriton`` for cache keys (``triton.runtime.cache.triton_key``: 0.8-1.1 s cold)
and (3) sets up MLIR and LLVM at its first compile (0.3-0.5 s). So

* ``install()`` replaces ``triton_key`` by a key of the path, size and modification
  time of every file it covers (what ``make`` trusts; 10 ms instead of a second): a
  reinstalled or edited Triton still gets new cache keys;
* ``start()`` runs the rest in background threads as soon as kiln is called with CUDA
  tensors (``backend.prepare``), overlapping the capture, the autograd stage and the
  lowering (gcc and LLVM release the GIL): the driver helpers in one, and in another a
  one-line kernel compiled for the device's target (``triton_worker.warm_up``), which
  needs no driver, so MLIR's and LLVM's set-up is paid meanwhile too. kiln's own kernels need
  no driver either (``triton_build``, ``cuda_launch``): ``wait()`` only waits for
  the import and the key, ``wait_for("driver")`` is for Triton's JIT (the fallbacks).

Anything unexpected (another Triton layout) leaves Triton's own behaviour in place.
"""
from __future__ import annotations

import threading

from .triton_stamp import stamp, triton_dir, triton_stamp  # noqa: F401  (the key; re-exported)

_installed = False
_lock = threading.Lock()


def install() -> None:
    """Replace ``triton_key`` (wherever Triton imported it) by the stamp key."""
    global _installed
    if _installed:
        return
    _installed = True
    st = triton_stamp()
    if st is None:
        return
    try:
        from .triton_worker import install_stamp
        install_stamp(st)
    except (ImportError, AttributeError):
        return


def _driver() -> None:
    try:
        from triton.runtime.driver import driver
        driver.active                    # noqa: B018  (builds/loads the driver helpers)
    except Exception:                    # noqa: BLE001  (Triton then does it itself)
        pass


_setup_thread: list = []
_threads: dict = {}          # "warmup" / "driver" -> Thread, made by the set-up thread
_warm = threading.Event()


def _warmup() -> None:
    try:
        from .triton_worker import warm_up
        from .triton_build import target
        warm_up(target())
        _warm.set()
    except Exception:                    # noqa: BLE001  (the first real kernel pays it)
        pass


def warmed() -> bool:
    """Has the warm-up kernel compiled (so MLIR and LLVM are set up)?"""
    return _warm.is_set()


def _setup() -> None:
    import triton  # noqa: F401  (imported once, here, not by both threads)
    install()
    for name, fn in (("warmup", _warmup), ("driver", _driver)):
        t = threading.Thread(target=fn, name=f"kiln-triton-{name}", daemon=True)
        _threads[name] = t
        t.start()


def start() -> None:
    """Begin Triton's set-up in background threads (once per process): its import and
    key, then the driver helpers beside the warm-up compile; and start the compile
    workers (``triton_pool``)."""
    with _lock:
        if not _setup_thread:
            t = threading.Thread(target=_setup, name="kiln-triton-setup", daemon=True)
            t.start()
            _setup_thread.append(t)
            from . import triton_pool
            triton_pool.start()


def wait() -> None:
    """Block until Triton is imported and keyed (starting the set-up if nobody has);
    the warm-up and the driver may still be running."""
    start()
    _setup_thread[0].join()


def wait_for(name: str) -> None:
    """Block until the set-up's ``"warmup"`` or ``"driver"`` thread is done."""
    wait()
    t = _threads.get(name)
    if t is not None:
        t.join()
