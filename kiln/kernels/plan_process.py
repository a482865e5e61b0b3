"""A size's plan made in another process: the planner (``plan_worker``).

A stream of sizes plans every size again (``autograd/specialize``): lowering,
scheduling and code generation, about 75 ms of Python a size for resnet18 in bf16 on
an H100 host. Made on a thread of this process it gained nothing measurable: the
thread's Python shares the GIL with the calls the program makes meanwhile. A
process has an interpreter of its own, so a size's plan costs the calling thread
only the graph written out (``encode``), the plan read back, and its calls run op by
op until then (``size_prebuild.Pending``).

The planner gets what the plan reads and no data: the specialised aten graph
(nodes, targets, arguments, the metadata the autograd stage recorded), the graph's
``meta``, each input's layout, the target and kiln's settings now. It runs the same
``compile.checked_plan`` on that and sends the plan back pickled as the graph cache
pickles it (loop bodies dropped: they went into the source). A graph this cannot
write out (an argument or a target of another kind, a constant tensor: device data)
is planned in the calling thread, as is everything while kiln's logs are on (the
planner's would not reach them), and every plan once the planner failed to start
or died.
"""
from __future__ import annotations

import itertools
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading

import torch
import torch.fx as fx
from torch.fx.immutable_collections import immutable_dict, immutable_list

from .. import config
from ..debug import logs
from ..debug.logs import log_for

_log = log_for("perf_hints")


# --- the graph written out, read back (both sides) -------------------------------------
class Ref:
    """A node argument: the node at this index of the graph."""
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __reduce__(self):
        return Ref, (self.i,)


class TensorMeta:
    """A tensor's layout: what a meta value or an input is to a plan."""
    __slots__ = ("shape", "stride", "offset", "dtype", "device")

    def __init__(self, t: torch.Tensor):
        self.shape, self.stride = tuple(t.shape), tuple(t.stride())
        self.offset, self.dtype, self.device = t.storage_offset(), t.dtype, str(t.device)

    def __reduce__(self):
        return _tensor_meta, (self.shape, self.stride, self.offset, self.dtype, self.device)

    def meta(self) -> torch.Tensor:
        if self.offset == 0:
            return torch.empty_strided(self.shape, self.stride, dtype=self.dtype,
                                       device="meta")
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) \
            if all(self.shape) else 0
        return torch.empty(self.offset + span, dtype=self.dtype, device="meta").as_strided(
            self.shape, self.stride, self.offset)


def _tensor_meta(shape, stride, offset, dtype, device):
    m = TensorMeta.__new__(TensorMeta)
    m.shape, m.stride, m.offset, m.dtype, m.device = shape, stride, offset, dtype, device
    return m


class Unencodable(Exception):
    """Something in the graph this module does not write out."""


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout)


def _value(x, index):
    """An argument or metadata value written out: nodes as ``Ref``, tensors as
    ``TensorMeta`` (meta tensors only: a real one is data)."""
    if isinstance(x, _PLAIN):
        return x
    if isinstance(x, fx.Node):
        return Ref(index[x])
    if isinstance(x, torch.Tensor):
        if x.device.type != "meta":
            raise Unencodable(f"a {x.device.type} tensor")
        return TensorMeta(x)
    if type(x) in (tuple, list):
        return type(x)(_value(y, index) for y in x)
    if type(x) is immutable_list:       # a node's arguments: plain again when read back
        return [_value(y, index) for y in x]
    if type(x) in (dict, immutable_dict):
        return {k: _value(v, index) for k, v in x.items()}
    if type(x) is slice:
        return slice(_value(x.start, index), _value(x.stop, index), _value(x.step, index))
    raise Unencodable(type(x).__name__)


def _target(t):
    if isinstance(t, str):
        return t
    if isinstance(t, torch._ops.OpOverload):
        return ("op", t.namespace, t._schema.name.split("::")[-1], t._overloadname)
    mod, name = getattr(t, "__module__", None), getattr(t, "__qualname__", None)
    if mod in ("_operator", "operator", "builtins") and name and "." not in name:
        return ("py", mod, name)
    raise Unencodable(f"target {t!r}")


