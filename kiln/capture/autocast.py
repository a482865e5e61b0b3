"""Autocast in a trace: ``torch.autocast`` blocks as traced state, and the casts autocast
inserts made explicit graph nodes.

Eager autocast sits above autograd in the dispatcher: for an op on its lists it casts
the eligible tensor arguments (``arg.to(dtype)``, recorded by autograd), or passes
``dtype=torch.float32``, then runs the op with autocast off. kiln does the same at the
torch level, per op (``AmpTracker.explicit_call``): it runs the op on fake tensors
under the traced autocast state with a probe below autocast, reads the casts autocast
made of the op's own arguments, and records them as ``Tensor.to`` nodes ahead of the
op, which then runs without autocast. Each rewrite is checked on fakes before it is
recorded: the ops dispatched and the results' metadata must be what autocast gave. An
op whose autocast effect is not such a rewrite (a composite that autocasts inside,
``einsum``) is a graph break: it runs eagerly under the real autocast state. Graphs
thus carry eager's dtypes for every backend, the aten backward included, and are
called with autocast off (``autocast_state.graph_without_autocast``).

Autocast's weight cache (a float32 leaf that requires grad, cast to the lower
precision, is cast once per outermost block) is one shared cast node, so the
gradient accumulates in the lower precision as eager's does. Casts cached by eager
code around a compiled call are not seen: there the compiled graph casts again (same
values; a gradient reaching the weight through both is summed in float32).
"""
from __future__ import annotations

import inspect

import torch

from kiln.capture import values as V
from kiln.capture.autocast_state import (DEVICES, AmpState, entry_state, graph_without_autocast,
                                        leave, nesting)
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.fake import FakeMode
from kiln.capture.rule_tables import CONST_FOLD
from kiln.dispatch_mode import KilnDispatchMode
from kiln.shapes.fake_ops import call_on_fakes

aten = torch.ops.aten


