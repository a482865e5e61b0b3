"""A size of a stream: its new kernels compiled on a thread, its calls run op by op meanwhile.

A symbolic graph is compiled per size (``autograd/specialize``): every size lowers again
(cheap), and most reuse the kernels of an earlier size (``codegen/size_args``). A size of
another *size class* (a dim now a multiple of 16, a block chosen for a larger count)
needs a compiler run: Triton's, about half a second a module, or the C++ compiler's.
Serving a LLaMA-style model over 24 lengths, six such runs took 2.5 s of a 14.5 s first
pass, each stalling the one request that met it.

So a size after a graph's first (``shapes.variants.stream_size``), whose plan needs a
compiler run, starts that run on a thread and runs its calls with the aten graph op by
op (``Pending``, the graph's own ops, as eager does) until it is done; the first call
after that builds the variant as usual, finding every kernel compiled. The thread only
compiles: Triton kernels in the compile workers (``launcher.prepare``; the module
itself is imported before, in the calling thread), the C++ library by the compiler's
subprocess. Its little Python work (workers' replies read, kernels made) would still
make each op of the calling thread wait up to the interpreter's 5 ms switch interval
for the GIL back, so the interval is shortened while a compile runs. Loading onto the
device, which could disturb a CUDA graph another thread records, stays in the calling
thread. A compile that failed on the thread is simply done again there, where its
error is reported as any other.

One compile per kernel source: the sizes of one class have one source, so a size whose
source is compiling already waits on that compile (its calls op by op too), and once it
has ended, a size of that source builds at once (``compiled``) — without this, every
size of a class met during its compile started a compile of its own, and every one
ran op by op until its own next call.

A Pending's first call interprets the graph (``fx.Interpreter``): generating its
Python code costs more than one run of it (50-90 ms for resnet18 or a LLaMA).

The first size of a symbolic graph (``stream_size`` "first") compiles on a
thread too once a graph's kernels have been built in this process (``built``): under
automatic dynamic shapes that is a stream's second call, after its first, static,
graph, and its compile (every kernel of the symbolic graph: 1.5-2 s for a LLaMA or a
resnet18 on an H100) overlaps the next calls' own work. The first graph a process
builds compiles in the calling thread, so that kernels that cannot be built on this
machine say so at the first call; a graph's own build error, compiled again in the
calling thread at its first call after the thread ended, is reported there.

With ``KILN_BACKGROUND_SIZE_PLANS`` a size's plan, too, is made elsewhere: in the planner
process (``plan_process``), the Pending's ``plan`` None until it is back
(``planned_elsewhere``); a plan that needs a compiler run then starts (or joins) its
source's compile as above (``_Compile.then``).

The calls a Pending runs op by op are no timing samples for the perf fallback
(``eager_calls``), and they round as eager does, not as the kernels do: a size's
results may differ in the last bits between its calls before and after its kernels
are ready.
"""
from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict

from .. import config
from ..debug.logs import log_for
from ..debug.timing import timed
from ..shapes import variants

_log = log_for("perf_hints")
#: calls a Pending ran op by op (``perf_fallback.one_off_work``: no timing sample)
eager_calls = 0
#: the compiles running, by (target, source hash)
_pending: dict = {}
#: (target, source hash) of compiles ended, least recently met first (bounded)
_ended: OrderedDict = OrderedDict()
_ENDED_KEPT = 4096
_lock = threading.Lock()


def targets(target: str) -> bool:
    """Does ``config.background_size_builds`` name ``target`` ("auto": Triton only)?"""
    return target in {"auto": ("triton",), "1": ("triton", "cpp")}.get(
        config.background_size_builds, ())


def wanted(target: str) -> bool:
    """May this build go to the background? Only for the targets
    ``config.background_size_builds`` names ("auto": Triton's), for a later size of a
    stream, and for the first size of a symbolic graph once any graph was built."""
    if not targets(target):
        return False
    which = variants.current_stream_size()
    return which == "later" or (which == "first" and _built[0] > 0)


#: graphs built in this process (``built``)
_built = [0]


def built() -> None:
    """A graph's kernels were built (``kernels.compile.CompiledGraph``)."""
    _built[0] += 1


def _key(target: str, source: str) -> tuple:
    return target, hashlib.sha1(source.encode()).hexdigest()


def compiled(target: str, source: str) -> bool:
    """Did a background compile of ``source`` end in this process? (Its kernels are
    then found compiled: ``launcher._PREPARED``, the C++ library on disk; one that
    failed there compiles at the build, and reports its error there.)"""
    key = _key(target, source)
    with _lock:
        if key in _ended:
            _ended.move_to_end(key)
            return True
    return False


