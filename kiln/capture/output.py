"""The graph under construction for one frame, and everything it must account for.

``OutputGraph`` owns the FX graph, its inputs (each a tensor read from a source), the
guards, the objects whose state the program mutates (applied after the graph runs, in
program order), and the grad mode. ``op`` is the one door into the graph: it runs the op
on fake tensors to learn the result's metadata and records the node.
"""
from __future__ import annotations

import operator
import re

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map

from kiln.capture import global_state
from kiln.capture.autocast import AmpTracker
from kiln.capture import autocast_composites
from kiln.capture import values as V
from kiln.capture.errors import InternalError, Unsupported, UserException
from kiln.shapes.env import ShapeEnv
from kiln.shapes.fake_ops import call_on_fakes
from kiln.capture.sym_sizes import dense_order, layout_guards, symbolic_fake
from kiln.capture.fake import (DataDependent, FakeMode, FakeTensor, NoMetaKernel, to_fake,
                               unsupported_tensor)
from kiln.capture.guards import GuardSet


_MAX_DISTINCT_PAIRS = 8  # guards "a is not b"; past that, one id-set guard per type


class OutputGraph:
    #: the interpreter frame running now: each node records its user line
    #: (``meta["kiln_user_line"]``; not FX's stack_trace, which is printed into the code
    #: that keys caches) for the trace report's kernels
    active_frame = None

    def __init__(self):
        self.graph = fx.Graph()
        self.guards = GuardSet()
        self.inputs: list = []  # (source, placeholder node, real tensor)
        self._input_by_id: dict = {}
        self._real_by_node: dict = {}
        self.grad_writes: dict = {}  # id(input TensorValue) -> tensor_grads.GradWrites
        self._value_by_fake: dict = {}
        self._objects: dict = {}  # id(real object) -> ObjectValue / ModuleValue
        self._object_types: dict = {}  # id(real object) -> its type
        self.real_cells: dict = {}  # id(closure cell) -> cells.RealCell
        self.mutated: list = []  # objects/containers the program changed, in order
        self.global_writes: dict = {}  # name -> Value
        self.grad_enabled = torch.is_grad_enabled()
        self.entry_grad_enabled = self.grad_enabled  # the graph's caller restores the end's
        self.guards.grad_mode(self.grad_enabled)
        #: the modes grad-mode with-blocks open here restore, outermost first (a resume
        #: function starts inside the blocks its break was in)
        self.grad_blocks: list = []
        self._unwind_modes: set = set()   # the grad mode eager leaves if an op raises
        self.guards.global_state(global_state.traced_snapshot())
        self.autocast = AmpTracker(self.guards)   # autocast state, per op (autocast.py)
        #: the size symbols of this trace; the policy says which argument sizes are symbolic
        self.shapes = ShapeEnv(where=self._user_line)
        self.policy = None
        #: a size of an input is static only because it is 0 or 1 where the policy
        #: would make it symbolic: this trace is one size of a stream
        self.small_size_of_stream = False
        self._names: set = set()
        self._keepalive: list = []
        #: every code object the trace ran (the capture cache checks their files)
        self.traced_codes: set = set()
        #: the graph as handed to the backend (capture_cache.GraphInfo), once compiled
        self.compiled_graph = None

    # --- inputs ------------------------------------------------------------------
    def input_tensor(self, real: torch.Tensor, source) -> V.TensorValue:
        known = self._input_by_id.get(id(real))
        if known is not None:
            if known.source != source:
                self.guards.expression(f"{source.expr()} is {known.source.expr()}",
                                       f"{source.pretty()} is {known.source.pretty()}")
            return known
        why = unsupported_tensor(real)
        if why is not None:
            raise Unsupported("K0056", f"{source.pretty()} is {why}, which capture does not model")
        dims = self.policy.tensor_dims(source, real) if self.policy is not None else {}
        if self.policy is not None and self.policy.specialises_small(source, real):
            self.small_size_of_stream = True
        fake = symbolic_fake(self, real, source, dims) if dims else None
        self.guards.tensor(source, real, dynamic=frozenset(dims) if fake is not None else (),
                           layout=None if fake is None or real.is_contiguous() else
                           layout_guards(source, real, dense_order(real), dims))
        node = self.graph.placeholder(self._fresh(source.pretty()))
        fake = fake if fake is not None else to_fake(real)
        node.meta["example_value"] = fake
        tv = V.TensorValue(node, fake, source)
        tv.cls = type(real)
        tv.input_geometry = _geometry(fake)     # an in-place op changing it is seen at the end
        self.inputs.append((source, node, real))
        self._input_by_id[id(real)] = tv
        self._real_by_node[node] = real
        self._value_by_fake[id(fake)] = tv
        self._keepalive.append(real)
        return tv

    def _user_line(self) -> str:
        fr = self.active_frame
        if fr is None or fr.inst is None:
            return "?"
        import linecache
        text = linecache.getline(fr.code.co_filename, fr.inst.line or 0).strip()
        return f"{fr.code.co_filename}:{fr.inst.line} in {fr.code.co_name}: {text}"

    def real_input(self, tv):
        """The real tensor the input ``tv`` was read from; None for one the graph makes."""
        return self._real_by_node.get(tv.node)

    def _fresh(self, pretty: str) -> str:
        base = re.sub(r"[^0-9a-zA-Z_]+", "_", pretty).strip("_").lower() or "x"
        if base[0].isdigit():
            base = "_" + base
        name, i = base, 1
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def object_value(self, obj, source, cls=V.ObjectValue):
        """The one Value of a real object (a module, a user object) in this trace."""
        v = self.known_value(obj, source)
        return v if v is not None else self.remember(obj, cls(obj, source))

    def known_value(self, obj, source=None):
        """The Value already made for ``obj``; reached again through another source,
        the trace now assumes the two are one object, and guards that."""
        v = self._objects.get(id(obj))
        if v is not None and source is not None and v.source is not None and v.source != source:
            self.guards.expression(f"{source.expr()} is {v.source.expr()}",
                                   f"{source.pretty()} is {v.source.pretty()}")
        return v

    def remember(self, obj, v):
        self._objects[id(obj)] = v
        self._object_types[id(obj)] = type(obj)
        self._keepalive.append(obj)
        return v

    def mark_mutated(self, v):
        if not any(m is v for m in self.mutated):
            self.mutated.append(v)

    def guard_mutated_distinct(self):
        """The trace took the objects it read through different sources for different
        objects (one object reached twice is one Value, guarded by ``is``). Where it
        mutated one of them, a later call passing the same object twice (an argument
        that is a global, two arguments) would see the mutation through both names in
        eager but not in the trace: guard that each mutated object is none of the
        others of its type (objects of other types cannot be it)."""
        mutated = {id(m) for m in self.mutated}
        by_type: dict = {}
        for oid, v in self._objects.items():
            if v.source is not None:
                by_type.setdefault(self._object_types[oid], []).append(v)
        # an input tensor whose geometry an in-place op changed (``t_``, ``unsqueeze_``):
        # views share data (the backends check storage overlap), one object shares shape
        for _, _, real in self.inputs:
            if not isinstance(real, torch.Tensor):   # a symbolic int argument
                continue
            tv = self._input_by_id[id(real)]
            by_type.setdefault(type(real), []).append(tv)
            if _geometry(tv.fake) != tv.input_geometry:
                mutated.add(id(tv))
        for group in by_type.values():
            pairs = [(m.source, o.source) for m in group if id(m) in mutated
                     for o in group if o is not m]
            if len(pairs) > _MAX_DISTINCT_PAIRS:  # many: one check that all are distinct
                reads = ", ".join(f"id({v.source.expr()})" for v in group)
                self.guards.expression(f"len({{{reads}}}) == {len(group)}",
                                       f"{', '.join(v.source.pretty() for v in group)} are distinct")
                continue
            for pair in pairs:
                a, b = sorted(pair, key=lambda s: s.expr())
                self.guards.expression(f"{a.expr()} is not {b.expr()}",
                                       f"{a.pretty()} is not {b.pretty()}")

    # --- graph ops -----------------------------------------------------------------
    def op(self, kind: str, target, args, kwargs) -> V.Value:
        """Record ``target(*args, **kwargs)`` in the graph; return the result's Value."""
        if "minmax_nodes" in self.__dict__:  # max()/min() of tensors: eager's result is an operand
            V.rules.check_write(self, target, args, kwargs)
        rg = kwargs.get("requires_grad")
        if not (rg is None or isinstance(rg, V.ConstantValue) and rg.value is False):
            # a new leaf of the user's autograd graph: graph outputs are never leaves
            raise Unsupported("K0039", f"{_target_name(target)}(requires_grad=...) inside a compiled region")
        amp = self.autocast
        if amp.state.any_enabled and not amp.bypass:  # autocast's casts as nodes of their own
            try:
                args, kwargs = amp.explicit_call(self, kind, target, args, kwargs)
            except Unsupported as e:    # a cast inside a composite: its parts, if known
                parts = autocast_composites.rewrite(self, kind, target, args, kwargs) \
                    if e.break_id == "K0034" else None
                if parts is None:
                    raise
                return parts
        fake_args = [_to_fake(a) for a in args]
        fake_kwargs = {k: _to_fake(v) for k, v in kwargs.items()}
        try:
            with torch.set_grad_enabled(self.grad_enabled), FakeMode():
                if kind == "call_method":
                    out = call_on_fakes(getattr(fake_args[0], target), fake_args[1:], fake_kwargs)
                else:
                    out = call_on_fakes(target, fake_args, fake_kwargs)
        except (DataDependent, NoMetaKernel) as e:
            raise Unsupported("K0008", str(e))
        except (Unsupported, InternalError):
            raise
        except Exception as e:  # noqa: BLE001 -- the op's (or a user Function's) own error
            msg = str(e)
            if "meta" in msg or "fake" in msg.lower() or "Cannot copy out" in msg:
                raise Unsupported("K0008", f"{_target_name(target)}: {msg.splitlines()[0]}")
            # raised on fake tensors: whether the real op raises, and its message, are
            # eager's to say (uncaught, the frame re-runs eagerly; caught, it breaks)
            raise UserException(V.ExceptionValue.of_real(e), from_fake=True)
        node_args = tuple(_to_arg(a) for a in args)
        node_kwargs = {k: _to_arg(v) for k, v in kwargs.items()}
        if _has_class((node_args, node_kwargs)):  # an FX graph cannot print a class argument
            raise Unsupported("K0042", f"{_target_name(target)} with a class as argument")
        node = self.graph.create_node(kind, target, node_args, node_kwargs)
        fr = self.active_frame
        if fr is not None and fr.inst is not None:
            node.meta["kiln_user_line"] = (fr.code.co_filename, fr.inst.line, fr.code.co_name)
        self._unwind_modes.add(self.grad_blocks[0] if self.grad_blocks else self.grad_enabled)
        amp.note_op()
        result = self._wrap_result(out, node)
        if not node.users and out is not None and not _has_tensor(out):
            # a metadata query answered at trace time (mutating ops return None or a
            # tensor and always keep their node)
            self.graph.erase_node(node)
        return result

    def _wrap_result(self, out, node):
        if isinstance(out, (torch.SymInt, torch.SymFloat)):
            node.meta["example_value"] = out
            return V.SymIntValue(node, out)
        if isinstance(out, FakeTensor):
            known = self._value_by_fake.get(id(out))
            if known is not None:  # an in-place op returned its input
                return known
            node.meta["example_value"] = out
            tv = V.TensorValue(node, out)
            self._value_by_fake[id(out)] = tv
            return tv
        if isinstance(out, (tuple, list)) and _has_tensor(out):
            items = []
            for i, o in enumerate(out):
                if isinstance(o, FakeTensor):
                    n = self.graph.create_node("call_function", operator.getitem, (node, i))
                    items.append(self._wrap_result(o, n))
                elif isinstance(o, (torch.SymInt, torch.SymFloat)):
                    n = self.graph.create_node("call_function", operator.getitem, (node, i))
                    n.meta["example_value"] = o
                    items.append(V.SymIntValue(n, o))
                else:
                    items.append(_static(V.rules.concrete(o)))
            if hasattr(type(out), "n_fields") or hasattr(type(out), "_fields"):
                nt = V.NamedTupleValue(type(out), items)
                nt.fields = _struct_fields(out)
                return nt
            return V.TupleValue(items) if isinstance(out, tuple) else V.ListValue(items)
        if _has_tensor(out):
            raise Unsupported("K0042", f"an op returning {type(out).__qualname__} of tensors")
        return _static(V.rules.concrete(out))

    def enter_grad_block(self, prev: bool, enabled: bool):
        self.grad_blocks.append(prev)
        self.set_grad_enabled(enabled)

    def exit_grad_block(self, prev: bool):
        if self.grad_blocks:
            self.grad_blocks.pop()
        self.set_grad_enabled(prev)

    def grad_mode_on_error(self):
        """The grad mode to restore when the graph raises (eager unwinds the grad-mode
        with-blocks around the failing op), or None where every backend leaves the right
        one: the graph changes no mode and runs inside no block opened before it."""
        changes = any(n.target is torch._C._set_grad_enabled for n in self.graph.nodes)
        modes = self._unwind_modes
        if not changes and modes <= {self.entry_grad_enabled}:
            return None
        return next(iter(modes)) if len(modes) == 1 else self.entry_grad_enabled

    def set_grad_enabled(self, enabled: bool):
        if enabled != self.grad_enabled:
            self.graph.create_node("call_function", torch._C._set_grad_enabled, (enabled,))
        self.grad_enabled = enabled

    def op_count(self) -> int:
        return sum(1 for n in self.graph.nodes
                   if n.op in ("call_function", "call_method", "call_module")
                   and n.target is not torch._C._set_grad_enabled)


