"""The compiled callable: on every call, try each cached entry (guards first); on a miss,
trace the frame and add an entry; past ``recompile_limit`` run eagerly and say why.

Without a frame-evaluation hook (kiln is pure Python), kiln compiles the functions it is
given and everything reachable from their generated code: resume functions after graph
breaks, and callees that had to become their own frames.
"""
from __future__ import annotations

import functools
import inspect
import linecache
import logging
import time
import types
import weakref

from kiln import config
from kiln.capture.codegen import MISS
from kiln.capture.errors import BackendCompilerFailed, InternalError, SkipFrame, Unsupported
from kiln import gc_pause
from kiln.capture import autocast_state, capture_cache, global_state, guard_failures, marks
from kiln.capture.guards import Guard, first_failure
from kiln.capture.tracer import Entry, TraceContext, trace_frame
from kiln.shapes.env import SpecializedMarkedDim
from kiln.shapes.policy import DynamicPolicy
from kiln.debug import trace_dir
from kiln.debug.breaks import describe, tag
from kiln.debug import progress
from kiln.debug.logs import log_for
from kiln.debug.timing import timed

_state = marks.state      # per-thread compile depth, shared with kiln.disable and is_compiling
_all_compiled = weakref.WeakSet()  # for kiln.reset(); never keeps one alive


is_compiling = marks.is_compiling


class Recorder:
    """Collects what compilation produced, for ``kiln.explain``."""

    def __init__(self):
        self.graphs = []
        self.breaks = []
        self.guards = []
        self.compile_time = 0.0
        self.skips = []
        #: (function name, break ID, reason) of each frame run eagerly
        self.skip_infos = []
        #: (function "name (file:line)", the first guard that failed) per recompile
        self.recompiles = []

    def skip(self, name, reason, break_id=None):
        self.skips.append(f"{name}: {tag(break_id, reason)}")
        self.skip_infos.append((name, break_id, reason))


