"""Aten FX graph → loop IR: one lowering per aten op, registered in ``LOWERINGS``.

Values during lowering are *boxes*:

* ``View``  — a strided window on a buffer (inputs, computed buffers, extern results);
  every view op on it is new strides, never a copy;
* ``Lazy``  — a not-yet-stored pointwise value, a function from an index to an
  expression. Pointwise ops compose lazies, which *is* vertical fusion of pointwise
  chains; reductions inline them into their bodies (pointwise-into-reduction fusion).

A lazy is stored (``realize``) when several nodes use it, when it is an output, when it
grows large, or before a reshape that strides cannot express. Any op without a
lowering (or with one that declines, by raising ``Unsupported``) becomes an ``Extern``:
the aten op itself, called at run time — logged under ``fallbacks`` — so every graph
runs.
"""
from __future__ import annotations

import math
import operator
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ... import config
from ...debug.breaks import split_id, tag
from ...debug.logs import log_for
from .. import ir
from ...dispatch_mode import spare_compiler_import
from ..devices import same_device, graph_device
from ..ir import Affine, Const, Index, Load, linear_index, loop_vars
from ..ops import cast, const, op

aten = torch.ops.aten
_fallback_log = log_for("fallbacks")

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
#: Ops that are meant to be library calls (BLAS, oneDNN, cuDNN, flash attention): they
#: run as externs without being reported as fallbacks.
LIBRARY_CALLS = {
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten.scaled_dot_product_attention.default,
    aten._native_multi_head_attention.default,
}


def _kiln_library_op(target) -> bool:
    """kiln's own library ops (``kiln.sdpa``, ``kiln.sdpa_backward``: attention run by
    PyTorch's fused kernels, ``kiln/autograd/sdpa.py``) are library calls too."""
    return getattr(target, "namespace", None) == "kiln"


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
        for d in pytree.tree_leaves(meta.get((a, "device"))):
            if isinstance(d, torch.device) and d.type != "cpu":
                return d
    return torch.device("cpu")


class Unsupported(Exception):
    """Raised by a lowering that cannot handle these arguments: the node falls back
    (runs as the aten op). ``Unsupported("K0205", "why")``: the first argument is the
    reason's ID in kiln/debug/breaks.py (``break_id``)."""

    def __init__(self, *args):
        self.break_id, (msg,) = split_id(args)
        super().__init__(msg)
        self.reason = msg


def _returns_a_view(op) -> bool:
    """Whether an aten op's result may share memory with an argument (``Tensor(a)`` in
    its schema: as_strided, alias, unfold, ...)."""
    schema = getattr(op, "_schema", None)
    return schema is not None and any(r.alias_info is not None and not r.alias_info.is_write
                                      for r in schema.returns)


class StorageLayoutError(RuntimeError):
    """A storage-addressing op (``as_strided``) on a value whose eager storage the kernel
    compiler cannot reproduce: compiling fails loudly (the frame then runs eagerly
    unless errors are not suppressed) instead of reading the wrong elements."""


#: Ops whose result depends on where their first argument's elements lie in its
#: storage, not only on its values: they get it in eager's exact layout.
STORAGE_OPS = {aten.as_strided.default, aten.as_strided_scatter.default}


# --- boxes --------------------------------------------------------------------------
@dataclass
class View:
    buf: str
    sizes: tuple
    strides: tuple
    offset: int
    dtype: torch.dtype

    def load(self, idx: list) -> ir.Expr:
        return Load(self.buf, linear_index(idx, self.strides) + self.offset, self.dtype)


@dataclass
class Lazy:
    sizes: tuple
    dtype: torch.dtype
    fn: Callable
    #: strides to store it with when realized (None: contiguous); pointwise results
    #: follow a channels-last operand so that convolution chains stay channels-last
    layout: tuple | None = None

    def load(self, idx: list) -> ir.Expr:
        return self.fn(idx)


Box = (View, Lazy)


def is_box(x) -> bool:
    return isinstance(x, Box)


def add_mask(e: ir.Expr, mask: ir.Expr, keep=frozenset()) -> ir.Expr:
    """The same expression with every load guarded by ``mask`` (for cat and pad), but
    for the loads in ``keep`` (known to be in bounds wherever ``e`` is evaluated)."""
    memo = {}

    def go(x):
        if x in memo:
            return memo[x]
        if x in keep:
            r = x
        elif isinstance(x, Load):
            m = mask if x.mask is None else op("and", x.mask, mask)
            r = Load(x.buf, x.index, x.dtype, m, x.gather)
        elif isinstance(x, ir.Op):
            r = ir.Op(x.name, tuple(go(a) for a in x.args), x.dtype)
        else:
            r = x
        memo[x] = r
        return r
    return go(e)


# --- the lowering table ---------------------------------------------------------------
LOWERINGS: dict = {}


