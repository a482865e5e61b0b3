"""Aten FX graph → loop IR: one lowering per aten op, registered in ``LOWERINGS``.

Values during lowering are *boxes*:

* ``View``  — a strided window on a buffer (inputs, computed buffers, extern results);
  every view op on it is new strides, never a copy;
* ``Lazy``  — a not-yet-stored pointwise value, a function from an index to an
  expression. Pointwise ops compose lazies, which *is* vertical fusion of pointwise
  chains; reductions inline them into their bodies (pointwise-into-reduction fusion).

A lazy is stored (``realize``) when several nodes use it (unless each is better off
computing it again: ``recompute.py``), when it is an output, when it grows large, or
before a reshape that strides cannot express. Any op without a
lowering (or with one that declines, by raising ``Unsupported``) becomes an ``Extern``:
the aten op itself, called at run time — logged under ``fallbacks`` — so every graph
runs.
"""

from __future__ import annotations

import operator
import os

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ... import fast_tree
from ...debug.breaks import tag
from ...debug.logs import log_for
from .. import ir
from ...dispatch_mode import spare_compiler_import
from ..devices import same_device, graph_device
from ..ir import loop_vars
from ..ops import cast, op
from ...ops import is_library_call
from . import recompute
from .host_scalars import (device_side, is_host_scalar, lower_stacked,
                           on_device as host_scalars_on_device, takes_host_values)
from .operand_layout import store_for_library
from .reindex import Reshaped
from .base import LAZY_LISTS, LOWERINGS, Lazy, STORAGE_OPS, Unsupported, View, is_box, is_dense, returns_a_view

aten = torch.ops.aten
#: views the meta recorder takes as reshapes where the input's layout refuses them
#: (``GraphLowering._run_recorder``)
_VIEWS_AS_RESHAPES = frozenset({aten.view.default, aten._unsafe_view.default})


def _functional(gm: fx.GraphModule) -> bool:
    """No op of ``gm`` writes into an argument (a functionalized graph, as autograd's
    are): a view's memory is then unobservable, and a reshape gives the same values."""
    return not any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                   and n.target._schema.is_mutable for n in gm.graph.nodes)


_fallback_log = log_for("fallbacks")

#: ops that read only their argument's shape, dtype and device: not a reason to store
#: a lazy value (nll_loss's backward makes its zeros with full_like(log_softmax))
_SHAPE_ONLY = recompute.SHAPE_ONLY

#: library calls whose result's layout does not follow their operands' (a matrix
#: product's result is contiguous whatever its operands' strides): an operand that is a
#: window on a stored buffer is passed as that window, not copied first
_READS_ANY_LAYOUT = frozenset({aten.mm.default, aten.bmm.default, aten.addmm.default,
                               aten.baddbmm.default})

SUPPORTED_DTYPES = {
    "cpp": {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16,
            torch.int8, torch.uint8, torch.bool},
    "triton": {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool},
}
MAX_INLINE_OPS = 96
#: a value several ops read is computed again by each when every buffer it reads has at
#: most 1/READ_LITTLE of its elements (``GraphLowering._reads_little``)
READ_LITTLE = 16
class ConstantTensor:
    """The "library call" that yields a module constant (a get_attr tensor)."""

    def __init__(self, value):
        self.value = value

    def __call__(self):
        return self.value

    def __repr__(self):
        return f"constant{tuple(self.value.shape)}"


def _to_meta(t):
    if isinstance(t, torch.Tensor) and t.device.type != "meta":
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def _device_of(node: fx.Node, meta: dict) -> torch.device:
    """The device eager would put ``node``'s result on: its ``device=`` argument, else
    that of its tensor arguments (a 0-d CPU tensor beside a CUDA one does not count),
    else the CPU."""
    given = node.kwargs.get("device")
    if given is not None:
        d = torch.device(given)
        if d.type == "cuda" and d.index is None:    # "cuda": the current device, by index
            d = torch.device("cuda", torch.cuda.current_device())
        return d
    for a in node.all_input_nodes:
        for d in fast_tree.leaves(meta.get((a, "device"))):
            if isinstance(d, torch.device) and d.type != "cpu":
                return d
    return torch.device("cpu")


class StorageLayoutError(RuntimeError):
    """A storage-addressing op (``as_strided``) on a value whose eager storage the kernel
    compiler cannot reproduce: compiling fails loudly (the frame then runs eagerly
    unless errors are not suppressed) instead of reading the wrong elements."""