class CompiledFunction:
    """``fn`` with a guarded cache of compiled entries."""

    def __init__(self, fn, backend, fullgraph=False, recorder=None, frozen=False):
        self.fn = fn
        self.code = fn.__code__
        self.backend = backend
        self.fullgraph = fullgraph
        self.recorder = recorder
        self.frozen = frozen  # kiln.run: never compile
        self.entries: list = []
        self.skip = None  # reason the frame runs eagerly
        self._callees: dict = {}
        self.policy = DynamicPolicy()   # which argument sizes trace symbolic (kiln/shapes)
        self._defaults = fn.__defaults__
        self._kwdefaults = fn.__kwdefaults__
        #: entries of the capture cache not yet met (None: not read yet)
        self._stored = None
        functools.update_wrapper(self, fn)
        _all_compiled.add(self)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __call__(self, *args, **kwargs):
        fn = self.fn
        if fn.__defaults__ is not self._defaults or fn.__kwdefaults__ is not self._kwdefaults \
                or fn.__code__ is not self.code:
            self._function_changed()
        # newest first, as torch.compile's cache: once a size became dynamic, the
        # symbolic entry serves the size the first, static, entry was made for too
        for e in reversed(self.entries):
            r = e.fn(*args, **kwargs)
            if r is not MISS:
                return r
        return self._miss(args, kwargs)

    # --- the slow path ---------------------------------------------------------------
    def _miss(self, args, kwargs):
        if self.skip is not None or self.frozen or getattr(_state, "disabled", 0):
            return self.fn(*args, **kwargs)
        if len(self.entries) >= config.recompile_limit:
            self._log_recompile(args, kwargs, limit=True)
            why = f"recompile_limit ({config.recompile_limit}) reached"
            self.skip = tag("K0053", why)
            if self.recorder is not None:
                self.recorder.skip(self.code.co_name, why, "K0053")
            return self.fn(*args, **kwargs)
        bound = self._bind(args, kwargs)
        if self.entries:
            self._log_recompile(args, kwargs, now_dynamic=self.policy.observe(
                bound or {}, self.entries[0].namespace))
        if bound is None:
            return self.fn(*args, **kwargs)  # let Python raise the TypeError
        state = global_state.snapshot()
        why = global_state.eager_reason(state)
        if why is not None:
            return self._run_eagerly_under(state, why, args, kwargs)
        r = self._from_capture_cache(args, kwargs, bound)
        if r is not MISS:
            return r
        _state.depth = getattr(_state, "depth", 0) + 1
        t0 = time.perf_counter()
        traced = trace_dir.begin(self)      # None unless KILN_TRACE is on
        prepare = getattr(self.backend, "prepare", None)
        try:
            if prepare is not None:  # a backend's one-time set-up, overlapping the capture
                prepare(list(args) + list(kwargs.values()))
            with progress.compiling(self.code.co_name), timed("capture (incl. backend)"), \
                    autocast_state.tracing(), gc_pause.paused():
                entry = trace_frame(self.fn, self.code, bound, self._ctx())
        except SkipFrame as s:
            if self.fullgraph:
                _record_for_replay(self, args, kwargs, s)
                raise Unsupported(s.reason, _where(self.code), break_id=s.break_id) from None
            self.skip = str(s)
            log_for("graph_breaks").info("running %s eagerly: %s", self.code.co_name, s)
            if self.recorder is not None:
                self.recorder.skip(self.code.co_name, s.reason, s.break_id)
            return self.fn(*args, **kwargs)
        except (Unsupported, SpecializedMarkedDim) as ex:
            _record_for_replay(self, args, kwargs, ex)
            raise
        except Exception as ex:
            err = _as_kiln_error(ex, self.code)
            _record_for_replay(self, args, kwargs, ex)
            if config.suppress_errors:
                return self._run_eagerly_after(err, args, kwargs)
            if err is ex:
                raise
            raise err from ex
        finally:
            _state.depth -= 1
            trace_dir.end(traced)
        if self.recorder is not None:
            self.recorder.guards.extend(entry.guards)
        log_for("compile_times").info("compiled %s in %.3fs", self.code.co_name, time.perf_counter() - t0)
        self.entries.append(entry)
        self.policy.record(entry, bound)
        r = entry.fn(*args, **kwargs)
        if r is not MISS and capture_cache.enabled(self):
            with gc_pause.paused():
                capture_cache.store(self, entry, CompiledFunction)
        entry.rebuild = None    # only storing reads it: the GuardSet and code objects go
        if r is MISS:  # a guard that cannot hold right after tracing: a kiln bug
            self.entries.remove(entry)
            reason = first_failure(entry.guards, entry.namespace, bound)
            ex = InternalError(f"kiln: fresh guards fail on the traced inputs: {reason}")
            ex._kiln_stack = _where(self.code)
            if config.suppress_errors:
                return self._run_eagerly_after(ex, args, kwargs)
            raise ex
        return r

    def _from_capture_cache(self, args, kwargs, bound):
        """A stored entry (``capture_cache``) whose guards pass on this call: it joins the
        entries and runs, as a traced one would; MISS when none does."""
        if self._stored is None:
            self._stored = []
            if capture_cache.enabled(self):
                with timed("capture cache"), gc_pause.paused():
                    self._stored = capture_cache.load(self, Entry)
        for entry in list(self._stored):
            try:
                r = entry.fn(*args, **kwargs)
            except capture_cache.LoadFailed as e:
                self._stored.remove(entry)
                log_for("cache").info("capture cache: %s: a stored entry's graph does not compile "
                                      "(%s); tracing", self.code.co_name, e)
                continue
            if r is not MISS:
                self._stored.remove(entry)
                self.entries.append(entry)
                self.policy.record(entry, bound)
                capture_cache.stats["hits"] += 1
                log_for("cache").info("capture cache: %s (%s:%d) rebuilt from disk", self.code.co_name,
                                      self.code.co_filename, self.code.co_firstlineno)
                return r
        return MISS

    def _run_eagerly_after(self, ex, args, kwargs):
        """kiln failed (its own error, not the program's): this function runs eagerly
        from now on, and says why."""
        why = f"{type(ex).__name__}: {ex}"
        bid = "K0055" if isinstance(ex, BackendCompilerFailed) else "K0054"
        logging.getLogger("kiln").warning("kiln failed to compile %s, running it eagerly: %s",
                                          self.code.co_name, describe(bid, why))
        if self.recorder is not None:
            self.recorder.skip(self.code.co_name, why, bid)
        self.skip = repr(ex)
        return self.fn(*args, **kwargs)

    def _run_eagerly_under(self, state, reason, args, kwargs):
        """Global state kiln cannot reproduce (``reason``: its break ID and why): an
        entry that runs ``fn`` itself while that state lasts (other states still compile)."""
        break_id, why = reason
        if self.fullgraph:
            _record_for_replay(self, args, kwargs, SkipFrame(break_id, why))
            raise Unsupported(break_id, f"{self.code.co_name}: {why}", _where(self.code))
        log_for("graph_breaks").info("running %s eagerly: %s", self.code.co_name, tag(break_id, why))
        if self.recorder is not None:
            self.recorder.skip(self.code.co_name, why, break_id)
        self.entries.append(_eager_entry(self.fn, state, why))
        return self.fn(*args, **kwargs)

    def _function_changed(self):
        """The user assigned ``fn.__defaults__``, ``__kwdefaults__`` or ``__code__``
        after compiling: entries take the new defaults (their guards then check the
        values a call omits, as for any argument); new code starts afresh."""
        fn = self.fn
        if fn.__code__ is not self.code:
            self.code = fn.__code__
            self.entries = []
            self.skip = None
            self.policy = DynamicPolicy()
            self._callees.clear()
            self._stored = None
        self._defaults, self._kwdefaults = fn.__defaults__, fn.__kwdefaults__
        for e in self.entries:
            e.fn.__defaults__, e.fn.__kwdefaults__ = self._defaults, self._kwdefaults

    def _ctx(self):
        ctx = TraceContext(self.backend, self.fullgraph, self._compile_callee, self.recorder)
        ctx.policy = self.policy
        return ctx

    def _compile_callee(self, fn):
        c = self._callees.get(fn)
        if c is None:
            c = CompiledFunction(fn, self.backend, self.fullgraph, self.recorder, self.frozen)
            self._callees[fn] = c
            trace_dir.note_callee(c)
        return c

    def _bind(self, args, kwargs):
        """The call's arguments by name, with the defaults the function has now."""
        try:
            sig = inspect.signature(self.fn, follow_wrapped=False)
            b = sig.bind(*args, **kwargs)
        except (TypeError, ValueError):
            return None
        b.apply_defaults()
        return dict(b.arguments)

    def _log_recompile(self, args, kwargs, limit=False, now_dynamic=()):
        """Every guard that failed, per entry, in plain words (``guard_failures``), and
        the sizes that become dynamic for the next trace."""
        log = log_for("recompiles")
        if not log.isEnabledFor(logging.INFO) and not limit and self.recorder is None:
            return
        bound = self._bind(args, kwargs) or {}
        per_entry = [guard_failures.explain(e.guards, e.namespace, bound) for e in self.entries]
        where = f"{self.code.co_name} ({self.code.co_filename}:{self.code.co_firstlineno})"
        # the limit's warning is shown by default: the last entry's failures only
        text = _recompile_words(per_entry[-1:] if limit else per_entry)
        extra = {"kiln_recompile": {"frame": self, "where": where, "limit": limit,
                                    "entries": [guard_failures.plain_lines(f) for f in per_entry]}}
        if now_dynamic:
            text += "".join(f"\n  {w}" for w in now_dynamic)
        if limit:
            logging.getLogger("kiln.recompiles").warning(
                "[K0053] %s hit recompile_limit (%d); running it eagerly from now on. Failed guards "
                "(last entry):\n%s%s",
                where, config.recompile_limit, text,
                mark_hint(self.policy, bound, self.entries[0].namespace if self.entries else {}),
                extra=extra)
        else:
            log.info("recompiling %s: guards failed:\n%s", where, text, extra=extra)
        if self.recorder is not None:
            last = guard_failures.plain_lines(per_entry[-1])
            self.recorder.recompiles.append((where, "; ".join(last) or "(no guard fails now)"))