def register(*targets):
    def deco(fn):
        for t in targets:
            LOWERINGS[t] = fn
        return fn
    return deco


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
        self.out_roots = output_roots(gm)    # stored in eager's layout (lowering_outputs)
        self.root_views: dict = {}     # output root node -> its View in eager's layout
        self.rooted: dict = {}         # buffer -> the output root it holds
        self.device = graph_device(example_inputs)
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
            if not all(isinstance(t, (torch.Tensor, int, float, bool, type(None)))
                       for t in pytree.tree_leaves(v)):
                return False
            if any(isinstance(t, torch.Tensor) and t.device.type != "meta"
                   for t in pytree.tree_leaves(v)):
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
            self.meta[n, "device"] = pytree.tree_map(
                lambda t: dev if isinstance(t, torch.Tensor) else None, v)
        return True

    def _run_recorder(self, inputs, devices):
        """Run the graph on ``inputs`` recording each node's value as a meta tensor;
        ``devices``: the real devices of meta ``inputs`` (None: the inputs are real)."""
        meta = self.meta

        class Recorder(fx.Interpreter):
            def run_node(self, n):
                r = super().run_node(n)
                meta[n] = pytree.tree_map(_to_meta, r)
                if devices is None or n.op == "get_attr":   # a module constant is real
                    dev = pytree.tree_map(
                        lambda t: t.device if isinstance(t, torch.Tensor) else None, r)
                elif n.op == "placeholder":
                    d = devices[self._n_in]
                    self._n_in += 1
                    dev = d
                else:
                    d = _device_of(n, meta)
                    dev = pytree.tree_map(lambda t: d if isinstance(t, torch.Tensor) else None, r)
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

    # --- the walk ---
    def run(self):
        from .outputs import lower_outputs, own_eager_layout
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
        return pytree.tree_map(lambda a: self.env[a] if isinstance(a, fx.Node) else a,
                               (node.args, node.kwargs))

    def _dtypes_ok(self, node) -> bool:
        ok = SUPPORTED_DTYPES[self.target]
        vals = [self.meta[node]] + [self.meta[a] for a in node.all_input_nodes]
        for t in pytree.tree_leaves(vals):
            if isinstance(t, torch.Tensor) and t.dtype not in ok:
                return False
        devs = [d for d in pytree.tree_leaves(
            [self.meta[node, "device"]] + [self.meta[a, "device"] for a in node.all_input_nodes])
            if d is not None]
        return all(same_device(d, self.device) for d in devs)

    def _call(self, node):
        args, kwargs = self._args(node)
        fn = LOWERINGS.get(node.target)
        if node.target is operator.getitem:
            return args[0][args[1]]
        if fn is not None and self._dtypes_ok(node):
            try:
                out = fn(self, node, *args, **kwargs)
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
        if self.target != "triton" or os.environ.get("TRITON_INTERPRET") != "1":
            return
        from ..codegen.triton.source import LIBDEVICE_ONLY
        for o in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(o, Lazy):
                for e in ir.walk(o.load(loop_vars(o.sizes))):
                    if isinstance(e, ir.Op) and e.name in LIBDEVICE_ONLY:
                        raise Unsupported("K0209", f"{e.name} needs libdevice, absent in the interpreter")

    def _maybe_realize(self, node, out):
        if isinstance(out, (tuple, list)):
            return type(out)(self.realize(o, origin=node.name) if isinstance(o, Lazy) else o
                             for o in out)
        if isinstance(out, Lazy) and node not in self.out_roots:  # (stored in eager's layout)
            probe = out.load(loop_vars(out.sizes))
            n_ops = ir.op_count(probe)
            if n_ops > MAX_INLINE_OPS or (len(node.users) > 1 and n_ops > 0
                                          and not self._reads_little(probe, out.sizes)):
                return self.realize(out, origin=node.name)
        return out

    def _reads_little(self, e, sizes) -> bool:
        """Does ``e`` read only buffers far smaller than its own iteration space (a
        per-row index, a scalar)? Then each reader computes it again rather than have it
        stored: recomputing rereads next to nothing, and storing it costs a buffer of
        the full size (nll_loss's one-hot gradient: one of the logits' size)."""
        numel = 1
        for n in sizes:
            numel *= int(n)
        for x in ir.walk(e):
            if isinstance(x, ir.Load):
                b = self.by_name.get(x.buf)
                if b is None or b.numel * READ_LITTLE > numel:
                    return False
        return True

    def fallback(self, node, args, kwargs, reason):
        if node.target not in LIBRARY_CALLS and not _kiln_library_op(node.target):
            self.fallbacks.append(f"{node.target}")
            self.fallback_messages.append((f"{node.target}", reason))
            _fallback_log.info("kernels: %s falls back to aten (%s)", node.target, reason)

        def to_arg(a):
            if is_box(a):
                v = self.realize(a, origin=node.name)
                return ir.ExternArg(v.buf, v.sizes, v.strides, v.offset)
            return a
        if node.target in STORAGE_OPS and args and is_box(args[0]):
            args = (self._in_eager_storage(node, args[0]),) + tuple(args[1:])
        args, kwargs = pytree.tree_map(to_arg, (args, kwargs), is_leaf=is_box)
        if _returns_a_view(node.target):
            # the result shares its argument's memory: that buffer must not be handed
            # to another buffer once its last direct reader is done
            for a in pytree.tree_leaves((args, kwargs)):
                if isinstance(a, ir.ExternArg) and isinstance(
                        self.by_name.get(a.buf), (ir.Pointwise, ir.Reduction)):
                    self.pinned.add(a.buf)
        m = self.meta[node]
        relaid = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, ir.ExternArg)
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
        if (not isinstance(m, torch.Tensor) or m.storage_offset() != 0 or not _dense(m)
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
        """The op on meta tensors laid out as its arguments will be (output strides)."""
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


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: its strides are a permutation of contiguous ones."""
    if t.numel() == 0:
        return False
    dims = sorted([(st, s) for s, st in zip(t.shape, t.stride()) if s != 1])
    expect = 1
    for st, s in dims:
        if st != expect:
            return False
        expect *= s
    return True


# --- generic helpers -------------------------------------------------------------------
def _as_expr(x, idx, out_sizes, dtype):
    """Load a broadcast operand (box or python scalar) at the output index, cast to dtype."""
    if is_box(x):
        nd = len(x.sizes)
        off = len(out_sizes) - nd
        sub = [Affine.c(0) if int(x.sizes[i]) == 1 else idx[off + i] for i in range(nd)]
        e = x.load(sub)
    else:
        if isinstance(x, torch.Tensor):
            raise Unsupported("K0205", "tensor constant")
        return const(x, dtype)
    return cast(e, dtype) if dtype is not None else e


def _meta_of(x):
    if is_box(x):
        return torch.empty(x.sizes, dtype=x.dtype, device="meta")
    return x


def promote(a, b) -> torch.dtype:
    """The dtype two operands are compared in (torch's type promotion, scalars included)."""
    return torch.result_type(_meta_of(a), _meta_of(b))


def pointwise(lo: GraphLowering, node, inputs, fn, compute_dtype=None) -> Lazy:
    """A lazy pointwise value over the broadcast of ``inputs``; ``fn(*exprs)`` builds the
    scalar expression from the operands cast to ``compute_dtype`` (default: output dtype)."""
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    cdt = compute_dtype or dtype

    def body(idx):
        e = fn(*[_as_expr(x, idx, sizes, cdt) for x in inputs])
        return cast(e, dtype)
    return Lazy(sizes, dtype, body, layout_hint(inputs, sizes))


def channels_last_strides(sizes) -> tuple:
    n, c, h, w = (int(s) for s in sizes)
    return (h * w * c, 1, w * c, c)


def is_channels_last(sizes, strides) -> bool:
    """A dense 4-d layout with channels innermost (and not also contiguous)."""
    if len(sizes) != 4 or int(sizes[1]) == 1:
        return False
    want = channels_last_strides(sizes)
    return all(int(s) == 1 or int(a) == int(b) for s, a, b in zip(sizes, strides, want)) \
        and tuple(strides) != ir.contiguous_strides(sizes)


def layout_hint(inputs, sizes):
    """Channels-last strides for a result over ``sizes`` when an operand of the same
    sizes is channels-last (stored or itself hinted), else None."""
    if len(sizes) != 4:
        return None
    for x in inputs:
        if not is_box(x) or tuple(x.sizes) != tuple(sizes):
            continue
        if isinstance(x, View) and is_channels_last(x.sizes, x.strides):
            return channels_last_strides(sizes)
        if isinstance(x, Lazy) and x.layout is not None:
            return x.layout
    return None


def affine_view(box, sizes, remap) -> object:
    """A view given by an affine map from the new index to the old one."""
    sizes = tuple(int(s) for s in sizes)
    if isinstance(box, Lazy):
        return Lazy(sizes, box.dtype, lambda idx: box.load(remap(list(idx))))
    probe = [Affine.var(f"y{j}") for j in range(len(sizes))]
    lin = linear_index(remap(probe), box.strides) + box.offset
    strides = tuple(lin.coef(f"y{j}") for j in range(len(sizes)))
    return View(box.buf, sizes, strides, lin.const, box.dtype)


def _dim(d, n):
    return d + n if d < 0 else d


# --- pointwise lowerings -----------------------------------------------------------------
_UNARY = {
    aten.abs.default: "abs", aten.neg.default: "neg", aten.exp.default: "exp",
    aten.exp2.default: "exp2", aten.expm1.default: "expm1", aten.log.default: "log",
    aten.log2.default: "log2", aten.log10.default: "log10", aten.log1p.default: "log1p",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.sin.default: "sin",
    aten.cos.default: "cos", aten.tan.default: "tan", aten.tanh.default: "tanh",
    aten.sinh.default: "sinh", aten.cosh.default: "cosh", aten.asin.default: "asin",
    aten.acos.default: "acos", aten.atan.default: "atan", aten.asinh.default: "asinh",
    aten.acosh.default: "acosh", aten.atanh.default: "atanh", aten.erf.default: "erf",
    aten.sigmoid.default: "sigmoid", aten.floor.default: "floor", aten.ceil.default: "ceil",
    aten.round.default: "round", aten.trunc.default: "trunc", aten.sign.default: "sign",
    aten.reciprocal.default: "reciprocal",
}
_FLOAT_ONLY = {"floor", "ceil", "round", "trunc"}


def _unary(name):
    def lower(lo, node, x):
        if name in _FLOAT_ONLY and not x.dtype.is_floating_point:
            return pointwise(lo, node, [x], lambda a: a)
        if name == "abs" and x.dtype == torch.bool:
            return pointwise(lo, node, [x], lambda a: a)
        return pointwise(lo, node, [x], lambda a: op(name, a))
    return lower


for _t, _n in _UNARY.items():
    register(_t)(_unary(_n))


@register(aten.bitwise_not.default)
def _bitwise_not(lo, node, x):
    if x.dtype == torch.bool:
        return pointwise(lo, node, [x], lambda a: op("not", a))
    return pointwise(lo, node, [x], lambda a: op("bitnot", a))


@register(aten.logical_not.default)
def _logical_not(lo, node, x):
    return pointwise(lo, node, [x], lambda a: op("not", cast(a, torch.bool)), x.dtype)


@register(aten.isnan.default)
def _isnan(lo, node, x):
    if not x.dtype.is_floating_point:
        return pointwise(lo, node, [x], lambda a: const(False, torch.bool), x.dtype)
    return pointwise(lo, node, [x], lambda a: op("isnan", a), x.dtype)


@register(aten.isinf.default)
def _isinf(lo, node, x):
    if not x.dtype.is_floating_point:
        return pointwise(lo, node, [x], lambda a: const(False, torch.bool), x.dtype)
    return pointwise(lo, node, [x], lambda a: op("isinf", a), x.dtype)


@register(aten.relu.default)
def _relu(lo, node, x):
    if config.inject_bug == "relu_accuracy":      # the minifier's test knob (kiln/debug/inject.py)
        return pointwise(lo, node, [x], lambda a: op("add", op("maximum", a, const(0, a.dtype)),
                                                     const(1, a.dtype)))
    return pointwise(lo, node, [x], lambda a: op("maximum", a, const(0, a.dtype)))


def _alpha(a, b, alpha):
    return b if alpha == 1 else op("mul", b, const(alpha, b.dtype))


@register(aten.add.Tensor, aten.add.Scalar)
def _add(lo, node, a, b, alpha=1):
    return pointwise(lo, node, [a, b], lambda x, y: op("add", x, _alpha(x, y, alpha)))


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(lo, node, a, b, alpha=1):
    return pointwise(lo, node, [a, b], lambda x, y: op("sub", x, _alpha(x, y, alpha)))


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(lo, node, a, b, alpha=1):
    return pointwise(lo, node, [a, b], lambda x, y: op("sub", _alpha(y, x, alpha), y))


def _binary(name):
    def lower(lo, node, a, b):
        return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y))
    return lower