def _static(o):
    from kiln.capture.builder import wrap_static

    return wrap_static(o)


def _struct_fields(out):
    f = getattr(type(out), "_fields", None)
    if f:
        return tuple(f)
    names = [n for n in dir(out) if not n.startswith("_") and n not in ("count", "index", "n_fields", "n_sequence_fields", "n_unnamed_fields")]
    by_val = []
    for n in names:
        try:
            v = getattr(out, n)
        except Exception:
            continue
        for i, o in enumerate(out):
            if o is v:
                by_val.append((i, n))
    return tuple(n for _, n in sorted(by_val))


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_tensor(i) for i in x)
    if isinstance(x, dict):
        return any(_has_tensor(i) for i in x.values())
    return False


def _has_class(x) -> bool:
    if isinstance(x, type):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_class(i) for i in x)
    if isinstance(x, dict):
        return any(_has_class(i) for i in x.values())
    return False


def _geometry(t):
    return tuple(t.shape), t.stride(), t.storage_offset()


def _target_name(t):
    return t if isinstance(t, str) else getattr(t, "__name__", repr(t))


def _unwrap(v, tensor):
    """The Python value a PyTorch op receives for ``v``: ``tensor(v)`` for each tensor
    (its fake for propagation, its node for the graph), containers rebuilt around them."""
    if isinstance(v, (V.TensorValue, V.SymIntValue)):
        return tensor(v)
    if isinstance(v, V.ConstantValue):
        return v.value
    if isinstance(v, V.TupleValue):  # named tuples too: ops take them as plain tuples
        return tuple(_unwrap(i, tensor) for i in v.items)
    if isinstance(v, V.ListValue):
        return [_unwrap(i, tensor) for i in v.items]
    if isinstance(v, V.DictValue):
        return {k: _unwrap(i, tensor) for k, i in v.items.items()}
    if isinstance(v, V.SymSliceValue):
        return slice(*(_unwrap(p, tensor) for p in v.parts))
    if isinstance(v, V.ClassValue):
        return v.cls
    if isinstance(v, V.TorchFunctionValue):
        return v.fn
    if isinstance(v, V.SetValue):
        return set(v.items)
    raise Unsupported("K0042", f"passing {v} to a PyTorch op")


@V.rule(name="to_fake")
def _to_fake(v):
    return _unwrap(v, lambda t: t.fake)


def _to_arg(v):
    return _unwrap(v, lambda t: t.node)


del tree_map