def encode(gm: fx.GraphModule) -> tuple:
    """``gm``'s graph and ``meta`` as plain picklable values (``Unencodable`` if not)."""
    index, nodes = {}, []
    for i, n in enumerate(gm.graph.nodes):
        index[n] = i
        if n.op not in ("placeholder", "call_function", "output"):
            raise Unencodable(f"a {n.op} node")
        nodes.append((n.op, n.name, _target(n.target), _value(n.args, index),
                      _value(n.kwargs, index), {k: _value(v, index) for k, v in n.meta.items()}))
    return nodes, {k: _value(v, {}) for k, v in gm.meta.items()}


def _read(x, nodes):
    if isinstance(x, Ref):
        return nodes[x.i]
    if isinstance(x, TensorMeta):
        return x.meta()
    if type(x) in (tuple, list):
        return type(x)(_read(y, nodes) for y in x)
    if type(x) is dict:
        return {k: _read(v, nodes) for k, v in x.items()}
    if type(x) is slice:
        return slice(_read(x.start, nodes), _read(x.stop, nodes), _read(x.step, nodes))
    return x


def _target_of(t):
    if isinstance(t, str):
        return t
    if t[0] == "op":
        from .toolchain.graph_cache import _op_by_name
        return _op_by_name(*t[1:])
    import importlib
    return getattr(importlib.import_module(t[1]), t[2])


def decode(encoded) -> fx.GraphModule:
    """The graph module ``encode`` wrote out (no Python code generated)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    node_list, gm_meta = encoded
    graph = fx.Graph()
    nodes = []
    for op, name, target, args, kwargs, meta in node_list:
        args, kwargs = _read(args, nodes), _read(kwargs, nodes)
        if op == "output":
            n = graph.output(args[0])
        else:
            n = graph.create_node(op, _target_of(target), args, kwargs, name=name)
        n.meta.update({k: _read(v, nodes) for k, v in meta.items()})
        nodes.append(n)
    gm = _LazyGraphModule(torch.nn.Module(), graph)
    gm.meta.update({k: _read(v, []) for k, v in gm_meta.items()})
    return gm


def settings() -> dict:
    """kiln's settings now (a compiled function's own overlay included), as the planner
    applies them."""
    return {k: v for k, v in vars(config).items()
            if not k.startswith("_") and isinstance(v, (bool, int, float, str, type(None)))}


def torch_state() -> dict:
    """The global torch settings a plan depends on, which the planner sets as they are
    here: whether fp32 products run on tensor cores (``pad_mm`` pads them only then)."""
    from . import pad_mm
    return {"fp32_tensor_cores": pad_mm._fp32_on_tensor_cores()}


def _frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("<Q", len(data)) + data


def _exactly(stream, n: int) -> bytes | None:
    """``n`` bytes from ``stream`` (a pipe's raw reads may return fewer), None at its end."""
    chunks, left = [], n
    while left:
        b = stream.read(left)
        if not b:
            return None
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def read_frame(stream):
    """One message ``_frame`` wrote, or None at the stream's end."""
    head = _exactly(stream, 8)
    if head is None:
        return None
    (n,) = struct.unpack("<Q", head)
    return _exactly(stream, n)


# --- the calling side -------------------------------------------------------------------
class Job:
    """One plan asked of the planner; ``on_done(plan or None)`` is called once it is
    back (on the reader thread), or failed."""

    def __init__(self, on_done):
        self.on_done = on_done


class _Planner:
    def __init__(self, command=None):
        self.command = command or [sys.executable, "-m", "kiln.kernels.plan_worker"]
        self.proc = None
        self.broken = False
        self.jobs: dict = {}
        self.lock = threading.Lock()
        self.ids = itertools.count()

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["KILN_LOGS"] = ""
        self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, bufsize=0)
        self.outbox = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(self.proc,), daemon=True,
                         name="kiln-plan-reader").start()
        threading.Thread(target=self._write, args=(self.proc, self.outbox), daemon=True,
                         name="kiln-plan-writer").start()

    def start(self) -> None:
        """Start the planner now, if it is not running (its start-up, an import of torch
        and kiln, takes seconds: better spent while the stream's first size compiles)."""
        with self.lock:
            if self.proc is None and not self.broken:
                try:
                    self._start()
                except OSError as e:
                    self._broke(f"{type(e).__name__}: {e}")

    def submit(self, job: Job, message: dict) -> bool:
        """Queue one request; the writer thread sends it. (Written here, a graph larger
        than the pipe's buffer blocked the caller until the planner read it: through
        its start-up, and behind every plan before it.)"""
        with self.lock:
            if self.broken:
                return False
            try:
                if self.proc is None:
                    self._start()
            except OSError as e:
                self._broke(f"{type(e).__name__}: {e}")
                return False
            jid = next(self.ids)
            try:
                frame = _frame({"id": jid, **message})
            except Exception:           # noqa: BLE001  (this graph is planned here)
                return False
            self.jobs[jid] = job
            self.outbox.put(frame)
        return True

    def _write(self, proc, outbox) -> None:
        while True:
            frame = outbox.get()
            try:
                proc.stdin.write(frame)
                proc.stdin.flush()
            except (OSError, ValueError) as e:
                with self.lock:
                    if proc is self.proc:
                        self._broke(f"{type(e).__name__}: {e}")
                return

    def _read(self, proc) -> None:
        out = proc.stdout
        while True:
            try:
                data = read_frame(out)
            except (OSError, ValueError):
                data = None
            if data is None:
                break
            try:
                reply = pickle.loads(data)
            except Exception:           # noqa: BLE001  (the planner is not to be trusted)
                break
            with self.lock:
                job = self.jobs.get(reply["id"])
            if job is None:
                continue
            plan = None
            if "plan" in reply:
                try:
                    plan = pickle.loads(reply["plan"])
                except Exception as e:   # noqa: BLE001  (planned in the calling thread)
                    _log.info("kernels: a plan from the planner unreadable (%s: %s)",
                              type(e).__name__, e)
            else:
                _log.info("kernels: the planner could not plan a size (%s); planned at its "
                          "next call", reply.get("error"))
            job.on_done(plan)
            with self.lock:         # open until its answer was taken (``wait_idle``)
                self.jobs.pop(reply["id"], None)
        with self.lock:
            if proc is self.proc:
                self._broke(f"it exited ({proc.poll()})")

    def _broke(self, why: str) -> None:
        """(with ``lock``) No more plans from the planner: every open job is failed."""
        if not self.broken:
            _log.info("kernels: the planner process stopped (%s); sizes are planned in the "
                      "calling thread", why)
        self.broken = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        jobs, self.jobs = list(self.jobs.values()), {}
        for job in jobs:
            job.on_done(None)

    def wait_idle(self, timeout=None) -> bool:
        import time
        end = None if timeout is None else time.monotonic() + timeout
        had = bool(self.jobs)
        while self.jobs and (end is None or time.monotonic() < end):
            time.sleep(0.002)
        return had and not self.jobs