for _t, _n in {aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "truediv",
               aten.div.Scalar: "truediv", aten.maximum.default: "maximum",
               aten.minimum.default: "minimum", aten.pow.Tensor_Tensor: "pow",
               aten.pow.Scalar: "pow",
               aten.atan2.default: "atan2", aten.remainder.Tensor: "remainder",
               aten.remainder.Scalar: "remainder", aten.fmod.Tensor: "fmod",
               aten.fmod.Scalar: "fmod", aten.bitwise_and.Tensor: "bitand",
               aten.bitwise_or.Tensor: "bitor", aten.bitwise_xor.Tensor: "bitxor",
               aten.bitwise_and.Scalar: "bitand", aten.bitwise_or.Scalar: "bitor",
               aten.bitwise_xor.Scalar: "bitxor", aten.floor_divide.default: "floordiv"}.items():
    register(_t)(_binary(_n))


#: Exponents eager's pow kernels (CPU and CUDA) compute with a cheaper formula than
#: ``pow`` for floating tensors; each rounds differently from ``pow`` in the last place,
#: so kiln uses the same formula to give eager's bits (RMS-norm backward in T5/Llama
#: squares and takes ``** -0.5`` / ``** -1.5``).
_POW_FORMULAS = {
    2.0: lambda x: op("mul", x, x),
    3.0: lambda x: op("mul", op("mul", x, x), x),
    0.5: lambda x: op("sqrt", x),
    -0.5: lambda x: op("rsqrt", x),
    -1.0: lambda x: op("reciprocal", x),
    -2.0: lambda x: op("reciprocal", op("mul", x, x)),
}