class _Probe(KilnDispatchMode):
    """Records what reaches the dispatcher below autocast (and autograd)."""

    def __init__(self):
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def _describe(x):
    """What must match for two runs of an op to be the same: results' metadata."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad)
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(_describe(i) for i in x))
    return ("V", repr(x))


class _Block:
    """An open ``torch.autocast`` block: the fields its exit restores."""
    __slots__ = ("device", "prev", "prev_dtype", "prev_cache", "here")

    def __init__(self, device, prev, prev_dtype, prev_cache, here):
        self.device, self.prev, self.prev_dtype, self.prev_cache = device, prev, prev_dtype, prev_cache
        self.here = here            # entered by this trace (else before its graph break)

    def undo(self, state: AmpState) -> AmpState:
        return state.with_device(self.device, self.prev, self.prev_dtype, self.prev_cache)

    def fields(self) -> tuple:
        return (self.device, self.prev, self.prev_dtype, self.prev_cache)


class AmpTracker:
    """The autocast state through one trace: its state per op, the blocks open, the net
    change of the nesting count, the cast cache."""

    def __init__(self, guards):
        self.guards = guards
        self.entry = entry_state()
        self.state = self.entry
        self.blocks: list[_Block] = []
        self.nesting_delta = 0
        self.used = self.entry.any_enabled       # graphs must run with autocast off
        self.cache: dict = {}                    # id(TensorValue) -> its cached cast
        self.bypass = False
        self._guarded: set = set()
        self._entry_nesting = None
        self.start_blocks: list[_Block] = []
        #: per recorded op, how many blocks opened before this trace's graph were open
        self.open_before_at_ops: set = set()

    def resume_inside(self, blocks) -> None:
        """A resume function starts inside the blocks its graph break was in."""
        self.blocks = [_Block(*b, here=False) for b in blocks]
        self.start_blocks = list(self.blocks)

    # --- reads the trace makes ----------------------------------------------------------
    def read_dtype(self, device: str):
        """``torch.get_autocast_dtype(device)`` as the traced code would see it."""
        self._guard_entry(device)
        return self.state.of(device)[1]

    def read_enabled(self, device: str) -> bool:
        return self.state.enabled(device)

    def read_cache(self) -> bool:
        self._guard_entry("cache")
        return self.state.cache

    def _guard_entry(self, what: str) -> None:
        """A value read from the entry state that the global-state guard does not hold
        (the dtype of a device type not enabled at entry; the cache flag while none
        is): guarded, unless the trace itself set it."""
        if what in self._guarded:
            return
        self._guarded.add(what)
        if what == "cache":
            if not self.entry.any_enabled and self.state.cache == self.entry.cache:
                self.guards.expression(f"__torch.is_autocast_cache_enabled() is {self.entry.cache}",
                                       f"autocast cache enabled is {self.entry.cache}")
            return
        enabled, dtype = self.entry.of(what)
        if not enabled and self.state.of(what)[1] is dtype:
            self.guards.expression(f"__torch.get_autocast_dtype({what!r}) is {self.guards.const(dtype, 'dt')}",
                                   f"autocast dtype of {what} is {dtype}")

    # --- blocks ---------------------------------------------------------------------------
    def enter(self, ctx) -> None:
        s = self.state
        dev_enabled, dev_dtype = s.of(ctx.device)
        self.blocks.append(_Block(ctx.device, dev_enabled, dev_dtype, s.cache, here=True))
        ctx.prev = (dev_enabled, dev_dtype, s.cache)
        self.nesting_delta += 1
        self.state = s.with_device(ctx.device, ctx.enabled, ctx.fast_dtype, ctx.cache_enabled)
        self.used = self.used or self.state.any_enabled

    def exit(self, ctx) -> None:
        if not self.blocks or self.blocks[-1].device != ctx.device:
            raise Unsupported("K0034", "leaving a torch.autocast block other than the innermost one")
        block = self.blocks.pop()
        self.nesting_delta -= 1
        self.state = block.undo(self.state)
        if self.cache and self._nesting_now() == 0:
            self.cache.clear()      # torch.autocast.__exit__ drops the weight-cast cache

    def _nesting_now(self) -> int:
        if self._entry_nesting is None:
            self._entry_nesting = nesting()
            zero = self._entry_nesting == 0
            self.guards.expression(f"({self.guards.const(nesting, 'f')}() == 0) is {zero}",
                                   f"{'no' if zero else 'some'} torch.autocast block is open")
        return self._entry_nesting + self.nesting_delta

    def note_op(self) -> None:
        self.open_before_at_ops.add(sum(1 for b in self.blocks if not b.here))

    def unwound(self, blocks) -> AmpState:
        """The state eager's with-statements leave once ``blocks`` have exited."""
        s = self.state
        for b in reversed(blocks):
            s = b.undo(s)
        return s

    # --- the entry code ---------------------------------------------------------------------
    def graph_call_lines(self, cg, line: str) -> list:
        """The graph call; if it raises inside blocks opened before this trace's graph
        break, those blocks exit as eager's would (the graph itself runs with autocast
        off: ``graph_without_autocast``)."""
        k = max(self.open_before_at_ops, default=0)
        if not k:
            return [line]
        s = self.entry
        for b in reversed(self.start_blocks[:k]):
            s = b.undo(s)
        return ["try:", "    " + line, "except BaseException:",
                f"    {cg.ref(leave, 'amp_leave')}({cg.ref(s, 'amp')}, {-k})", "    raise"]

    def leave_lines(self, cg) -> list:
        """After the graph: the state, and the nesting count, the traced code leaves."""
        if self.state == self.entry and not self.nesting_delta:
            return []
        return [f"{cg.ref(leave, 'amp_leave')}({cg.ref(self.state, 'amp')}, {self.nesting_delta})"]

    def unwind_lines(self, cg) -> list:
        """When the step at a graph break raises: every open block exits."""
        if not self.blocks:
            return []
        return [f"{cg.ref(leave, 'amp_leave')}({cg.ref(self.unwound(self.blocks), 'amp')}, {-len(self.blocks)})"]

    # --- ops --------------------------------------------------------------------------------
    def explicit_call(self, out, kind, target, args, kwargs):
        """``target(*args, **kwargs)`` under the traced autocast state, as the arguments
        to record it with autocast off: autocast's casts recorded ahead of it."""
        tensors = []
        _map_tensors((args, kwargs), lambda t: tensors.append(t) or t)
        if not tensors:
            return args, kwargs      # factories: autocast never touches them

        f_args = [V.rules.to_fake(a) for a in args]
        f_kwargs = {k: V.rules.to_fake(v) for k, v in kwargs.items()}
        a_out, a_calls = self._probe(out, kind, target, f_args, f_kwargs, self.state)
        try:    # without autocast the op may reject its mixed dtypes (a bf16 input, a
            b_out, b_calls = self._probe(out, kind, target, f_args, f_kwargs, None)
        except Exception:      # noqa: BLE001   float32 conv bias): then casts are needed
            b_out = b_calls = None
        if b_calls is not None and _same_run(a_out, a_calls, b_out, b_calls):
            return args, kwargs
        # The leading casts of arguments are autocast's, but the op itself may cast too
        # (CPU attention's math path upcasts q, k, v after autocast cast the mask): the
        # longest prefix that, applied before the op run without autocast, reproduces it.
        plan = self._cast_plan(out, tensors, a_calls)
        for limit in range(plan[1] if plan else 0, 0, -1):
            casts, n = plan if limit == plan[1] else (self._cast_plan(out, tensors, a_calls, limit)
                                                      or (None, 0))
            if casts is None:
                continue
            c_args, c_kwargs = _map_tensors(
                (f_args, f_kwargs), lambda f: casts[id(f)][0] if id(f) in casts else f, fakes=True)
            try:
                c_out, c_calls = self._probe(out, kind, target, c_args, c_kwargs, None)
            except Exception:      # noqa: BLE001  (these casts are not autocast's)
                continue
            if _same_run(a_out, a_calls[n:], c_out, c_calls):
                return self._record_casts(out, args, kwargs, {k: v[1] for k, v in casts.items()})
        if "dtype" not in kwargs:
            try:
                c_out, c_calls = self._probe(out, kind, target, f_args,
                                             {**f_kwargs, "dtype": torch.float32}, None)
            except Exception:      # noqa: BLE001  (the op takes no dtype)
                c_out = c_calls = None
            if c_calls is not None and _same_run(a_out, a_calls, c_out, c_calls):
                return args, {**kwargs, "dtype": V.ConstantValue(torch.float32)}
        raise Unsupported("K0034", f"{_name(target)} under autocast ({self.state.describe()}): its effect "
                          "is not a cast of its arguments, which kiln records")

    def _probe(self, out, kind, target, f_args, f_kwargs, state):
        probe = _Probe()
        amp = (state or _OFF).applied(cache=False)
        try:
            with torch.set_grad_enabled(out.grad_enabled), amp, FakeMode(), probe:
                fn, a = (getattr(f_args[0], target), f_args[1:]) if kind == "call_method" \
                    else (target, f_args)

                def run(*a, **k):
                    probe.calls.clear()     # a second try (call_on_fakes): its calls alone
                    return fn(*a, **k)
                r = call_on_fakes(run, a, f_kwargs)
        except Unsupported:
            raise
        except Exception as e:      # noqa: BLE001
            if state is None:
                raise
            raise Unsupported("K0008", f"{_name(target)} under autocast ({self.state.describe()}) fails "
                              f"on fake tensors: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return r, probe.calls

    def _cast_plan(self, out, tensors, calls, limit=None):
        """The casts autocast made of the op's own arguments (its first dispatches, at
        most ``limit``), as {id(fake): (fake cast, dtype)}, and how many dispatches they
        were; None when they do not cover each occurrence of a cast argument."""
        by_id = {id(t.fake): t for t in tensors}
        seen: dict = {}
        n = 0
        for func, a, k in calls:
            if n == limit:
                break
            if func is aten._to_copy.default and a and id(a[0]) in by_id and set(k) == {"dtype"}:
                d = k["dtype"]
                if seen.setdefault(id(a[0]), [d, 0])[0] is not d:
                    return None
                seen[id(a[0])][1] += 1
                n += 1
            else:
                break
        if not n:
            return None
        occurrences: dict = {}
        for t in tensors:
            occurrences[id(t.fake)] = occurrences.get(id(t.fake), 0) + 1
        if any(occurrences[i] != c for i, (_, c) in seen.items()):
            return None
        casts = {}
        with torch.set_grad_enabled(out.grad_enabled), FakeMode():
            for i, (d, _) in seen.items():
                casts[i] = (by_id[i].fake.to(d), d)
        return casts, n

    def _record_casts(self, out, args, kwargs, dtypes):
        """The arguments with each cast one as a ``Tensor.to`` node (one per occurrence,
        or the cached one for a weight, as autocast's cache gives)."""
        def cast(t):
            d = dtypes.get(id(t.fake))
            if d is None:
                return t
            # keyed by the tensor alone, as PyTorch's: a cast cached in bfloat16 is what a
            # nested float16 block gets too (and its op then refuses the mixed dtypes)
            key = id(t)
            if self._cacheable(t, d):
                hit = self.cache.get(key)
                if hit is not None and hit.fake.dtype is not d:
                    # eager's op then refuses mixed dtypes; the frame raises eagerly (or,
                    # where the program catches it, the op runs at a graph break)
                    raise UserException(V.ExceptionValue.of_real(RuntimeError(
                        f"autocast's cached {hit.fake.dtype} cast of a weight used in a "
                        f"{d} autocast block")), from_fake=True)
                if hit is not None:
                    return hit
            self.bypass = True
            try:
                c = out.op("call_method", "to", [t, V.ConstantValue(d)], {})
            finally:
                self.bypass = False
            if self._cacheable(t, d):
                self.cache[key] = c
            return c

        return _map_tensors((args, kwargs), cast)

    def _cacheable(self, t, d) -> bool:
        f = t.fake
        return (self.state.cache and d is self.state.of(f.device.type)[1]
                and f.dtype is torch.float32 and f.requires_grad and f.is_leaf
                and not f._is_view())


_OFF = AmpState((False, torch.bfloat16), (False, torch.float16), True)


def _same_run(a_out, a_calls, b_out, b_calls) -> bool:
    return [c[0] for c in a_calls] == [c[0] for c in b_calls] and _describe(a_out) == _describe(b_out)


def _map_tensors(x, fn, fakes=False):
    """``x`` (Values, or fakes with ``fakes``) with each tensor replaced by ``fn(t)``,
    containers rebuilt, in argument order."""
    if (isinstance(x, torch.Tensor) if fakes else isinstance(x, V.TensorValue)):
        return fn(x)
    if isinstance(x, tuple) and not isinstance(x, V.Value):
        return tuple(_map_tensors(i, fn, fakes) for i in x)
    if isinstance(x, list):
        return [_map_tensors(i, fn, fakes) for i in x]
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn, fakes) for k, v in x.items()}
    if not fakes and isinstance(x, (V.TupleValue, V.ListValue)) and not isinstance(x, V.NamedTupleValue):
        return type(x)([_map_tensors(i, fn, fakes) for i in x.items])
    if not fakes and isinstance(x, V.DictValue):
        return V.DictValue({k: _map_tensors(v, fn, fakes) for k, v in x.items.items()})
    return x