#: Ops whose result depends on where their first argument's elements lie in its


class GraphLowering:
    """Walks an aten graph, lowering each node, and collects the buffers."""

    def __init__(self, gm: fx.GraphModule, example_inputs, target: str = "cpp"):
        self.gm = gm
        self.target = target
        self.buffers: list[ir.Buffer] = []
        self.by_name: dict[str, ir.Buffer] = {}
        self.env: dict[fx.Node, object] = {}
        self.meta: dict[fx.Node, object] = {}
        self.outputs = None            # pytree of boxes / python values
        self.fallbacks: list[str] = []
        self.fallback_messages: list[tuple] = []     # (op, reason), re-logged on cache hits
        self.relaid: set = set()       # buffers whose layout differs from eager's
        self.pinned: set = set()       # buffers an extern's result aliases (own memory slot)
        from .outputs import output_roots, user_outputs
        self.visible_outputs = set(user_outputs(gm))
        self.out_roots = output_roots(gm)    # stored in eager's layout (outputs)
        self.root_views: dict = {}     # output root node -> its View in eager's layout
        self.rooted: dict = {}         # buffer -> the output root it holds
        self.device = graph_device(example_inputs)
        self.host_copies: dict = {}    # CPU scalar node -> its View on the device (host_scalars)
        self.device_side: set = set()  # CPU scalar nodes computed on the device (host_scalars)
        self.host_values = False       # the graph takes CPU tensors (host_scalars)
        self._infos: dict = {}         # node -> (dtypes supported, on the device): _value_info
        self._n = 0
        self._record_meta(example_inputs)

    # example values for every node: sizes, strides and dtypes as eager produces them
    def _record_meta(self, example_inputs):
        """Sizes, strides, dtypes and devices of every node, as meta tensors.

        Cheapest first: the values the autograd stage recorded while tracing (when the
        inputs are laid out as traced); else the graph run on meta tensors; else — an op
        without a meta kernel, or one that needs real data — the graph run for real.
        Running it for real on a GPU costs the library set-up and kernel loads of ops
        kiln then never calls (0.5 s for resnet18), and consumes random numbers."""
        if self._meta_from_trace(example_inputs):
            return
        spare_compiler_import()
        try:
            self._run_recorder([_to_meta(t) for t in example_inputs],
                               [t.device if isinstance(t, torch.Tensor) else None
                                for t in example_inputs])
            return
        except Exception:          # noqa: BLE001  (no meta kernel, data-dependent op)
            self.meta.clear()
        self._run_recorder(example_inputs, None)

    def _meta_from_trace(self, example_inputs) -> bool:
        nodes = list(self.gm.graph.nodes)
        vals = {}
        for n in nodes:
            if n.op == "output":
                continue
            if "val" not in n.meta or "device" not in n.meta:
                return False
            v = n.meta["val"]
            for t in _leaves(v):
                if isinstance(t, torch.Tensor):
                    if t.device.type != "meta":
                        return False
                elif not isinstance(t, (int, float, bool, type(None))):
                    return False
            vals[n] = v
        inputs = iter(example_inputs)
        for n in nodes:
            if n.op != "placeholder":
                continue
            t, v = next(inputs, None), vals[n]
            if isinstance(t, torch.Tensor) != isinstance(v, torch.Tensor):
                return False
            if isinstance(t, torch.Tensor):
                if (t.shape, t.stride(), t.dtype) != (v.shape, v.stride(), v.dtype):
                    return False
                if t.device != n.meta["device"]:
                    return False
            elif t != v:
                return False
        for n, v in vals.items():
            dev = n.meta["device"]
            self.meta[n] = v
            self.meta[n, "device"] = dev if type(v) is torch.Tensor else fast_tree.tree_map(
                lambda t: dev if isinstance(t, torch.Tensor) else None, v)
        return True

    def _run_recorder(self, inputs, devices):
        """Run the graph on ``inputs`` recording each node's value as a meta tensor;
        ``devices``: the real devices of meta ``inputs`` (None: the inputs are real)."""
        meta = self.meta

        class Recorder(fx.Interpreter):
            def call_function(self, target, args, kwargs):
                try:
                    return super().call_function(target, args, kwargs)
                except RuntimeError:
                    if target not in _VIEWS_AS_RESHAPES or not _functional(self.module):
                        raise
                    # a view the traced layout allowed and an input's layout here does
                    # not (a saved activation kiln stored in a layout of its own: the
                    # backward's ``view``s were traced on eager's): the same values as a
                    # reshape, which the lowering of ``view`` makes too (``shapes._view``)
                    return aten.reshape.default(*args, **kwargs)

            def run_node(self, n):
                r = super().run_node(n)
                meta[n] = fast_tree.tree_map(_to_meta, r)
                if devices is None or n.op == "get_attr":   # a module constant is real
                    dev = fast_tree.tree_map(
                        lambda t: t.device if isinstance(t, torch.Tensor) else None, r)
                elif n.op == "placeholder":
                    d = devices[self._n_in]
                    self._n_in += 1
                    dev = d
                else:
                    d = _device_of(n, meta)
                    dev = fast_tree.tree_map(lambda t: d if isinstance(t, torch.Tensor) else None, r)
                meta[n, "device"] = dev
                return r

        rec = Recorder(self.gm)
        rec._n_in = 0
        with torch.no_grad():
            rec.run(*inputs)

    def new_name(self, prefix="buf") -> str:
        self._n += 1
        return f"{prefix}{self._n - 1}"

    def add(self, b: ir.Buffer) -> ir.Buffer:
        self.buffers.append(b)
        self.by_name[b.name] = b
        return b

    # --- storing lazies ---
    def realize(self, box, strides=None, origin="") -> View:
        if isinstance(box, View):
            return box
        if strides is None and isinstance(box, Reshaped):
            return box.view_of(self.realize(box.source, origin=origin))
        sizes = tuple(box.sizes)
        if strides is None and box.layout is not None:
            strides = box.layout
        strides = tuple(strides) if strides is not None else ir.contiguous_strides(sizes)
        body = box.load(loop_vars(sizes))
        if body.dtype != box.dtype:
            body = cast(body, box.dtype)
        b = self.add(ir.Pointwise(self.new_name(), sizes, strides, box.dtype, body=body,
                                  origin=origin))
        if box.layout is not None and strides == tuple(box.layout):
            self.relaid.add(b.name)
        return View(b.name, sizes, strides, 0, box.dtype)

    def _as_view(self, box):
        """``box`` as a window on a stored buffer, if it is one: a lazy that reads one
        buffer element for element (what view ops leave: a transposed, sliced or
        strided read, dtype round trips folded by ``cast``). A library call that reads
        any layout takes that window in place of a stored copy. None otherwise."""
        if isinstance(box, View):
            return box
        sizes = tuple(int(s) for s in box.sizes)
        idx = loop_vars(sizes)
        e = box.load(idx)
        if not isinstance(e, ir.Load) or e.mask is not None or e.gather or \
                e.dtype != box.dtype or e.buf not in self.by_name or e.index.const < 0:
            return None
        names = [None if int(s) == 1 else i.terms[0][0] for s, i in zip(sizes, idx)]
        if e.index.vars() - {n for n in names if n}:
            return None
        contiguous = ir.contiguous_strides(sizes)
        strides = tuple(c if n is None else e.index.coef(n) for n, c in zip(names, contiguous))
        if any(st < 0 for st in strides):
            return None
        return View(e.buf, sizes, strides, e.index.const, box.dtype)

    # --- the walk ---
    def run(self):
        from .outputs import lower_outputs, own_eager_layout
        self.host_values = takes_host_values(self, self.gm)
        self.device_side = device_side(self, self.gm)
        n_in = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, n_in)
                n_in += 1
            elif node.op == "call_function":
                self.env[node] = self._call(node)
                if node in self.out_roots:
                    self.env[node] = own_eager_layout(self, node, self.env[node])
            elif node.op == "output":
                self.outputs = lower_outputs(self, node)
            elif node.op == "get_attr":
                self.env[node] = self._get_attr(node)
            else:
                raise Unsupported("K0205", f"unexpected node {node.op}")
        return self

    def _placeholder(self, node, pos):
        m = self.meta[node]
        if not isinstance(m, torch.Tensor):
            return m
        name = f"in{pos}"
        self.add(ir.Input(name, tuple(m.shape), tuple(m.stride()), m.dtype, position=pos))
        return View(name, tuple(m.shape), tuple(m.stride()), 0, m.dtype)

    def _get_attr(self, node):
        """A constant of the module: tensors become a buffer the runtime fetches."""
        val = self.gm
        for a in node.target.split("."):
            val = getattr(val, a)
        if not isinstance(val, torch.Tensor):
            return val
        name = self.new_name()
        self.add(ir.Extern(name, tuple(val.shape), tuple(val.stride()), val.dtype,
                           op=ConstantTensor(val), origin=node.name))
        return View(name, tuple(val.shape), tuple(val.stride()), 0, val.dtype)

    def _args(self, node):
        env, kwargs = self.env, node.kwargs
        # most nodes: flat positional arguments (nodes and scalars), no keywords
        args = tuple(env[a] if type(a) is fx.Node else
                     a if type(a) in _FLAT else _map_nodes(a, env) for a in node.args)
        return args, (_map_nodes(kwargs, env) if kwargs else kwargs)

    def _dtypes_ok(self, node) -> bool:
        inputs = node.all_input_nodes
        if not all(self._value_info(x)[0] for x in [node] + inputs):
            return False
        if node not in self.device_side and not self._value_info(node)[1]:
            return False
        meta, device = self.meta, self.device
        for a in inputs:                      # a CPU scalar is copied over (host_scalars)
            if self._value_info(a)[1]:
                continue
            for d, t in zip(_leaves(meta[a, "device"]), _leaves(meta[a])):
                if d is not None and not same_device(d, device) \
                        and not is_host_scalar(self, d, t, node, a):
                    return False
        return True

    def _value_info(self, x) -> tuple:
        """(every tensor of ``x``'s value of a dtype the target supports, every device
        of it the graph's): per node, once — ``_dtypes_ok`` asks of each node and again
        of it as every user's input."""
        info = self._infos.get(x)
        if info is None:
            ok, device = SUPPORTED_DTYPES[self.target], self.device
            info = (all(t.dtype in ok for t in _leaves(self.meta[x]) if isinstance(t, torch.Tensor)),
                    all(d is device or same_device(d, device)
                        for d in _leaves(self.meta[x, "device"]) if d is not None))
            self._infos[x] = info
        return info

    def _call(self, node):
        args, kwargs = self._args(node)
        fn = LOWERINGS.get(node.target)
        if node.target is operator.getitem:
            out = args[0][args[1]]
            src = node.args[0]
            if getattr(src, "target", None) in LAZY_LISTS and isinstance(out, Lazy):
                return self._maybe_realize(node, out)
            return out
        stacked = lower_stacked(self, node)       # values only device kernels read
        if stacked is not None:
            return stacked
        if fn is not None and self._dtypes_ok(node):
            try:
                a, kw = host_scalars_on_device(self, node, args, kwargs)
                out = fn(self, node, *a, **kw)
                self._check_target_ops(out)
                return self._maybe_realize(node, out)
            except Unsupported as e:
                reason = tag(e.break_id, f"lowering declined: {e.reason}")
        else:
            reason = tag("K0204", "no lowering") if fn is None else tag("K0205", "dtype/device not supported")
        return self.fallback(node, args, kwargs, reason)

    def _check_target_ops(self, out):
        """Decline ops the chosen code generator cannot run here (libdevice-only math
        under Triton's interpreter)."""
        if self.target != "triton":
            return
        interp = self.__dict__.get("_interpreting")     # read once per graph
        if interp is None:
            interp = self._interpreting = os.environ.get("TRITON_INTERPRET") == "1"
        if not interp:
            return
        from ..codegen.triton.prelude import LIBDEVICE_ONLY
        for o in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(o, Lazy):
                for e in ir.walk(o.load(loop_vars(o.sizes))):
                    if isinstance(e, ir.Op) and e.name in LIBDEVICE_ONLY:
                        raise Unsupported("K0209", f"{e.name} needs libdevice, absent in the interpreter")

    def _maybe_realize(self, node, out):
        if isinstance(out, (tuple, list)):
            if node.target in LAZY_LISTS:      # each element's getitem decides
                return out
            return type(out)(self.realize(o, origin=node.name) if isinstance(o, Lazy) else o
                             for o in out)
        if isinstance(out, Lazy) and node not in self.out_roots:  # (stored in eager's layout)
            probe = out.load(loop_vars(out.sizes))
            too_many, some = ir.ops_exceed(probe, MAX_INLINE_OPS)
            readers = sum(1 for u in node.users if u.target not in _SHAPE_ONLY)
            if too_many or (readers > 1 and some and not self._reads_little(probe, out.sizes)
                            and recompute.store_reason(self, node, out, probe)):
                if all(u.target in _READS_ANY_LAYOUT for u in node.users):
                    return (store_for_library(self, out, node.name)
                            or self.realize(out, origin=node.name))
                return self.realize(out, origin=node.name)
        return out

    def _reads_little(self, e, sizes) -> bool:
        """Does ``e`` read only buffers far smaller than its own iteration space (a
        per-row index, a scalar)? Then each reader computes it again rather than have it
        stored: recomputing rereads next to nothing, and storing it costs a buffer of
        the full size (nll_loss's one-hot gradient: one of the logits' size)."""
        numel = ir.numel_of(sizes)
        for name in ir.loaded_buffers(e):
            b = self.by_name.get(name)
            if b is None or b.numel * READ_LITTLE > numel:
                return False
        return True

    def fallback(self, node, args, kwargs, reason):
        if not is_library_call(node.target):      # kiln/ops: an extern on purpose
            self.fallbacks.append(f"{node.target}")
            self.fallback_messages.append((f"{node.target}", reason))
            _fallback_log.info("kernels: %s falls back to aten (%s)", node.target, reason)

        reads_any_layout = node.target in _READS_ANY_LAYOUT

        def to_arg(a):
            if is_box(a):
                v = (reads_any_layout and (self._as_view(a)
                                           or store_for_library(self, a, node.name))) \
                    or self.realize(a, origin=node.name)
                return ir.ExternArg(v.buf, v.sizes, v.strides, v.offset)
            return a
        if node.target in STORAGE_OPS and args and is_box(args[0]):
            args = (self._in_eager_storage(node, args[0]),) + tuple(args[1:])
        args, kwargs = fast_tree.tree_map(to_arg, (args, kwargs))   # (boxes are leaves)
        if returns_a_view(node.target):
            # the result shares its argument's memory: that buffer must not be handed
            # to another buffer once its last direct reader is done
            for a in fast_tree.leaves((args, kwargs)):
                if isinstance(a, ir.ExternArg) and isinstance(
                        self.by_name.get(a.buf), (ir.Pointwise, ir.Reduction)):
                    self.pinned.add(a.buf)
        m = self.meta[node]
        relaid = [a for a in fast_tree.leaves((args, kwargs)) if isinstance(a, ir.ExternArg)
                  and a.buf in self.relaid]
        if relaid and isinstance(m, torch.Tensor):
            m2 = self._meta_run(node.target, args, kwargs)
            if isinstance(m2, torch.Tensor) and m2.shape == m.shape and m2.dtype == m.dtype:
                m = m2
        elif relaid and isinstance(m, (tuple, list)):
            m2 = self._meta_run(node.target, args, kwargs)
            if isinstance(m2, (tuple, list)) and len(m2) == len(m) and all(
                    not isinstance(a, torch.Tensor) or (isinstance(b, torch.Tensor)
                                                       and a.shape == b.shape)
                    for a, b in zip(m, m2)):
                m = type(m)(m2)
        name = self.new_name()
        if isinstance(m, torch.Tensor):
            self.add(ir.Extern(name, tuple(m.shape), tuple(m.stride()), m.dtype, op=node.target,
                               args=args, kwargs=kwargs, origin=node.name))
            if relaid and m.stride() != self.meta[node].stride():
                self.relaid.add(name)
            return View(name, tuple(m.shape), tuple(m.stride()), 0, m.dtype)
        ext = self.add(ir.Extern(name, (), (), torch.uint8, op=node.target, args=args,
                                 kwargs=kwargs, origin=node.name))
        leaves, spec = pytree.tree_flatten(m)
        outs = []
        for i, t in enumerate(leaves):
            if isinstance(t, torch.Tensor):
                o = self.add(ir.MultiOutput(self.new_name(), tuple(t.shape), tuple(t.stride()),
                                            t.dtype, source=name, path=(i,)))
                ext.outputs.append(o.name)
                if relaid:
                    self.relaid.add(o.name)
                outs.append(View(o.name, tuple(t.shape), tuple(t.stride()), 0, t.dtype))
            else:
                outs.append(t)
        return pytree.tree_unflatten(outs, spec)

    def _in_eager_storage(self, node, box):
        """``box`` laid out in memory exactly as eager's tensor is in its storage — what
        an op that addresses the storage (``as_strided``) reads. A graph input is the
        caller's own tensor. A computed value is stored at eager's strides, which is
        its whole storage only when eager's tensor starts its storage and fills it;
        anything else cannot be reproduced, and is an error rather than a wrong read."""
        if isinstance(box, View) and isinstance(self.by_name.get(box.buf), ir.Input):
            return box
        m = self.meta.get(node.args[0]) if isinstance(node.args[0], fx.Node) else None
        itemsize = torch.empty((), dtype=box.dtype).element_size()
        if (not isinstance(m, torch.Tensor) or m.storage_offset() != 0 or not is_dense(m)
                or m.untyped_storage().nbytes() != m.numel() * itemsize):
            raise StorageLayoutError(
                f"kiln: {node.target} ({node.name}) addresses the storage of a tensor "
                "that is a view into a larger one; the kernel compiler cannot reproduce "
                "that storage")
        strides = tuple(m.stride())
        if isinstance(box, View) and box.offset == 0 and tuple(box.strides) == strides:
            return box
        lazy = box if isinstance(box, Lazy) else Lazy(box.sizes, box.dtype, box.load)
        return self.realize(Lazy(lazy.sizes, lazy.dtype, lazy.fn), strides=strides,
                            origin=node.name)

    def _meta_run(self, op, args, kwargs):
        """The op on meta tensors laid out as its arguments will be (output strides).
        Remembered by what it depends on (the op, each argument's sizes, strides and
        dtype, the other arguments): a network's repeated blocks, and every size of a
        symbolic graph, ask again for the same convolutions."""
        try:
            key = (op, _frozen((args, kwargs), self.by_name))
            hit = _META_RUNS.get(key, _MISS)
        except TypeError:                     # an argument that does not hash
            return self._meta_run_now(op, args, kwargs)
        if hit is _MISS:
            hit = _META_RUNS[key] = self._meta_run_now(op, args, kwargs)
            if len(_META_RUNS) > _META_RUNS_MAX:
                del _META_RUNS[next(iter(_META_RUNS))]
        return hit

    def _meta_run_now(self, op, args, kwargs):
        def meta(a):
            if isinstance(a, ir.ExternArg):
                return torch.empty_strided(a.sizes, a.strides, dtype=self.by_name[a.buf].dtype,
                                           device="meta")
            return a
        try:
            margs, mkw = pytree.tree_map(meta, (args, kwargs),
                                         is_leaf=lambda x: isinstance(x, ir.ExternArg))
            return op(*margs, **mkw)
        except Exception:        # noqa: BLE001  (no meta kernel: keep eager's layout)
            return None

    # --- helpers for lowerings ---
    def out_meta(self, node) -> torch.Tensor:
        return self.meta[node]


