"""The capture cache: a traced entry (guards, entry code, torch-level graph) kept on disk,
so that a later process rebuilds it without tracing.

A warm process finds its kernels and graph plans on disk, yet capture (interpreting the
bytecode of every module's forward) was redone: most of a warm first call. This cache
keeps what a trace produced. A later process, at a compiled function's first miss,
rebuilds each stored entry, runs its guards on the call, and on a pass hands the graph
to the backend at the entry's first call, as capture would have (the backend then finds
its own caches).

**Soundness.** An entry is only as good as its guards, and the guards were written for
the traced process: an object compared by identity there (a function, a class, a
module's dict) means nothing in another process. So each object an entry names is
stored as a way to find it again, and found again at load:

- a module, or a module's globals dict: by the module's name (a module not loaded is a miss);
- a function, class or builtin: by module and qualified name, checked at store time to
  name that very object; else by the guard expression that read it, when that
  expression reads only module dicts (``__g3['CONFIG'].mapping``);
- a Python function found again must be the same function: its bytecode and constants,
  defaults and closure cells are fingerprinted, so an edited or monkeypatched function
  is a miss;
- numbers, strings, tuples, dtypes, devices and enum members by value;

anything else (a tensor, an object only the frame reaches) leaves the entry uncached.
The key holds the root function's code, kiln's sources, the torch and Python versions,
the backend's registered name and every kiln setting; the record also lists each
source file whose code the trace ran, with its size and modification time (an edited
file is a miss), as Python's own bytecode cache checks. Entries are sealed files
(``kiln.disk_cache``): one that fails its checks or does not load is a miss.

Not cached: entries with graph breaks (resume functions) or callees compiled as their
own frames, symbolic sizes, a backend that is not a registered name, compiles under
``kiln.explain``/``KILN_TRACE``; ``KILN_CAPTURE_CACHE=0`` switches it off.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
import types
from dataclasses import dataclass, field

import torch

from kiln import config, disk_cache
from kiln import ref_pickle as R
from kiln.ref_pickle import Uncacheable
from kiln.debug.logs import log_for

_log = log_for("cache")
KIND = "capture"
#: Bumped when the record's layout changes.
FORMAT = 1
#: Entries kept per key (guards for other shapes, dtypes, modes...), newest last.
MAX_RECORDS = 8
stats = {"hits": 0, "stored": 0, "uncacheable": 0}

_KILN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class GraphInfo:
    """The entry's graph as capture handed it to the backend."""
    name: str                       # its name in the entry's namespace
    gm: object                      # torch-level fx.GraphModule
    where: list                     # the user's lines (backend errors name them)
    wrappers: tuple = ()            # ("grad", mode) / ("amp", None), innermost first


@dataclass
class Rebuild:
    """What ``tracer._finish`` leaves on an entry for this cache."""
    lines: list                     # the entry body (after the guards)
    fname: str                      # the entry function's name
    guards: object                  # the GuardSet
    names: frozenset                # namespace names before the native guard codes
    graph: GraphInfo | None
    codes: set = field(default_factory=set)   # code objects the trace ran
    cacheable: bool = True          # False: a symbolic graph, a stream size, ...


# --- switches and key --------------------------------------------------------------------
def enabled(cf) -> bool:
    """On, and nothing wants to watch the trace itself (``kiln.explain``, KILN_TRACE)."""
    return bool(config.capture_cache) and cf.recorder is None and not config.trace_dir


def backend_name(backend) -> str | None:
    """The registered name of ``backend`` (only those are cached: a user's callable may
    depend on anything)."""
    from kiln import backends
    for name, entry in backends._registry.items():
        if entry is backend:
            return name
        if isinstance(entry, str) and callable(backend) and \
                f"{getattr(backend, '__module__', '')}.{getattr(backend, '__qualname__', '')}" == entry:
            return name
    return None


def key_of(cf) -> str | None:
    name = backend_name(cf.backend)
    if name is None:
        return None
    code = cf.code
    return disk_cache.key_of(str(FORMAT), disk_cache.sources_hash(), torch.__version__,
                             sys.version, name, code.co_filename,
                             getattr(code, "co_qualname", code.co_name), R.code_digest(code),
                             config.settings_key())