_planner = _Planner()


def available(gm, target: str, args) -> bool:
    """May this size be planned in the planner process? (``config.background_size_plans``;
    Triton's only for CUDA inputs, not the interpreter's; never while kiln's plan logs
    are on, which the planner would not write. A compiled function's own settings are
    in ``config`` while it runs, so ``settings()`` sends them.)"""
    if not config.background_size_plans or _planner.broken:
        return False
    if any(logs.enabled(a) for a in ("output_code", "fallbacks", "cache")):
        return False
    if target == "triton" and not any(isinstance(a, torch.Tensor) and a.device.type == "cuda"
                                      for a in args):
        return False
    return True


def start_for(target: str, args) -> None:
    """A symbolic graph's first size is being compiled: its later sizes will be asked
    of the planner, so start it now."""
    if available(None, target, args):
        _planner.start()


def submit(gm, args, target: str, on_done) -> Job | None:
    """Ask the planner for ``gm``'s plan at ``args``' layouts; None when it cannot be
    asked (the caller plans itself). ``on_done(plan or None)`` runs on a reader thread."""
    if not available(gm, target, args):
        return None
    try:
        graph = encode(gm)
    except Unencodable as e:
        _log.debug("kernels: a size planned here: its graph has %s", e)
        return None
    inputs = [TensorMeta(a) if isinstance(a, torch.Tensor) else a for a in args]
    if any(not isinstance(a, (TensorMeta,) + _PLAIN) for a in inputs):
        return None
    job = Job(on_done)
    if not _planner.submit(job, {"graph": graph, "inputs": inputs, "target": target,
                                 "settings": settings(), "torch": torch_state()}):
        return None
    return job


def wait(timeout=None) -> bool:
    """Wait until every plan asked is back; True if any was open and all came."""
    return _planner.wait_idle(timeout)