def _name(t):
    return t if isinstance(t, str) else getattr(t, "__name__", repr(t))


# --- torch.autocast as a traced context manager ---------------------------------------------
class AutocastValue(V.ContextValue):
    """A ``torch.autocast`` object: entering and leaving it change the traced state."""

    def __init__(self, device, fast_dtype, enabled, cache_enabled, cls=torch.amp.autocast):
        self.device, self.fast_dtype = device, fast_dtype
        self.enabled, self.cache_enabled = enabled, cache_enabled
        self.cls = cls
        self.prev = None            # (enabled, dtype, cache) of the device before entering

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        if name == "__class__":
            return V.ClassValue(self.cls)
        fields = {"device": self.device, "fast_dtype": self.fast_dtype,
                  "_enabled": self.enabled, "_cache_enabled": self.cache_enabled}
        if name in fields:
            return V.ConstantValue(fields[name])
        raise Unsupported("K0009", f"attribute {name!r} of a torch.autocast object")

    def call(self, tx, args, kwargs):       # used as a decorator
        if len(args) != 1 or kwargs:
            raise Unsupported("K0034", "calling a torch.autocast object with other than one function")
        return _AutocastWrapped(self, args[0])

    def enter(self, tx):
        if self.device not in DEVICES and self.enabled:
            raise Unsupported("K0034", f"torch.autocast on {self.device!r} (kiln models CPU and CUDA autocast)")
        tx.output.autocast.enter(self)
        return self

    def exit(self, tx):
        tx.output.autocast.exit(self)
        return V.ConstantValue(None)

    def exit_expr(self, cg) -> str:
        """Source rebuilding this block's ``__exit__`` after a graph break."""
        from kiln.capture.autocast_state import block_exit

        prev, prev_dtype, prev_cache = self.prev
        args = [self.device, self.fast_dtype, self.enabled, self.cache_enabled, prev, prev_dtype, prev_cache]
        return f"{cg.ref(block_exit, 'amp_exit')}({', '.join(cg.ref(a, 'c') if isinstance(a, torch.dtype) else repr(a) for a in args)})"