# --- storing -----------------------------------------------------------------------------
class _EntrySaver(R.Saver):
    """References of an entry: the root function, its globals and closure, and objects
    its guards compare by identity that only a guard expression names."""

    def __init__(self, f, cf=None, ns=None, lhs_of=None, **kw):
        super().__init__(f, **kw)
        self.cf = cf
        self.ns = ns or {}
        self.lhs_of = lhs_of or {}
        self._name_of = {id(v): k for k, v in self.ns.items()}
        self._restricted = None

    def special(self, obj):
        fn = self.cf.fn
        if obj is fn:
            return self.ref(obj, ("root_fn",))
        if obj is fn.__globals__:
            return self.ref(obj, ("root_globals",))
        if type(obj) is tuple and obj and obj is fn.__closure__:
            return self.ref(obj, ("root_closure",))
        return None

    def identity_matters(self, obj) -> bool:
        return id(obj) in self._name_of       # a namespace value the guards compare by identity

    def fallback(self, obj, fp=None):
        """An object the guards read from module dicts: found again by that expression."""
        name = self._name_of.get(id(obj))
        expr = self.lhs_of.get(name) if name is not None else None
        if expr is None and name is not None:
            expr = self._module_global(obj)
        if expr is None:
            what = getattr(obj, "__qualname__", None) or type(obj).__qualname__
            raise Uncacheable(f"{name or 'an object'} ({what}) has no name to find it by")
        try:
            if self._restricted is None:
                self._restricted = _Restricted(self.ns)
            found = eval(expr, {"__builtins__": {}}, self._restricted)   # noqa: S307
        except Exception as e:  # noqa: BLE001
            raise Uncacheable(f"{expr} does not read from module dicts only ({type(e).__name__})") from None
        if found is not obj:
            raise Uncacheable(f"{expr} reads another object now")
        return self.ref(obj, ("lhs", expr, fp))

    def _module_global(self, obj):
        """``__gN['NAME']``: ``obj`` is a global of a module whose dict the entry holds
        (a registry the guards check by size)."""
        for k, d in self.ns.items():
            if type(d) is dict and R.module_dict_name(d) is not None:
                for gname, v in d.items():
                    if v is obj and isinstance(gname, str):
                        return f"{k}[{gname!r}]"
        return None


class _Restricted(dict):
    """The namespace a guard expression is re-read in: what is found by name only
    (module dicts, modules, classes and functions with a module-level name)."""

    def __init__(self, ns):
        super().__init__()
        for k, v in ns.items():
            if (type(v) is dict and R.module_dict_name(v) is not None) or type(v) is types.ModuleType \
                    or (isinstance(v, (type, types.FunctionType)) and R.by_name(v) is not None):
                self[k] = v


def _lhs_of(guards) -> dict:
    """const name -> the expression its identity guard compares it with."""
    out = {}
    for g in guards.guards:
        if g.lhs is None:
            continue
        for op in (" is ", " == "):
            head = f"{g.lhs}{op}"
            if g.code.startswith(head):
                name = g.code[len(head):]
                if name.isidentifier():
                    out.setdefault(name, g.lhs)
    return out


def _file_stamps(codes) -> list:
    stamps = {}
    for code in codes:
        path = code.co_filename
        if path in stamps or os.path.abspath(path).startswith(_KILN_ROOT + os.sep) \
                or path.startswith("<frozen "):
            continue          # kiln's own files, Python's frozen modules: in the key
        try:
            st = os.stat(path)
        except OSError:
            raise Uncacheable(f"the trace ran code from {path}, which is not a file") from None
        stamps[path] = (st.st_mtime_ns, st.st_size)
    return sorted((p, m, s) for p, (m, s) in stamps.items())


