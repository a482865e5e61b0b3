"""Cases run in worker subprocesses, so that a segfault or a hang costs one case, not
the campaign. A worker that dies is reported as ``segfault`` (with the signal and the
tail of its stderr) and replaced; one that outlives its case's deadline is killed and
reported as ``timeout``."""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time

from .runner import CaseResult

#: Extra seconds a worker gets beyond the case's own alarm before it is killed.
GRACE = 60.0


def _package_paths() -> list[str]:
    """sys.path entries under which this package imports by its current name."""
    here = os.path.dirname(os.path.abspath(__file__))
    top = here
    for _ in __package__.split("."):
        top = os.path.dirname(top)
    repo = os.path.dirname(os.path.dirname(here))
    return [top, repo]


@dataclasses.dataclass
class _Worker:
    proc: subprocess.Popen
    log: str
    task: tuple | None = None
    deadline: float = 0.0


class Pool:
    def __init__(self, jobs: int, timeout: float, log_dir: str | None = None, suppress_errors: bool = False):
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="kiln-fuzz-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(_package_paths() + [self.env.get("PYTHONPATH", "")])
        self.env["FUZZ_SUPPRESS_ERRORS"] = "1" if suppress_errors else "0"
        self._started = 0

    def _start(self) -> _Worker:
        log = os.path.join(self.log_dir, f"worker-{self._started}.log")
        self._started += 1
        proc = subprocess.Popen([sys.executable, "-m", f"{__package__}.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=open(log, "w"), env=self.env, text=True)
        return _Worker(proc, log)

    def _send(self, w: _Worker, task) -> None:
        program, mode = task
        req = {"program": dataclasses.asdict(program), "mode": mode.name, "timeout": self.timeout}
        w.task = task
        w.deadline = time.monotonic() + self.timeout + GRACE
        w.proc.stdin.write(json.dumps(req) + "\n")
        w.proc.stdin.flush()

    def _lost(self, w: _Worker, status: str, why: str) -> CaseResult:
        program, mode = w.task
        try:
            with open(w.log) as f:
                tail = "".join(f.readlines()[-15:])
        except OSError:
            tail = ""
        return CaseResult(program.seed, mode.name, status, error=f"{why}\n{tail}")

    def run(self, tasks):
        """Yield ((program, mode), CaseResult) as cases finish."""
        queue = collections.deque(tasks)
        workers = [self._start() for _ in range(min(self.jobs, len(queue)))]
        sel = selectors.DefaultSelector()
        for w in workers:
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        try:
            while True:
                for w in workers:
                    if w.task is None and queue:
                        self._send(w, queue.popleft())
                busy = [w for w in workers if w.task is not None]
                if not busy:
                    return
                wait = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                for key, _ in sel.select(timeout=wait):
                    w = key.data
                    line = w.proc.stdout.readline()
                    if line:
                        task, w.task = w.task, None
                        yield task, CaseResult.from_json(json.loads(line))
                        continue
                    code = w.proc.wait()
                    name = signal.Signals(-code).name if code < 0 else f"exit status {code}"
                    task = w.task
                    yield task, self._lost(w, "segfault", f"worker died: {name}")
                    self._replace(sel, workers, w)
                now = time.monotonic()
                for w in list(workers):
                    if w.task is not None and now > w.deadline:
                        task = w.task
                        os.kill(w.proc.pid, signal.SIGKILL)
                        w.proc.wait()
                        yield task, self._lost(w, "timeout", f"killed after {self.timeout + GRACE:.0f} s")
                        self._replace(sel, workers, w)
        finally:
            for w in workers:
                if w.proc.poll() is None:
                    w.proc.stdin.close()
                    try:
                        w.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        os.kill(w.proc.pid, signal.SIGKILL)

    def _replace(self, sel, workers, w) -> None:
        sel.unregister(w.proc.stdout)
        workers.remove(w)
        fresh = self._start()
        workers.append(fresh)
        sel.register(fresh.proc.stdout, selectors.EVENT_READ, fresh)