class _AutocastWrapped(V.Value):
    """``torch.autocast(...)(fn)`` made during a trace: calls ``fn`` inside the block."""

    def __init__(self, ctx, fn):
        self.ctx, self.fn = ctx, fn

    def call(self, tx, args, kwargs):
        ctx = AutocastValue(self.ctx.device, self.ctx.fast_dtype, self.ctx.enabled,
                            self.ctx.cache_enabled, self.ctx.cls)
        ctx.enter(tx)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            ctx.exit(tx)


def construct(tx, cls, args, kwargs):
    """``torch.autocast(...)`` (or a subclass: ``torch.cpu.amp.autocast``) called in a
    trace: PyTorch's own constructor, with the defaults it would read taken from the
    traced state."""
    try:
        a = [v.const() for v in args]
        k = {n: v.const() for n, v in kwargs.items()}
    except Unsupported:
        raise Unsupported("K0011", "torch.autocast(...) with arguments that are not constants") from None
    sig = inspect.signature(cls.__init__)
    bound = sig.bind(None, *a, **k)
    bound.apply_defaults()
    device = bound.arguments.get("device_type", "cuda" if "cuda" in cls.__module__ else "cpu")
    if isinstance(device, str) and device in DEVICES:
        if bound.arguments.get("dtype", 0) is None:
            bound.arguments["dtype"] = tx.output.autocast.read_dtype(device)
        if bound.arguments.get("cache_enabled", 0) is None:
            bound.arguments["cache_enabled"] = tx.output.autocast.read_cache()
    real = cls(*bound.args[1:], **bound.kwargs)
    return AutocastValue(real.device, real.fast_dtype, real._enabled, real._cache_enabled, cls)