def record_of(cf, entry, frame_type) -> bytes:
    """The entry as a record's bytes; Uncacheable says why not (``frame_type``: the
    compiled-function class, whose instances are callees made in this process)."""
    rb = getattr(entry, "rebuild", None)
    if rb is None or not rb.cacheable:
        raise Uncacheable("not a traced entry of one graph with static sizes")
    if entry.breaks:
        raise Uncacheable("a graph break")
    ns = {k: entry.namespace[k] for k in rb.names if k in entry.namespace}
    if rb.graph is not None:
        ns.pop(rb.graph.name, None)
    for k, v in ns.items():
        if isinstance(v, frame_type):
            raise Uncacheable("a callee compiled as its own frame")
    if rb.graph is not None and not rb.lines[0].startswith(f"__o = {rb.graph.name}("):
        raise Uncacheable("the graph call is not the entry's first step")
    g = rb.guards
    body = {"lines": rb.lines, "fname": rb.fname, "ns": ns,
            "guards": (g.guards, g.tensor_specs, g.programs),
            "tensor_inputs": entry.tensor_inputs,
            "graph": None if rb.graph is None else
            {"name": rb.graph.name, "where": rb.graph.where, "wrappers": rb.graph.wrappers}}
    f = io.BytesIO()
    saver = _EntrySaver(f, cf, ns, _lhs_of(g))
    try:
        saver.dump(body)
        graph_bytes = b""
        if rb.graph is not None:
            gm = rb.graph.gm
            gf = io.BytesIO()
            _EntrySaver(gf, cf, allow_tensors=True).share(saver).dump(
                {**R.graph_record(gm.graph, gm, meta_keys=("kiln_user_line", "stack_trace")),
                 "meta": dict(gm.meta)})
            graph_bytes = gf.getvalue()
    except Uncacheable:
        raise
    except Exception as e:  # noqa: BLE001 -- anything pickle refuses
        raise Uncacheable(f"{type(e).__name__}: {e}") from None
    ns_index = {k: saver.ref_ids[id(v)] for k, v in ns.items() if id(v) in saver.ref_ids}
    return pickle.dumps({"refs": saver.refs, "ns_index": ns_index, "body": f.getvalue(),
                         "graph": graph_bytes, "files": _file_stamps(rb.codes)},
                        protocol=pickle.HIGHEST_PROTOCOL)


