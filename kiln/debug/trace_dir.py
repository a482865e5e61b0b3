"""The trace directory (``KILN_TRACE=DIR``, ``kiln.config.trace_dir``): what every compile
of the process produced, as files under DIR and one ``DIR/index.html`` (html_report.py).

It collects rather than computes: the artefacts are the records kiln already logs
(logs.py hands each one here while a trace is on — captured graph, guards, entry code,
aot graphs, loop IR and kernels, cache hits and misses, fallbacks, breaks, recompiles),
and stage times come from ``timing.timed``. ``eval_frame`` brackets each frame compile
with ``begin``/``end`` so that records land in the compile that produced them; work
done later for a compile (a backward compiled at the first ``backward()``) re-enters
it with ``within``.

Layout: ``DIR/index.html``, ``DIR/trace.json`` (the same, as data) and one folder per
compile, ``DIR/p<pid>/c0001_<frame>/`` (``graph.py``, ``guards.txt``, ``entry.py``,
``aot_forward.py``…, ``loop_ir.txt``, ``kernels.cpp``/``kernels.py``, ``log.txt``).
The report is rewritten after each compile (at most twice a second: the last change
lands half a second later at the latest) and at exit; ``flush()`` writes it now.
Nothing here keeps a user's object alive (frames are held by weak reference).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import re
import sys
import threading
import time
import weakref
import zlib
from dataclasses import dataclass, field

from kiln import config
from kiln.debug import logs, timing

_tls = threading.local()
_lock = threading.RLock()
_session: "Session | None" = None


@dataclass
class Frame:
    """A compiled function (user function, resume function or callee frame)."""

    id: int
    name: str
    file: str
    line: int
    ref: object                       # weakref to the CompiledFunction
    parent: "Compile | None" = None   # the compile whose code calls this frame
    compiles: list = field(default_factory=list)


@dataclass
class Compile:
    """One compile of one frame: an entry, or the decision to run it eagerly."""

    id: int
    frame: Frame
    index: int                        # 0 first compile, 1.. recompiles
    dir: str                          # relative to the trace root
    started: float
    seconds: float = 0.0
    outcome: str = "compiling"
    stages: dict = field(default_factory=dict)
    artefacts: list = field(default_factory=list)   # (title, relative path, text)
    breaks: list = field(default_factory=list)      # dicts: reason, stack, break_id
    recompile: dict | None = None                   # why this compile happened
    fallbacks: list = field(default_factory=list)
    cache: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    log: list = field(default_factory=list)
    graphs: int = 0


class Session:
    """All compiles of this process under one trace root."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.run = f"p{os.getpid()}"
        self.started = time.time()
        self.frames: dict[int, Frame] = {}
        self.compiles: list[Compile] = []
        self.pending: dict[int, dict] = {}   # frame id -> recompile explanation
        self.logs_written: dict[int, int] = {}   # compile id -> log records in its log.txt
        self.last_flush = 0.0
        self.timer = None                        # a pending trailing rewrite
        self.loose = Compile(0, Frame(0, "(outside any frame compile)", "", 0, None), 0,
                             os.path.join(self.run, "c0000_outside"), time.time(),
                             outcome="records not tied to a compile")
        os.makedirs(os.path.join(self.root, self.run), exist_ok=True)

    # --- frames and compiles -----------------------------------------------------
    def frame_of(self, cf) -> Frame:
        fr = self.frames.get(id(cf))
        if fr is None or fr.ref() is not cf:
            code = cf.code
            fr = Frame(len(self.frames) + 1, code.co_qualname if hasattr(code, "co_qualname")
                       else code.co_name, code.co_filename, code.co_firstlineno, weakref.ref(cf))
            self.frames[id(cf)] = fr
        return fr

    def new_compile(self, fr: Frame) -> Compile:
        n = len(self.compiles) + 1
        slug = _slug(fr.name)
        c = Compile(n, fr, len(fr.compiles), os.path.join(self.run, f"c{n:04d}_{slug}"),
                    time.perf_counter())
        fr.compiles.append(c)
        self.compiles.append(c)
        c.recompile = self.pending.pop(id(fr.ref()), None)
        if c.recompile:
            c.log.append(c.recompile.pop("log", ""))
        return c

    def write(self, c: Compile, name: str, text: str, title: str) -> None:
        """An artefact file of compile ``c`` (``name``, ``name_2``… if repeated). A file
        that cannot be written is a note in the report, never a failed compile."""
        try:
            self._write(c, name, text, title)
        except OSError as e:
            c.notes.append(f"trace: {name} not written ({e})")

    def _write(self, c: Compile, name: str, text: str, title: str) -> None:
        d = os.path.join(self.root, c.dir)
        os.makedirs(d, exist_ok=True)
        base, dot, ext = name.partition(".")
        base, ext = _slug(base), dot + ext
        taken = {os.path.basename(p) for _, p, _ in c.artefacts}
        k, fname = 1, base + ext
        while fname in taken:
            k += 1
            fname = f"{base}_{k}{ext}"
        rel = os.path.join(c.dir, fname)
        _atomic_write(os.path.join(self.root, rel), text)
        c.artefacts.append((title, rel, text))

    # --- the report ------------------------------------------------------------------
    def flush(self) -> None:
        from kiln.debug import html_report

        for c in self.compiles + [self.loose]:
            if c.log and self.logs_written.get(c.id) != len(c.log):
                d = os.path.join(self.root, c.dir)
                os.makedirs(d, exist_ok=True)
                _atomic_write(os.path.join(d, "log.txt"), "\n".join(c.log) + "\n")
                self.logs_written[c.id] = len(c.log)
        _atomic_write(os.path.join(self.root, "trace.json"), json.dumps(self.as_data(), indent=1))
        _atomic_write(os.path.join(self.root, "index.html"), html_report.render(self))

    def as_data(self) -> dict:
        def one(c: Compile) -> dict:
            return {"id": c.id, "frame": c.frame.name, "file": c.frame.file,
                    "line": c.frame.line, "index": c.index,
                    "parent": c.frame.parent.id if c.frame.parent else None,
                    "outcome": c.outcome, "seconds": c.seconds, "stages": c.stages,
                    "graphs": c.graphs, "breaks": c.breaks,
                    "recompile": c.recompile and {k: v for k, v in c.recompile.items()},
                    "fallbacks": c.fallbacks, "cache": c.cache,
                    "artefacts": [{"title": t, "path": p} for t, p, _ in c.artefacts]}

        return {"root": self.root, "pid": os.getpid(), "compiles": [one(c) for c in self.compiles],
                "outside": one(self.loose)}


