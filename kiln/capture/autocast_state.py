"""Autocast's thread-local state: what a trace tracks of it, and the calls the
generated entry code makes to keep the real state as eager leaves it.

Autocast (``torch.autocast``) is state, like grad mode: per device type an enabled
flag and a lower-precision dtype, one weight-cast cache flag, and a nesting count (the
cache is dropped when the outermost ``torch.autocast`` block exits). kiln tracks it
through a trace (``AmpState``, one per op), makes the casts autocast would insert
explicit graph nodes (``autocast.py``), and runs every compiled graph with autocast
off (``graph_without_autocast``): the casts are in it. The trace itself runs with the
real autocast state off (``tracing``), so that no fake op meets autocast but the ones
``autocast.py`` runs under the traced state on purpose.

kiln models the CPU and CUDA autocast; another device type's autocast enabled makes
the call run eagerly (``global_state.eager_reason``).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, replace

import torch

from kiln.amp_off import without_autocast

DEVICES = ("cpu", "cuda")
#: device types whose autocast kiln does not model
OTHER_DEVICES = ("xpu", "hpu", "mps", "ipu", "xla", "mtia", "maia")

_any_enabled = torch._C._is_any_autocast_enabled
_is_enabled = torch.is_autocast_enabled
_get_dtype = torch.get_autocast_dtype
_set_enabled = torch.set_autocast_enabled
_set_dtype = torch.set_autocast_dtype
_cache_enabled = torch.is_autocast_cache_enabled
_set_cache = torch.set_autocast_cache_enabled


@dataclass(frozen=True)
class AmpState:
    """The autocast state of CPU and CUDA: ``cpu`` / ``cuda`` are (enabled, dtype)."""
    cpu: tuple
    cuda: tuple
    cache: bool

    @staticmethod
    def current() -> "AmpState":
        return AmpState(*((_is_enabled(d), _get_dtype(d)) for d in DEVICES), _cache_enabled())

    def of(self, device_type: str) -> tuple:
        return getattr(self, device_type) if device_type in DEVICES else (False, None)

    def enabled(self, device_type: str) -> bool:
        return self.of(device_type)[0]

    @property
    def any_enabled(self) -> bool:
        return self.cpu[0] or self.cuda[0]

    def with_device(self, device_type: str, enabled: bool, dtype, cache: bool) -> "AmpState":
        return replace(self, **{device_type: (enabled, dtype)}, cache=cache)

    def apply(self) -> None:
        """Make this the thread's autocast state (not the nesting count)."""
        for d in DEVICES:
            enabled, dtype = getattr(self, d)
            _set_enabled(d, enabled)
            _set_dtype(d, dtype)
        _set_cache(self.cache)

    @contextlib.contextmanager
    def applied(self, cache: bool | None = None):
        """This state (with the cache flag overridden) while the block runs."""
        before = AmpState.current()
        (self if cache is None else replace(self, cache=cache)).apply()
        try:
            yield
        finally:
            before.apply()

    def describe(self) -> str:
        on = [f"{d} {getattr(self, d)[1]}" for d in DEVICES if getattr(self, d)[0]]
        return ("autocast " + ", ".join(on)) if on else "autocast off"


def snapshot_key():
    """The autocast part of ``global_state.snapshot``: None while none is enabled (the
    common case, one call), else the enabled device types with their dtypes, the cache
    flag and the device types kiln does not model that are enabled."""
    if not _any_enabled():
        return None
    return (tuple((d, _get_dtype(d)) for d in DEVICES if _is_enabled(d)), _cache_enabled(),
            tuple(d for d in OTHER_DEVICES if _is_enabled(d)))


def nesting() -> int:
    """How many ``torch.autocast`` blocks are open (PyTorch has no getter: the
    increment returns the new count, the decrement undoes it; nothing else changes)."""
    n = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return n


# --- tracing ----------------------------------------------------------------------------
_tls = threading.local()


@contextlib.contextmanager
def tracing():
    """Run a trace with the real autocast state off; ``entry_state()`` is the state the
    call came in with."""
    stack = getattr(_tls, "entries", None)
    if stack is None:
        stack = _tls.entries = []
    state = AmpState.current()
    stack.append((state, snapshot_key()))
    off = state.any_enabled
    if off:
        for d in DEVICES:
            _set_enabled(d, False)
    try:
        yield state
    finally:
        stack.pop()
        if off:
            state.apply()


def entry_state() -> AmpState:
    stack = getattr(_tls, "entries", None)
    return stack[-1][0] if stack else AmpState.current()


def entry_key():
    """``snapshot_key()`` as the call being traced came in."""
    stack = getattr(_tls, "entries", None)
    return stack[-1][1] if stack else snapshot_key()


# --- what generated entry code calls ----------------------------------------------------
graph_without_autocast = without_autocast   # the graph call (entry code)


def leave(state: AmpState, nesting_delta: int) -> None:
    """Set ``state`` and move the nesting count as the ``torch.autocast`` blocks the
    traced code entered (+) or left (-) did; a block leaving the count at 0 drops the
    weight-cast cache, as ``torch.autocast.__exit__`` does."""
    for _ in range(nesting_delta):
        torch.autocast_increment_nesting()
    for _ in range(-nesting_delta):
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
    state.apply()


def block_exit(device, fast_dtype, enabled, cache_enabled, prev, prev_fastdtype, prev_cache):
    """The ``__exit__`` of a ``torch.autocast`` block entered before a graph break: a real
    autocast object, as its ``__enter__`` left it, whose exit the resumed code runs."""
    cm = torch.amp.autocast.__new__(torch.amp.autocast)
    cm.device, cm.fast_dtype, cm._enabled, cm._cache_enabled = device, fast_dtype, enabled, cache_enabled
    cm.prev, cm.prev_fastdtype, cm.prev_cache_enabled = prev, prev_fastdtype, prev_cache
    return cm.__exit__
