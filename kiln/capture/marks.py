"""What the user marked about functions and frames, read by both the public API (which
sets the marks) and the capture engine (which obeys them): ``allow_in_graph`` /
``disallow_in_graph`` registries, the ``kiln.disable`` mark, ``graph_break`` and
``is_compiling``, and the per-thread compile/disable depth behind the last two.

It sits at the bottom of capture's import stack (nothing from kiln.capture imported
here), so the engine never reaches up into ``api.py``."""
from __future__ import annotations

import threading
import types
import weakref

#: per-thread ``depth`` (frames being compiled) and ``disabled`` (kiln.disable calls
#: running); eval_frame and the disable wrappers update them
state = threading.local()


class _Registry:
    """Functions registered by ``allow_in_graph`` / ``disallow_in_graph``: held weakly
    where Python allows it. Builtins cannot be (they live as long as their module);
    bound methods are new objects on every read, compared by value: held strongly."""

    def __init__(self):
        self._weak = weakref.WeakSet()
        self._strong = set()

    def add(self, fn):
        if isinstance(fn, types.MethodType):
            self._strong.add(fn)
            return
        try:
            self._weak.add(fn)
        except TypeError:
            self._strong.add(fn)

    def __contains__(self, fn):
        try:
            return fn in self._weak or fn in self._strong
        except TypeError:       # unhashable
            return False


allowed_in_graph = _Registry()
disallowed_in_graph = _Registry()


def allow_in_graph(fn):
    """Put calls to ``fn`` into the graph as one node, without tracing into it."""
    allowed_in_graph.add(fn)
    return fn


def disallow_in_graph(fn):
    """Never put ``fn`` into a graph: calls to it become graph breaks."""
    disallowed_in_graph.add(fn)
    return fn


def mark_disabled(wrapper):
    """Mark a ``kiln.disable`` wrapper: a call to it from compiled code is a graph break."""
    wrapper._kiln_disabled = True
    return wrapper


def is_marked_disabled(obj) -> bool:
    # the instance's own dict: not a __getattr__'s answer
    return getattr(obj, "__dict__", {}).get("_kiln_disabled") is True


def disabled_depth() -> int:
    return getattr(state, "disabled", 0)


def graph_break():
    """Force a graph break here (a no-op when run eagerly)."""


def is_compiling() -> bool:
    """True while kiln traces (library code may ask, to pick compile-friendly paths)."""
    return getattr(state, "depth", 0) > 0