def mark_hint(policy, bound, namespace) -> str:
    """At the limit: how to keep the sizes that keep changing from recompiling."""
    changes = policy.changes(bound, namespace)
    marks = [f"kiln.mark_dynamic({src.expr()}, {d})" for src, d in changes if d is not None]
    ints = [name for name, d in changes if d is None]
    lines = []
    if marks:
        lines.append("\nsizes that changed between calls; to compile them once for all sizes, mark "
                     "them dynamic before the call: " + "; ".join(marks))
    if ints:
        lines.append(f"\nint arguments that changed: {', '.join(ints)} (kiln.compile(dynamic=True) "
                     "makes them symbolic)")
    return "".join(lines)


def _recompile_words(per_entry) -> str:
    """One indented line per failed guard; entries numbered when there are several."""
    lines = []
    for i, failures in enumerate(per_entry):
        words = guard_failures.plain_lines(failures) or ["(no guard fails now)"]
        if len(per_entry) > 1:
            lines.append(f"  entry {i}:")
            lines += [f"    {w}" for w in words]
        else:
            lines += [f"  {w}" for w in words]
    return "\n".join(lines)


def _record_for_replay(cf, args, kwargs, error):
    """KILN_REPLAY_RECORD: a record of this failed capture (kiln/debug/replay.py)."""
    if config.replay_record:
        from kiln.debug.replay import record
        record(cf.fn, args, kwargs, cf.fullgraph, error)


def _where(code) -> list:
    """The user's function, as a one-frame user stack ("file:line in fn: source")."""
    line = code.co_firstlineno
    text = linecache.getline(code.co_filename, line).strip()
    return [f"{code.co_filename}:{line} in {code.co_name}: {text}"]


def _as_kiln_error(ex, code):
    """What kiln raises for a failure of its own while compiling ``code``: kiln's
    errors as they are, anything else as an InternalError (``ex`` its cause); both end
    with the user's line being traced (the function, when no line is known)."""
    if isinstance(ex, (InternalError, BackendCompilerFailed)):
        err = ex
    else:
        err = InternalError(f"kiln: internal error while compiling {code.co_name}: "
                            f"{type(ex).__name__}: {ex}")
        err._kiln_stack = getattr(ex, "_kiln_stack", None)
    if not getattr(err, "_kiln_stack", None):
        err._kiln_stack = _where(code)
    return err


def _eager_entry(fn, state, why):
    snapshot = global_state.snapshot

    def run_eagerly(*args, **kwargs):
        if snapshot() != state:
            return MISS
        return fn(*args, **kwargs)

    guard = Guard("__state() == __S", f"global torch state is ({global_state.describe(state)})",
                  "__state()")
    return Entry(run_eagerly, [guard], {"__state": snapshot, "__S": state},
                 f"# {fn.__qualname__} runs eagerly: {why}")


def reset_all():
    for c in list(_all_compiled):
        c.entries.clear()
        c._stored = None
        c.skip = None
        c.policy = DynamicPolicy()
        c._callees.clear()
    _all_compiled.clear()
