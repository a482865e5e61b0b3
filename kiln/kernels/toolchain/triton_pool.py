"""Worker processes that compile a graph's Triton kernels side by side.

``start()`` (from ``triton_setup.start``, when kiln is first called with CUDA tensors)
launches ``config.compile_workers`` processes running ``triton_worker.py``; they
import Triton and warm up while this process captures and lowers. ``run(jobs,
local)`` then shares a graph's compile jobs between the workers that are ready and
this process itself (``local``, in ``config.compile_threads`` threads): a graph
with one kernel gets it compiled here at once when no worker is warm yet, a graph
with many gets them spread over every process. A job a worker cannot do (an
error, a dead worker) is done locally. Workers live as long as this process; each
ends when its input pipe closes.
"""
from __future__ import annotations

import atexit
import os
import queue
import subprocess
import sys
import threading

from ... import config
from . import triton_worker

_jobs: queue.Queue = queue.Queue()      # (job, slot): slot is a one-item queue for the reply
_workers: list = []
_lock = threading.Lock()
#: How long to wait for a worker's compile before doing it here instead.
WAIT_S = 600
stats = {"remote": 0, "local": 0, "failed": 0}


class _Worker:
    def __init__(self, stamp: str, arch: int, warp_size: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-P", triton_worker.__file__, stamp, str(arch), str(warp_size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
        self.hello, self.started = None, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True,
                                       name=f"kiln-compile-worker-{self.proc.pid}")
        self.thread.start()

    def _serve(self) -> None:
        """Take jobs from the shared queue once the worker says it is ready; every job
        taken gets a reply, an error one if the worker fails."""
        try:
            self.hello = triton_worker.read_message(self.proc.stdout)
        except Exception:                # noqa: BLE001
            self.hello = None
        ok = isinstance(self.hello, dict)
        self.started.set()
        while ok:
            job, slot = _jobs.get()
            reply = None
            try:
                triton_worker.write_message(self.proc.stdin, job)
                reply = triton_worker.read_message(self.proc.stdout)
            except Exception:            # noqa: BLE001  (a dead or confused worker)
                pass
            ok = isinstance(reply, dict)
            slot.put(reply if ok else {"error": "worker ended"})

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass


_started = False
_launcher: list = []


def start() -> None:
    """Launch the workers (once per process, from a background thread: each launch is
    a fork of this large process; none under TRITON_INTERPRET, without CUDA, or with
    ``compile_workers`` 0)."""
    global _started
    with _lock:
        if _started or config.compile_workers <= 0 or os.environ.get("TRITON_INTERPRET") == "1":
            return
        _started = True
        _launcher.append(threading.Thread(target=_launch, name="kiln-compile-pool", daemon=True))
        _launcher[0].start()


def wait_started(timeout: float = 60) -> list:
    """Each worker's greeting once all have started (None for one that failed)."""
    if _launcher:
        _launcher[0].join(timeout)
    return [w.hello if w.started.wait(timeout) else None for w in list(_workers)]


def _launch() -> None:
    try:
        import torch
        from .triton_stamp import triton_stamp
        stamp = triton_stamp()
        if stamp is None or not torch.cuda.is_available():
            return
        major, minor = torch.cuda.get_device_capability()
        atexit.register(stop)
        for _ in range(config.compile_workers):
            _workers.append(_Worker(stamp, major * 10 + minor, 32))
    except Exception:                    # noqa: BLE001  (everything compiles locally)
        return


def stop() -> None:
    for w in _workers:
        w.stop()


def submit(job: dict):
    """Queue ``job`` for the next free worker without waiting: the one-item queue its
    reply will land in, or None when no worker runs."""
    if not _workers:
        return None
    slot = queue.Queue(1)
    _jobs.put((job, slot))
    return slot


def run(jobs: list, local, steal: bool = True) -> list:
    """Each of ``jobs`` (a worker's job dict, or None for what only this process can
    do) done by a ready worker or by ``local(i)`` here, in ``config.compile_threads``
    threads (Triton releases the GIL in ptxas and parts of LLVM); returns the workers'
    replies in job order (None where ``local`` did the job, or where a worker failed
    and ``local`` then did it). ``steal`` False: jobs queued for the workers stay
    theirs (a background compile, whose Python front end here would hold the GIL the
    calling thread is running the program with)."""
    from concurrent.futures import ThreadPoolExecutor
    mine, slots, here = queue.Queue(), {}, set()
    for i, job in enumerate(jobs):
        if job is not None and _workers:
            slots[i] = queue.Queue(1)
            _jobs.put((job, slots[i]))
        else:
            mine.put(i)
    index = {id(s): i for i, s in slots.items()}

    def helper():
        while True:
            try:
                i = mine.get_nowait()
            except queue.Empty:
                if not steal:
                    return
                try:
                    job, slot = _jobs.get_nowait()
                except queue.Empty:
                    return
                if id(slot) not in index:     # another thread's graph: the workers' then
                    _jobs.put((job, slot))
                    return
                i = index[id(slot)]
                here.add(i)
            local(i)
            stats["local"] += 1
    n = max(1, min(config.compile_threads, len(jobs)))
    if n == 1:
        helper()
    else:
        with ThreadPoolExecutor(n) as ex:
            for f in [ex.submit(helper) for _ in range(n)]:
                f.result()
    replies = [None] * len(jobs)
    for i, slot in slots.items():
        if i in here:
            continue
        try:
            reply = slot.get(timeout=WAIT_S)
        except queue.Empty:
            reply = {"error": "no reply"}
        if "error" in reply:
            stats["failed"] += 1
            local(i)
        else:
            stats["remote"] += 1
            replies[i] = reply
    return replies