# --- hooks called by the compiler ----------------------------------------------------
def _safe(hook):
    """The trace never breaks a compile: a failure of its own is one warning, then the
    hook does nothing more for that call."""
    @functools.wraps(hook)
    def run(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            if not _warned:
                _warned.append(e)
                logging.getLogger("kiln").warning("kiln: the trace directory failed (%s: %s); "
                                                  "its report may be incomplete",
                                                  type(e).__name__, e)
            return None
    return run


_warned: list = []


def sync() -> Session | None:
    """The session for ``config.trace_dir`` (started, replaced or ended as it changed)."""
    global _session
    root = config.trace_dir or ""
    if _session is not None and _session.root == os.path.abspath(root) and root:
        return _session
    with _lock:
        if _session is not None:
            _write_report(_session)       # the last state of the one that ends
        if not root:
            if _session is not None:
                _session = None
                logs.set_sink(None)
                timing.observer = None
            return None
        try:
            _session = Session(root)
        except OSError as e:
            logging.getLogger("kiln").warning("kiln: trace directory %r unusable (%s); no trace",
                                              root, e)
            config.trace_dir = ""
            return None
        logs.set_sink(_on_record)
        timing.observer = _on_stage
        return _session


@_safe
def begin(cf) -> Compile | None:
    """A frame compile starts (``cf``: the CompiledFunction); None when no trace is on."""
    s = sync()
    if s is None:
        return None
    with _lock:
        c = s.new_compile(s.frame_of(cf))
    _stack().append(c)
    return c


@_safe
def end(c: Compile | None) -> None:
    """The compile ``c`` ended (returned or raised: ``sys.exc_info`` tells)."""
    if c is None:
        return
    st = _stack()
    if st and st[-1] is c:
        st.pop()
    c.seconds = time.perf_counter() - c.started
    ex = sys.exc_info()[1]
    if ex is not None and c.outcome == "compiling":
        c.outcome = f"raised {type(ex).__name__}: {_first_line(ex)}"
    elif c.outcome == "compiling":
        c.outcome = "compiled" + (" (graph break)" if c.breaks else "")
    if not st:
        _flush()


@_safe
def note_callee(cf) -> None:
    """``cf`` (a resume function or callee frame) is called by the compile in progress."""
    s, cur = _session, current()
    if s is None or cur is None:
        return
    with _lock:
        fr = s.frame_of(cf)
        if fr.parent is None:
            fr.parent = cur
            if cf.code.co_name.startswith("__resume"):    # generated: its bytecode, listed
                s.write(cur, f"{fr.name}.dis.txt", _listing(cf.code),
                        f"resume function {fr.name} (rewritten bytecode)")


def current() -> Compile | None:
    st = getattr(_tls, "stack", None)
    return st[-1] if st else None


@contextlib.contextmanager
def within(c: Compile | None):
    """Work done later on behalf of compile ``c`` (a lazily compiled backward)."""
    if c is None or _session is None:
        yield
        return
    late = c.outcome != "compiling"       # after the frame compile: its time adds up
    t0 = time.perf_counter()
    _stack().append(c)
    try:
        yield
    finally:
        if late:
            c.seconds += time.perf_counter() - t0
        st = _stack()
        if st and st[-1] is c:
            st.pop()
        if not st:
            _flush()


def _stack() -> list:
    st = getattr(_tls, "stack", None)
    if st is None:
        st = _tls.stack = []
    return st


def flush() -> None:
    """Write the report now (it is otherwise rewritten at most every
    ``_MIN_INTERVAL`` seconds, the last change at the latest that long after it, and at
    exit)."""
    if _session is not None:
        _write_report(_session)


_MIN_INTERVAL = 0.5


def _flush() -> None:
    """After a compile: rewrite the report, or have it rewritten shortly if it just was
    (rewriting a large report after each of many quick compiles would cost more than
    the compiles)."""
    s = _session
    if s is None:
        return
    with _lock:
        if time.monotonic() - s.last_flush >= _MIN_INTERVAL:
            _write_report(s)
        elif s.timer is None:
            s.timer = threading.Timer(_MIN_INTERVAL, _write_report, args=(s,))
            s.timer.daemon = True
            s.timer.start()


def _write_report(s: Session) -> None:
    with _lock:
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        try:
            s.flush()
        except Exception as e:  # noqa: BLE001  (never a failed compile)
            logging.getLogger("kiln").warning("kiln: could not write the trace report (%s)", e)
        s.last_flush = time.monotonic()


@atexit.register
def _at_exit() -> None:
    if _session is not None:
        _write_report(_session)


# --- records to artefacts -------------------------------------------------------------
@_safe
def _on_stage(stage: str, seconds: float) -> None:
    c = current()
    if c is not None:
        with _lock:
            c.stages[stage] = c.stages.get(stage, 0.0) + seconds


def _on_record(record: logging.LogRecord) -> None:
    s = _session
    if s is None:
        return
    c = current() or s.loose
    name = record.name[len("kiln."):] if record.name.startswith("kiln.") else "kiln"
    msg = record.getMessage()
    with _lock:
        if not (name == "recompiles" and hasattr(record, "kiln_recompile")):
            c.log.append(f"[{name}] {msg}")     # (a recompile goes to the compile it starts)
        rule = _RULES.get(name)
        if rule is not None:
            rule(s, c, record, msg)
        elif record.levelno >= logging.WARNING:
            c.notes.append(msg)


def _graph(s, c, record, msg):
    c.graphs += 1
    text = record.args[0] if len(record.args or ()) == 1 else msg
    s.write(c, "graph.py", str(text) + _node_lines(record), "captured graph (torch level)")


def _guards(s, c, record, msg):
    text = record.args[-1] if record.args else msg
    s.write(c, "guards.txt", str(text), "guards")


def _bytecode(s, c, record, msg):
    text = record.args[-1] if record.args else msg
    s.write(c, "entry.py", str(text), "entry code (guards, graph call, resume)")


def _aot(s, c, record, msg):
    args = record.args or ()
    if len(args) == 2:
        title, text = str(args[0]), str(args[1])
    else:
        title, text = "aot graph", msg
    slug = "aot_" + re.sub(r"[^a-z0-9]+", "_", title.lower().replace(" graph", "")).strip("_")
    s.write(c, slug + ".py", text + _node_lines(record), f"aten {title}")


def _kernels(s, c, record, msg):
    args = record.args or ()
    if len(args) == 3:
        target, ir_text, source = (str(a) for a in args)
        s.write(c, "loop_ir.txt", ir_text, "loop IR")
        ext, what = (".cpp", "C++ kernels") if target == "cpp" else (".py", "Triton kernels")
        cached = " (from the graph cache)" if "(cached)" in record.msg else ""
        s.write(c, "kernels" + ext, source, what + cached)   # with user lines (provenance)
    else:
        s.write(c, "kernels.txt", msg, "kernels")


def _node_lines(record) -> str:
    """Comments naming the user line of each node of the record's graph (FX prints its
    own ``stack_trace``, which kiln leaves unset), grouped by line."""
    gm = getattr(record, "kiln_gm", None)
    if gm is None:
        return ""
    import linecache

    by_line: dict = {}
    for n in gm.graph.nodes:
        where = n.meta.get("kiln_user_line")
        if where is not None:
            by_line.setdefault(where, []).append(n.name)
    if not by_line:
        return ""
    out = ["", "# user lines of the nodes:"]
    for (file, line, fn), names in by_line.items():
        text = linecache.getline(file, line or 0).strip()
        out.append(f"#   {', '.join(names)}: {file}:{line} in {fn}: {text}")
    return "\n".join(out) + "\n"


def _breaks(s, c, record, msg):
    info = (record.args or (None, None))[-1]
    if hasattr(info, "reason") and hasattr(info, "user_stack"):
        c.breaks.append({"reason": str(info.reason), "stack": [str(x) for x in info.user_stack],
                         "break_id": getattr(info, "break_id", None)})
    else:   # the frame runs eagerly (a skip), said in words
        bid = getattr(info, "break_id", None)
        c.outcome = "runs eagerly: " + (f"[{bid}] " if bid else "") + str(
            info if info is not None else msg)
        c.fallbacks.append(msg)


def _recompiles(s, c, record, msg):
    """A recompile's explanation goes to the compile it starts (``begin`` picks it up);
    hitting the recompile limit is a fallback of the frame's last compile."""
    data = getattr(record, "kiln_recompile", None)
    if data is None:
        c.notes.append(msg)
        return
    if data["limit"]:
        fr = s.frame_of(data["frame"])
        last = fr.compiles[-1] if fr.compiles else c
        last.fallbacks.append(msg.splitlines()[0])
        last.notes.append(msg)
    else:
        s.pending[id(data["frame"])] = {"where": data["where"], "entries": data["entries"],
                                        "log": f"[recompiles] {msg}"}


def _fallback(s, c, record, msg):
    c.fallbacks.append(msg)


def _cache(s, c, record, msg):
    c.cache.append(msg)


def _kiln(s, c, record, msg):
    if record.levelno >= logging.WARNING:
        if "failed to compile" in msg:
            c.outcome = "failed, runs eagerly: " + msg
        c.fallbacks.append(msg)


def _note(s, c, record, msg):
    c.notes.append(msg)


_RULES = {
    "graph": _graph,
    "guards": _guards,
    "bytecode": _bytecode,
    "aot_graphs": _aot,
    "output_code": _kernels,
    "graph_breaks": _breaks,
    "recompiles": _recompiles,
    "fallbacks": _fallback,
    "cache": _cache,
    "kiln": _kiln,
    "perf_hints": _note,
    "passes": _note,
    "perf": _note,
}


def _listing(code) -> str:
    import dis

    head = (f"# {code.co_name}({', '.join(code.co_varnames[:code.co_argcount])}), "
            f"lines of {code.co_filename}\n")
    try:
        return head + dis.Bytecode(code).dis()
    except Exception as e:  # noqa: BLE001  (a listing is a nicety)
        return head + f"(no listing: {type(e).__name__}: {e})"


def _slug(name: str) -> str:
    """A short file-name-safe form (resume functions' names grow with each break)."""
    s = re.sub(r"[^A-Za-z0-9_]+", "_", name)
    return s if len(s) <= 48 else f"{s[:40]}_{zlib.crc32(s.encode()):08x}"


def _first_line(ex) -> str:
    text = str(ex)
    return text.splitlines()[0] if text else ""


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