@register(aten.pow.Tensor_Scalar)
def _pow_tensor_scalar(lo, node, a, b):
    formula = None
    if lo.out_meta(node).dtype.is_floating_point and isinstance(b, (int, float)) \
            and not isinstance(b, bool):
        formula = _POW_FORMULAS.get(float(b))
    if formula is not None:
        return pointwise(lo, node, [a], formula)
    return pointwise(lo, node, [a, b], lambda x, y: op("pow", x, y))


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(lo, node, a, b, rounding_mode=None):
    name = {None: "truediv", "floor": "floordiv", "trunc": "truncdiv"}[rounding_mode]
    return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y))


def _compare(name):
    def lower(lo, node, a, b):
        return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y), promote(a, b))
    return lower


for _t, _n in {aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne",
               aten.ne.Scalar: "ne", aten.lt.Tensor: "lt", aten.lt.Scalar: "lt",
               aten.le.Tensor: "le", aten.le.Scalar: "le", aten.gt.Tensor: "gt",
               aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge"}.items():
    register(_t)(_compare(_n))


def _logical(name):
    def lower(lo, node, a, b):
        return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y), torch.bool)
    return lower


for _t, _n in {aten.logical_and.default: "and", aten.logical_or.default: "or",
               aten.logical_xor.default: "xor"}.items():
    register(_t)(_logical(_n))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(lo, node, c, a, b):
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype

    def body(idx):
        return op("where", _as_expr(c, idx, sizes, torch.bool), _as_expr(a, idx, sizes, dtype),
                  _as_expr(b, idx, sizes, dtype))
    return Lazy(sizes, dtype, body)