@V.rule(name="autocast_wrap_real")
def wrap_real(tx, obj, source):
    """A real ``torch.autocast`` object (the ``@torch.autocast(...)`` decorator's), or the
    bound ``__exit__`` of one entered before a graph break; guarded on the fields read."""
    from kiln.capture.sources import AttrSource

    is_exit = not isinstance(obj, torch.amp.autocast)
    cm = obj.__self__ if is_exit else obj
    cm_src = AttrSource(source, "__self__") if is_exit and source is not None else source
    names = ["device", "fast_dtype", "_enabled", "_cache_enabled"]
    if is_exit:
        names += ["prev", "prev_fastdtype", "prev_cache_enabled"]
    g = tx.output.guards
    if cm_src is not None:
        g.type_is(cm_src, type(cm))
        for n in names:
            g.constant(AttrSource(cm_src, n), getattr(cm, n))
    v = AutocastValue(cm.device, cm.fast_dtype, cm._enabled, cm._cache_enabled, type(cm))
    if not is_exit:
        return v
    v.prev = (cm.prev, cm.prev_fastdtype, cm.prev_cache_enabled)
    return V.ExitValue(v)


@V.rule
def is_real_autocast(obj) -> bool:
    import types

    if isinstance(obj, torch.amp.autocast):
        return True
    return (type(obj) is types.MethodType and isinstance(obj.__self__, torch.amp.autocast)
            and obj.__func__.__name__ == "__exit__")


# --- state queries, answered from the traced state ---------------------------------------------
def _device_arg(args, kwargs, default="cuda"):
    v = args[0] if args else kwargs.get("device_type")
    return default if v is None else v.const()


QUERY_RULES = {
    torch.is_autocast_enabled: lambda tx, a, k: V.ConstantValue(
        tx.output.autocast.read_enabled(_device_arg(a, k))),
    torch.get_autocast_dtype: lambda tx, a, k: V.ConstantValue(
        tx.output.autocast.read_dtype(_device_arg(a, k))),
    torch.is_autocast_cache_enabled: lambda tx, a, k: V.ConstantValue(tx.output.autocast.read_cache()),
    torch.is_autocast_cpu_enabled: lambda tx, a, k: V.ConstantValue(tx.output.autocast.read_enabled("cpu")),
    torch.get_autocast_cpu_dtype: lambda tx, a, k: V.ConstantValue(tx.output.autocast.read_dtype("cpu")),
    torch.get_autocast_gpu_dtype: lambda tx, a, k: V.ConstantValue(tx.output.autocast.read_dtype("cuda")),
    torch._C._is_autocast_available: lambda tx, a, k: V.ConstantValue(
        torch._C._is_autocast_available(_device_arg(a, k))),
    torch._C._is_any_autocast_enabled: lambda tx, a, k: V.ConstantValue(
        tx.output.autocast.state.any_enabled),
}
CONST_FOLD.update(QUERY_RULES)