def store(cf, entry, frame_type) -> None:
    """Add ``entry`` of the compiled function ``cf`` to the records of its key (a failure
    to store is only logged); ``frame_type``: eval_frame's CompiledFunction."""
    where = f"{cf.code.co_name} ({cf.code.co_filename}:{cf.code.co_firstlineno})"
    try:
        key = key_of(cf)
        if key is None:
            return
        rec = record_of(cf, entry, frame_type)
    except Uncacheable as e:
        stats["uncacheable"] += 1
        _log.info("capture cache: not storing %s: %s", where, e)
        return
    except Exception as e:  # noqa: BLE001 -- storing never fails the user's call
        stats["uncacheable"] += 1
        _log.warning("kiln: capture cache: cannot store %s: %s: %s", where, type(e).__name__, e)
        return
    records = [r for r in _read(key) if r != rec][-(MAX_RECORDS - 1):] + [rec]
    try:
        disk_cache.write_entry(KIND, key, ".pkl", pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError as e:
        _log.info("capture cache: cannot store %s: %s", where, e)
        return
    stats["stored"] += 1
    _log.info("capture cache: stored %s (%d record(s))", where, len(records))


def _read(key) -> list:
    got = disk_cache.read_entry(KIND, key, ".pkl")
    if got is None:
        return []
    path, payload = got
    try:
        records = pickle.loads(payload)
        if not isinstance(records, list) or not all(isinstance(r, bytes) for r in records):
            raise ValueError("not a list of records")
        return records
    except Exception as e:  # noqa: BLE001 -- a bad file is a miss
        disk_cache.reject(path, f"does not load: {type(e).__name__}: {e}")
        return []


# --- loading -----------------------------------------------------------------------------
def _resolve_refs(cf, refs, ns_index) -> list:
    """``ref_pickle.resolve_refs`` with the entry's own kinds: the root function's parts,
    then the guard expressions, read over what was found by name."""
    fn = cf.fn
    roots = {"root_fn": fn, "root_globals": fn.__globals__, "root_closure": fn.__closure__}
    pending = []

    def special(i, spec):
        if spec[0] in roots:
            return roots[spec[0]]
        if spec[0] == "lhs":
            pending.append(i)
            return None
        return NotImplemented

    out = R.resolve_refs(refs, special)
    env = {name: out[i] for name, i in ns_index.items() if i not in pending}
    for i in pending:
        expr, fp = refs[i][1], refs[i][2]
        try:
            obj = eval(expr, {"__builtins__": {}}, env)   # noqa: S307
        except Exception as e:  # noqa: BLE001
            raise R.Stale(f"{expr}: {type(e).__name__}") from None
        R.check_fingerprint(obj, fp)
        out[i] = obj
    return out


def _changed_file(files) -> str | None:
    """The first source file the trace ran that is not as it was then, or None."""
    for path, mtime, size in files:
        try:
            st = os.stat(path)
        except OSError:
            return path
        if st.st_mtime_ns != mtime or st.st_size != size:
            return path
    return None


class LoadFailed(Exception):
    """A stored entry's graph did not compile: nothing of the entry ran (its graph call
    is its first step), so the call is traced instead."""


class LoadedGraph:
    """A cached entry's graph: handed to the backend at its first call with that call's
    inputs (capture hands it the traced call's), then checked as capture's are
    (``FirstRun``), and put in the entry's namespace in its place."""

    def __init__(self, backend, graph_record, where, wrappers, namespace, name):
        self.backend, self.where, self.wrappers = backend, where, wrappers
        self.graph_record = graph_record        # rebuilt at the first call (_graph_from)
        self.namespace, self.name = namespace, name

    def __call__(self, *args):
        import torch.fx as fx

        from kiln import gc_pause
        from kiln.capture import marks
        from kiln.capture.autocast_state import graph_without_autocast
        from kiln.capture.backend_call import FirstRun, compile_graph
        from kiln.capture.codegen import restoring_grad_mode
        from kiln.debug.timing import timed

        state = marks.state
        state.depth = getattr(state, "depth", 0) + 1      # compiling, as under capture
        try:
            with timed("capture cache: backend"), gc_pause.paused():
                rec = self.graph_record
                gm = fx.GraphModule(R.module_with(rec["attrs"]), R.graph_from(rec))
                gm.meta = dict(rec["meta"])
                compiled = compile_graph(self.backend, gm, list(args), self.where)
        except Exception as e:  # noqa: BLE001 -- the caller traces instead
            raise LoadFailed(f"{type(e).__name__}: {e}") from e
        finally:
            state.depth -= 1
        eager = gm.forward
        checked = not (getattr(compiled, "__self__", None) is gm
                       and getattr(compiled, "__name__", None) == "forward")
        for kind, arg in self.wrappers:
            if kind == "grad":
                compiled, eager = restoring_grad_mode(compiled, arg), restoring_grad_mode(eager, arg)
            else:
                compiled, eager = graph_without_autocast(compiled), graph_without_autocast(eager)
        if not checked:
            self.namespace[self.name] = compiled
            return compiled(*args)
        first = FirstRun(compiled, eager, self.backend, self.where, self.namespace, self.name)
        self.namespace[self.name] = first
        return first(*args)


def _entry_from(cf, rec: dict, entry_type):
    from kiln.capture import native_guards
    from kiln.capture.codegen import build_entry, param_names
    from kiln.capture.guards import GuardSet

    changed = _changed_file(rec["files"])
    if changed is not None:
        raise R.Stale(f"{changed}, whose code the trace ran, changed")
    objs = _resolve_refs(cf, rec["refs"], rec["ns_index"])
    body = R.load(rec["body"], objs)
    ns = dict(body["ns"])
    guards = GuardSet()
    guards.guards, guards.tensor_specs, guards.programs = body["guards"]
    guards._seen = {g.code for g in guards.guards}
    info = body["graph"]
    if info is not None:
        graph = R.load(rec["graph"], objs)
        ns[info["name"]] = LoadedGraph(cf.backend, graph, info["where"], info["wrappers"], ns,
                                       info["name"])
    codes, waiting = native_guards.guard_codes(guards, ns, param_names(cf.code))
    entry_fn, text = build_entry(cf.code, codes, body["lines"], ns, body["fname"])
    native_guards.watch(entry_fn, waiting)
    entry_fn.__defaults__, entry_fn.__kwdefaults__ = cf.fn.__defaults__, cf.fn.__kwdefaults__
    entry = entry_type(entry_fn, list(guards.guards), ns, text, [], [])
    entry.tensor_inputs = body["tensor_inputs"]
    return entry


def load(cf, entry_type) -> list:
    """The stored entries of ``cf`` that apply in this process, rebuilt as ``entry_type``
    (``tracer.Entry``), not yet run."""
    try:
        key = key_of(cf)
    except Exception as e:  # noqa: BLE001 -- a key that cannot be made: nothing stored
        _log.info("capture cache: no key for %s: %s: %s", cf.code.co_name, type(e).__name__, e)
        return []
    if key is None:
        return []
    entries = []
    for raw in _read(key):
        try:
            rec = pickle.loads(raw)
            entries.append(_entry_from(cf, rec, entry_type))
        except R.Stale as e:
            _log.info("capture cache: a record of %s does not apply: %s", cf.code.co_name, e)
        except Exception as e:  # noqa: BLE001 -- a record that does not load is a miss
            _log.info("capture cache: a record of %s does not load: %s: %s", cf.code.co_name,
                      type(e).__name__, e)
    return entries