class _Compile:
    """One source's compile on a thread; ``done`` once it ended, failed or not."""

    def __init__(self, key, plan, target: str, device):
        self.key, self.plan, self.target, self.device = key, plan, target, device
        self.done = threading.Event()
        self.module = None
        #: called once it ended, before ``done`` is set (``then``)
        self.callbacks = []

    def then(self, fn) -> None:
        """Call ``fn()`` once the compile has ended (now, if it has)."""
        with _lock:
            if not self.done.is_set():
                self.callbacks.append(fn)
                return
        fn()

    def start(self) -> None:
        """Start the thread; a Triton module is imported first, here (``launcher.
        import_module``: Python work kept off the thread)."""
        if self.target == "triton":
            from .codegen.triton import launcher
            try:
                self.module = launcher.import_module(self.plan.source)
            except Exception:       # noqa: BLE001  (the thread's compile meets it again)
                self.module = None
        _switch_interval(True)
        threading.Thread(target=self._work, daemon=True, name="kiln-size-prebuild").start()

    def _work(self) -> None:
        try:
            with timed("kernels.background"):
                if self.target == "cpp":
                    from .toolchain import cxx_build
                    cxx_build.compile_cpp(self.plan.source)
                else:
                    from .codegen.triton import launcher
                    launcher.prepare(self.plan.source, self.plan.kinfo, self.device,
                                     self.module)
        except Exception as e:      # noqa: BLE001  (compiled again, and reported, on build)
            _log.info("kernels: background compile of a new size failed (%s: %s); "
                      "compiled at the size's next call", type(e).__name__, e)
        finally:
            with _lock:
                _pending.pop(self.key, None)
                _ended[self.key] = True
                while len(_ended) > _ENDED_KEPT:
                    _ended.popitem(last=False)
                callbacks, self.callbacks = self.callbacks, []
                # set under the lock: a ``then`` after this calls its function itself
                self.done.set()
            _switch_interval(False)
            for fn in callbacks:
                fn()


#: compiles running; the interpreter's switch interval before the first started
_running = [0, None]
#: the switch interval while a compile runs (seconds)
SWITCH_INTERVAL = 2e-4


def _switch_interval(starting: bool) -> None:
    """While a background compile runs, the interpreter hands the GIL between threads
    every ``SWITCH_INTERVAL`` rather than 5 ms: the calling thread runs the program op
    by op, letting the GIL go at every op, and waited up to the whole interval for it
    back whenever the compile's thread had Python work (replies unpickled, kernels
    made). Restored when the last compile ends."""
    with _lock:
        if starting:
            _running[0] += 1
            if _running[0] == 1:
                _running[1] = sys.getswitchinterval()
                sys.setswitchinterval(min(_running[1], SWITCH_INTERVAL))
        else:
            _running[0] -= 1
            if _running[0] == 0 and _running[1] is not None:
                sys.setswitchinterval(_running[1])
                _running[1] = None


def _compile_of(plan, target: str, device) -> _Compile:
    """The compile of ``plan``'s source: the one running, else a new one."""
    key = _key(target, plan.source)
    with _lock:
        job = _pending.get(key)
        new = job is None
        if new:
            job = _pending[key] = _Compile(key, plan, target, device)
    if new:
        job.start()
    return job


class Pending:
    """A size variant whose kernels compile on a thread: called, it runs the aten
    graph op by op; ``done`` once the thread ends (``kernels.compile.CompiledGraph``
    then builds the variant). ``plan`` None: the plan comes from the planner process
    (``planned_elsewhere``), and stays None if it could not be made there (the
    calling thread then plans, and reports any error)."""

    def __init__(self, gm, plan, target: str):
        self.gm, self.plan, self.target = gm, plan, target
        self.device = None
        if target == "triton":
            import torch
            if torch.cuda.is_available():
                self.device = torch.cuda.current_device()
        self.calls = 0
        self.done = _compile_of(plan, target, self.device).done if plan is not None \
            else threading.Event()

    def _planned(self, plan, needs_compiler) -> None:
        """The planner's answer (on its reader thread): the plan, compiled on a thread
        if it needs a compiler run (``done`` once that ended), or None."""
        self.plan = plan
        try:
            if plan is not None and needs_compiler(plan):
                _compile_of(plan, self.target, self.device).then(self.done.set)
                return
        except Exception as e:     # noqa: BLE001  (built, and reported, at the next call)
            _log.info("kernels: a planned size's compile could not start (%s: %s)",
                      type(e).__name__, e)
        self.done.set()

    def __call__(self, *args):
        global eager_calls
        eager_calls += 1
        self.calls += 1
        if self.calls == 1:
            import torch.fx as fx
            return fx.Interpreter(self.gm).run(*args)
        return self.gm(*args)

    def call_boxed(self, args: list):
        inputs = list(args)
        args.clear()
        return self(*inputs)


def wait(timeout: float | None = None) -> bool:
    """Wait for every plan asked of the planner process and every background compile;
    True if there was any and all ended."""
    from . import plan_process
    planned = plan_process.wait(timeout)
    with _lock:
        pending = list(_pending.values())
    return (bool(pending) and all(p.done.wait(timeout) for p in pending)) or planned


def planned_elsewhere(gm, args, target: str, needs_compiler) -> Pending | None:
    """This size as a Pending whose plan the planner process makes (``plan_process``),
    or None where it cannot (the caller plans here)."""
    from . import plan_process
    pending = Pending(gm, None, target)
    job = plan_process.submit(gm, args, target,
                              lambda plan: pending._planned(plan, needs_compiler))
    return pending if job is not None else None