#: ``GraphLowering._meta_run``'s results (meta tensors, read for their layout only), by
#: op and arguments, the oldest dropped past the bound
_META_RUNS: dict = {}
_META_RUNS_MAX = 4096
_MISS = object()


def _frozen(x, by_name):
    """``x`` (an op's arguments) as a hashable key: an ``ExternArg`` by its layout and
    its buffer's dtype (all a meta run sees of it), containers as tuples."""
    if isinstance(x, ir.ExternArg):
        return ("arg", tuple(x.sizes), tuple(x.strides), by_name[x.buf].dtype)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_frozen(a, by_name) for a in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, _frozen(v, by_name)) for k, v in x.items())
    if isinstance(x, torch.Tensor):
        raise TypeError("a tensor argument")
    hash(x)
    return (type(x).__name__, x)


#: argument types ``_args`` passes through as they are (no nodes inside)
_FLAT = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device,
                   torch.layout, torch.memory_format})


def _leaves(x):
    """``fast_tree.leaves(x)``, a lone tensor or device without the walk (most nodes'
    values: ``_dtypes_ok`` asks for every node and its inputs)."""
    t = type(x)
    if t is torch.Tensor or t is torch.device or x is None:
        return (x,)
    return fast_tree.leaves(x)


def _map_nodes(x, env):
    """``x`` with every fx.Node replaced by its value in ``env``."""
    return fast_tree.tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, x)