@register(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default,
          aten.clamp_max.default, aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _clamp(lo, node, x, lo_=None, hi=None):
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo_, hi = None, lo_
    inputs = [x] + [v for v in (lo_, hi) if v is not None]

    def f(a, *bounds):
        bounds = list(bounds)
        if lo_ is not None:
            a = op("maximum", a, bounds.pop(0))
        if hi is not None:
            a = op("minimum", a, bounds.pop(0))
        return a
    return pointwise(lo, node, inputs, f)


@register(aten.hardtanh.default)
def _hardtanh(lo, node, x, min_val=-1.0, max_val=1.0):
    return pointwise(lo, node, [x], lambda a: op("minimum", op("maximum", a, const(min_val, a.dtype)),
                                                 const(max_val, a.dtype)))


@register(aten.leaky_relu.default)
def _leaky_relu(lo, node, x, slope=0.01):
    return pointwise(lo, node, [x], lambda a: op(
        "where", op("gt", a, const(0, a.dtype)), a, op("mul", a, const(slope, a.dtype))))


@register(aten.gelu.default)
def _gelu(lo, node, x, approximate="none"):
    def f(a):
        c = lambda v: const(v, a.dtype)
        if approximate == "tanh":
            inner = op("mul", c(math.sqrt(2 / math.pi)),
                       op("add", a, op("mul", c(0.044715), op("mul", a, op("mul", a, a)))))
            return op("mul", op("mul", c(0.5), a), op("add", c(1), op("tanh", inner)))
        return op("mul", op("mul", c(0.5), a),
                  op("add", c(1), op("erf", op("mul", a, c(1 / math.sqrt(2))))))
    return pointwise(lo, node, [x], f)


@register(aten._to_copy.default)
def _to_copy(lo, node, x, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    return pointwise(lo, node, [x], lambda a: a, x.dtype)


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _clone(lo, node, x, memory_format=None):
    if node.target is aten.alias.default:
        return x
    return pointwise(lo, node, [x], lambda a: a)


@register(aten.full.default)
def _full(lo, node, size, value, **kw):
    m = lo.out_meta(node)
    return Lazy(tuple(m.shape), m.dtype, lambda idx: const(value, m.dtype))


@register(aten.full_like.default)
def _full_like(lo, node, x, value, **kw):
    return _full(lo, node, None, value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(lo, node, value, **kw):
    return _full(lo, node, None, value)


@register(aten.zeros.default, aten.zeros_like.default, aten.empty.memory_format,
          aten.empty_like.default, aten.empty_strided.default)
def _zeros(lo, node, *a, **kw):
    return _full(lo, node, None, 0)


@register(aten.ones.default, aten.ones_like.default)
def _ones(lo, node, *a, **kw):
    return _full(lo, node, None, 1)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(lo, node, *args, **kw):
    nums = [a for a in args if isinstance(a, (int, float))]
    if node.target is aten.arange.default:
        start, step = 0, 1
    elif node.target is aten.arange.start:
        start, step = nums[0], 1
    else:
        start, step = nums[0], (nums[2] if len(nums) > 2 else kw.get("step", 1))
    m = lo.out_meta(node)
    dt = m.dtype

    def body(idx):
        i = Index(idx[0])
        if dt.is_floating_point or isinstance(start, float) or isinstance(step, float):
            return op("add", const(start, dt), op("mul", cast(i, dt), const(step, dt)))
        return cast(op("add", const(start, torch.int64), op("mul", i, const(step, torch.int64))), dt)
    return Lazy(tuple(m.shape), dt, body)


# --- views --------------------------------------------------------------------------------
@register(aten.permute.default)
def _permute(lo, node, x, dims):
    n = len(x.sizes)
    dims = [_dim(d, n) for d in dims]

    def remap(idx):
        out = [None] * n
        for j, d in enumerate(dims):
            out[d] = idx[j]
        return out
    return affine_view(x, [x.sizes[d] for d in dims], remap)


@register(aten.transpose.int)
def _transpose(lo, node, x, d0, d1):
    n = len(x.sizes)
    perm = list(range(n))
    if n:
        d0, d1 = _dim(d0, n), _dim(d1, n)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute(lo, node, x, perm)


@register(aten.t.default)
def _t(lo, node, x):
    return _transpose(lo, node, x, 0, 1) if len(x.sizes) == 2 else x


@register(aten.expand.default)
def _expand(lo, node, x, size, implicit=False):
    out = tuple(lo.out_meta(node).shape)
    nd = len(x.sizes)
    off = len(out) - nd

    def remap(idx):
        return [Affine.c(0) if int(x.sizes[i]) == 1 and out[off + i] != 1 else idx[off + i]
                for i in range(nd)]
    return affine_view(x, out, remap)


@register(aten.unsqueeze.default)
def _unsqueeze(lo, node, x, dim):
    dim = _dim(dim, len(x.sizes) + 1)
    sizes = list(x.sizes)
    sizes.insert(dim, 1)
    return affine_view(x, sizes, lambda idx: idx[:dim] + idx[dim + 1:])


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(lo, node, x, dims=None):
    n = len(x.sizes)
    if dims is None:
        dims = list(range(n))
    elif isinstance(dims, int):
        dims = [dims]
    dims = {_dim(d, n) for d in dims if n and x.sizes[_dim(d, n)] == 1}
    keep = [i for i in range(n) if i not in dims]

    def remap(idx):
        out, j = [], 0
        for i in range(n):
            if i in dims:
                out.append(Affine.c(0))
            else:
                out.append(idx[j])
                j += 1
        return out
    return affine_view(x, [x.sizes[i] for i in keep], remap)


@register(aten.slice.Tensor)
def _slice(lo, node, x, dim=0, start=None, end=None, step=1):
    n = len(x.sizes)
    dim = _dim(dim, n)
    size = x.sizes[dim]
    start = slice(start, end, step).indices(size)[0]
    length = int(lo.out_meta(node).shape[dim])

    def remap(idx):
        out = list(idx)
        out[dim] = idx[dim] * step + start
        return out
    sizes = list(x.sizes)
    sizes[dim] = length
    return affine_view(x, sizes, remap)


@register(aten.select.int)
def _select(lo, node, x, dim, index):
    n = len(x.sizes)
    dim = _dim(dim, n)
    index = index + x.sizes[dim] if index < 0 else index
    sizes = list(x.sizes)
    del sizes[dim]
    return affine_view(x, sizes, lambda idx: idx[:dim] + [Affine.c(index)] + idx[dim:])


@register(aten.split.Tensor, aten.split_with_sizes.default)
def _split(lo, node, x, split, dim=0):
    dim = _dim(dim, len(x.sizes))
    metas = lo.out_meta(node)
    out, start = [], 0
    for m in metas:
        length = int(m.shape[dim])

        def remap(idx, s=start):
            o = list(idx)
            o[dim] = idx[dim] + s
            return o
        out.append(affine_view(x, tuple(m.shape), remap))
        start += length
    return out


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(lo, node, x, size):
    sizes = tuple(lo.out_meta(node).shape)
    if tuple(x.sizes) == sizes:
        return x
    # only size-1 dims added or removed: an affine map
    src = [(i, s) for i, s in enumerate(x.sizes) if s != 1]
    dst = [(j, s) for j, s in enumerate(sizes) if s != 1]
    if [s for _, s in src] == [s for _, s in dst]:
        def remap(idx):
            out = [Affine.c(0)] * len(x.sizes)
            for (i, _), (j, _) in zip(src, dst):
                out[i] = idx[j]
            return out
        return affine_view(x, sizes, remap)
    v = lo.realize(x, origin=node.name)
    base = torch.empty_strided(v.sizes, v.strides, dtype=v.dtype, device="meta")
    try:
        r = base.view(sizes)
    except RuntimeError:
        v = lo.realize(Lazy(v.sizes, v.dtype, v.load), origin=node.name)   # contiguous copy
        base = torch.empty_strided(v.sizes, v.strides, dtype=v.dtype, device="meta")
        r = base.view(sizes)
    return View(v.buf, sizes, tuple(r.stride()), v.offset, v.dtype)


@register(aten.cat.default)
def _cat(lo, node, tensors, dim=0):
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    parts = [t for t in tensors if is_box(t) and not (len(t.sizes) == 1 and t.sizes[0] == 0)]
    if not parts:
        raise Unsupported("K0206", "empty cat")
    dim = _dim(dim, len(sizes))

    def body(idx):
        pos = Index(idx[dim])
        offsets, start = [], 0
        for t in parts:
            offsets.append(start)
            start += t.sizes[dim]
        result = None
        for t, s in reversed(list(zip(parts, offsets))):
            sub = list(idx)
            sub[dim] = idx[dim] + (-s)
            e = cast(t.load(sub), dtype)
            if result is None:
                result = add_mask(e, op("ge", pos, const(s, torch.int64))) if s else e
                continue
            cond = op("lt", pos, const(s + t.sizes[dim], torch.int64))
            mask = cond if s == 0 else op("and", op("ge", pos, const(s, torch.int64)), cond)
            result = op("where", cond, add_mask(e, mask), result)
        return result
    return Lazy(sizes, dtype, body)


@register(aten.constant_pad_nd.default)
def _pad(lo, node, x, pad, value=0):
    """Padding by ``value``; a negative pad crops instead (only index arithmetic)."""
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    n = len(sizes)

    def body(idx):
        sub, conds = list(idx), []
        for k in range(len(pad) // 2):
            d = n - 1 - k
            before, after = pad[2 * k], pad[2 * k + 1]
            sub[d] = idx[d] + (-before)
            pos = Index(idx[d])
            if before > 0:
                conds.append(op("ge", pos, const(before, torch.int64)))
            if after > 0:
                conds.append(op("lt", pos, const(before + x.sizes[d], torch.int64)))
        if not conds:
            return cast(x.load(sub), dtype)
        cond = conds[0]
        for c in conds[1:]:
            cond = op("and", cond, c)
        return op("where", cond, add_mask(x.load(sub), cond), const(value, dtype))
    return Lazy(sizes, dtype, body)


# --- reductions ---------------------------------------------------------------------------
def reduce(lo, node, x, dims, keepdim, red_type, dtype, pre=None) -> View:
    """Store a reduction of ``x`` over ``dims``; kept dims come first in the loop nest."""
    n = len(x.sizes)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    dims = sorted({_dim(d, max(n, 1)) for d in dims}) if n else []
    kept = [i for i in range(n) if i not in dims]
    ksizes = tuple(x.sizes[i] for i in kept)
    rsizes = tuple(x.sizes[i] for i in dims)
    if any(s == 0 for s in rsizes) and red_type in ("max", "min", "argmax", "argmin"):
        raise Unsupported("K0206", "empty max/min reduction")
    vars_ = loop_vars(ksizes + rsizes)
    idx = [None] * n
    for j, i in enumerate(kept):
        idx[i] = vars_[j]
    for j, i in enumerate(dims):
        idx[i] = vars_[len(kept) + j]
    e = x.load(idx)
    if pre is not None:
        e = pre(e)
    if red_type not in ("argmax", "argmin"):
        e = cast(e, dtype)
    b = lo.add(ir.Reduction(lo.new_name(), ksizes, ir.contiguous_strides(ksizes), dtype,
                            red_sizes=rsizes, red_type=red_type, body=e, origin=node.name))
    v = View(b.name, ksizes, b.strides, 0, dtype)
    if keepdim:
        full = [1 if i in dims else x.sizes[i] for i in range(n)]
        v = affine_view(v, full, lambda ix: [ix[i] for i in kept])
    return v


def _red(red_type):
    def lower(lo, node, x, dim=None, keepdim=False, dtype=None):
        m = lo.out_meta(node)
        return reduce(lo, node, x, dim, keepdim, red_type, m.dtype)
    return lower


register(aten.sum.dim_IntList)(_red("sum"))
register(aten.amax.default)(_red("max"))
register(aten.amin.default)(_red("min"))
register(aten.argmax.default)(_red("argmax"))
register(aten.argmin.default)(_red("argmin"))
register(aten.prod.dim_int)(_red("prod"))


#: The type eager's CPU scans accumulate in (``at::acc_type<T, false>``).
_CPU_ACC = {torch.float32: torch.float64, torch.float64: torch.float64}


@register(aten.cumsum.default)
def _cumsum(lo, node, x, dim, dtype=None):
    """Prefix sums as an ``ir.Scan``, the input cast to the result dtype and summed in
    eager's accumulation type: on the CPU double for float32; on a GPU (``triton_scan``)
    the compute dtype, float32 for half precision."""
    if not is_box(x):
        raise Unsupported("K0205", "cumsum of a scalar")
    m = lo.out_meta(node)
    sizes, odt = tuple(int(s) for s in m.shape), m.dtype
    if not sizes:
        return pointwise(lo, node, [x], lambda a: a)
    if lo.target != "cpp" and any(s == 0 for s in sizes):
        raise Unsupported("K0206", "an empty scan")
    if lo.target == "cpp":
        acc = _CPU_ACC.get(odt, torch.int64 if not odt.is_floating_point else None)
    else:
        acc = odt if odt.is_floating_point else torch.int64
    if acc is None or odt == torch.bool:
        raise Unsupported("K0205", f"cumsum to {odt}")
    d = _dim(dim, len(sizes))
    strides = ir.contiguous_strides(sizes)
    idx = loop_vars(sizes)
    b = lo.add(ir.Scan(lo.new_name(), sizes, strides, odt, dim=d, acc_dtype=acc,
                       body=_as_expr(x, idx, sizes, odt), origin=node.name))
    return View(b.name, sizes, strides, 0, odt)


@register(aten.sum.default, aten.prod.default, aten.max.default, aten.min.default,
          aten.any.default)
def _full_reduce(lo, node, x, dtype=None):
    kind = {aten.sum.default: "sum", aten.prod.default: "prod", aten.max.default: "max",
            aten.min.default: "min", aten.any.default: "any"}[node.target]
    return reduce(lo, node, x, None, False, kind, lo.out_meta(node).dtype,
                  pre=(lambda e: cast(e, torch.bool)) if kind == "any" else None)


@register(aten.any.dim, aten.any.dims)
def _any(lo, node, x, dim=None, keepdim=False):
    return reduce(lo, node, x, dim, keepdim, "any", torch.bool, pre=lambda e: cast(e, torch.bool))


@register(aten.max.dim, aten.min.dim)
def _max_dim(lo, node, x, dim, keepdim=False):
    kind = "max" if node.target is aten.max.dim else "min"
    vals = reduce(lo, node, x, dim, keepdim, kind, x.dtype)
    idx = reduce(lo, node, x, dim, keepdim, "arg" + kind, torch.int64)
    return (vals, idx)


@register(aten.mean.dim, aten.mean.default)
def _mean(lo, node, x, dim=None, keepdim=False, dtype=None):
    m = lo.out_meta(node)
    s = reduce(lo, node, x, dim, keepdim, "sum", m.dtype)
    red_n = _numel(x.sizes) // max(1, _numel(m.shape)) if _numel(m.shape) else 0
    return Lazy(s.sizes, m.dtype, lambda idx: op("truediv", s.load(idx), const(red_n, m.dtype)))


def _numel(sizes):
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def _var_parts(lo, node, x, dim, correction, keepdim, dtype):
    n = len(x.sizes)
    dims = list(range(n)) if dim is None or (isinstance(dim, (list, tuple)) and not dim) else \
        ([dim] if isinstance(dim, int) else list(dim))
    red_n = _numel([x.sizes[_dim(d, n)] for d in dims]) if n else 1
    s = reduce(lo, node, x, dims, True, "sum", dtype)
    mean_k = Lazy(s.sizes, dtype, lambda idx: op("truediv", s.load(idx), const(red_n, dtype)))
    sizes = tuple(x.sizes)

    def centred(idx):
        d = op("sub", cast(x.load(idx), dtype), _as_expr(mean_k, idx, sizes, dtype))
        return op("mul", d, d)
    sq = reduce(lo, node, Lazy(sizes, dtype, centred), dims, keepdim, "sum", dtype)
    denom = max(red_n - (1 if correction is None else correction), 0)
    var = Lazy(sq.sizes, dtype, lambda idx: op("truediv", sq.load(idx), const(denom, dtype)))
    mean = mean_k if keepdim else _squeeze(lo, node, mean_k, [_dim(d, n) for d in dims])
    return var, mean


@register(aten.var.correction)
def _var(lo, node, x, dim=None, *, correction=None, keepdim=False):
    return _var_parts(lo, node, x, dim, correction, keepdim, lo.out_meta(node).dtype)[0]


@register(aten.var_mean.correction)
def _var_mean(lo, node, x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_parts(lo, node, x, dim, correction, keepdim, lo.out_meta(node)[0].dtype)
    return (lo.realize(v, origin=node.name), lo.realize(m, origin=node.name))


@register(aten._softmax.default, aten._log_softmax.default)
def _softmax(lo, node, x, dim, half_to_float=False):
    dtype = lo.out_meta(node).dtype
    sizes = tuple(x.sizes)
    mx = reduce(lo, node, x, [dim], True, "max", dtype)

    def shifted(idx):
        return op("sub", cast(x.load(idx), dtype), _as_expr(mx, idx, sizes, dtype))
    ex = Lazy(sizes, dtype, lambda idx: op("exp", shifted(idx)))
    s = reduce(lo, node, ex, [dim], True, "sum", dtype)
    if node.target is aten._softmax.default:
        return Lazy(sizes, dtype, lambda idx: op("truediv", ex.load(idx), _as_expr(s, idx, sizes, dtype)))
    return Lazy(sizes, dtype, lambda idx: op("sub", shifted(idx),
                                             op("log", _as_expr(s, idx, sizes, dtype))))


@register(aten.native_layer_norm.default)
def _layer_norm(lo, node, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """out = (x - mean) * rstd * weight + bias; mean and rstd keep the reduced dims."""
    n = len(x.sizes)
    dims = list(range(n - len(normalized_shape), n))
    dtype = lo.out_meta(node)[0].dtype
    var, mean = _var_parts(lo, node, x, dims, 0, True, dtype)
    mean = lo.realize(mean, origin=node.name)
    rstd = lo.realize(Lazy(var.sizes, dtype, lambda idx: op(
        "rsqrt", op("add", var.load(idx), const(eps, dtype)))), origin=node.name)
    sizes = tuple(x.sizes)

    def body(idx):
        e = op("mul", op("sub", cast(x.load(idx), dtype), _as_expr(mean, idx, sizes, dtype)),
               _as_expr(rstd, idx, sizes, dtype))
        if weight is not None:
            e = op("mul", e, _as_expr(weight, idx, sizes, dtype))
        if bias is not None:
            e = op("add", e, _as_expr(bias, idx, sizes, dtype))
        return e
    return (Lazy(sizes, dtype, body), mean, rstd)


# --- library calls with a layout of our choosing ---------------------------------------
#: dtypes whose 2-d convolutions run channels-last on the Triton (GPU) path: cuDNN's
#: tensor-core kernels are NHWC; given NCHW it transposes in and out around each call
#: (two extra kernels, and their launch cost, per convolution).
CHANNELS_LAST_DTYPES = {torch.bfloat16, torch.float16}


@register(aten.convolution.default)
def _convolution(lo, node, x, w, b, stride, padding, dilation, transposed, output_padding,
                 groups):
    if (lo.target != "triton" or not is_box(x) or len(x.sizes) != 4 or transposed
            or x.dtype not in CHANNELS_LAST_DTYPES):
        raise Unsupported("K0211", "convolution stays as the graph has it")
    cl = channels_last_strides(x.sizes)
    if not (isinstance(x, View) and is_channels_last(x.sizes, x.strides)):
        lazy = x if isinstance(x, Lazy) else Lazy(x.sizes, x.dtype, x.load)
        x = lo.realize(Lazy(lazy.sizes, lazy.dtype, lazy.fn, cl), strides=cl, origin=node.name)
    out = lo.fallback(node, (x, w, b, stride, padding, dilation, transposed, output_padding,
                             groups), {}, "library call")
    # cuDNN (and oneDNN) give a channels-last result for a channels-last input; the meta
    # kernel does not say so. Should a library disagree, the runtime copies (_fix_layout).
    ext = lo.by_name[out.buf]
    ext.strides = channels_last_strides(ext.sizes)
    lo.relaid.add(ext.name)
    return View(out.buf, out.sizes, ext.strides, 0, out.dtype)


from . import index as lowering_index  # noqa: E402,F401  (register their lowerings)
from . import matmul as lowering_matmul  # noqa: E402,F401
from . import pool as lowering_pool  # noqa: E402,F401
from . import resample as lowering_resample  # noqa: E402,F401
from . import view as lowering_view  # noqa: E402,F401
from . import checks as lowering_checks  # noqa: E402,F401  (last: wraps lowerings registered above)
