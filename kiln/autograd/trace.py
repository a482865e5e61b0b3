"""Dispatch-level tracing with functionalization: torch-level graph -> joint aten graph.

The torch-level ``gm`` runs on meta copies of the inputs, through PyTorch's autograd
engine, under ``_TraceMode`` (a ``TorchDispatchMode``, so it sees aten ops *below*
autograd). Every op is recorded into one FX graph; then, when an output needs a
gradient, ``torch.autograd.grad`` runs under the same mode and the engine's backward
ops are recorded too (``node.meta["phase"]`` says which). The result is the joint graph.

While recording, the mode makes the graph functional:

* every meta tensor knows its storage and the chain of view ops that produced it from
  the storage's *base* (the tensor that created the storage);
* a mutation ``op_(t, ...)`` is recorded as its out-of-place twin; the new value is
  scattered back into the base through the inverse of the view chain, and the
  storage's version moves on, so any other view of it is re-derived from the new base
  the next time it is read (the rules: ``functionalize.py``);
* an input whose storage was written ends with a new value that the runtime copies
  into the real input once, after the graph (``TraceResult.mutations``); an in-place
  geometry change of an input is replayed on it (``TraceResult.meta_mutations``);
* outputs aliasing an input or each other are described as view chains
  (``TraceResult.output_specs``) that the runtime replays on real tensors.

Decompositions are applied inside the mode, as the op set profile (``ops.OpSet``) says:
"core" (``ops.DECOMPOSITIONS``: the core op set only, for the kernel compiler) or
"eager" (for ``aot_eager``: ops with efficient aten kernels such as batch norm, layer
norm, softmax and attention stay whole; see ``ops.EAGER`` and ``sdpa.py``). Devices: ops
run on ``meta``; each node records the real device in ``node.meta["device"]`` and
factory ops get it back in their ``device=`` argument, so a CUDA program traces on a
machine without a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from kiln.fast_tree import leaves, tree_map

from kiln.autograd import ops as opinfo
from kiln.autograd.functionalize import (STORAGE_VIEWS, AotUnsupported, Functionalize,
                                         _replay)
from kiln.autograd.eager_saved import saved_storages, storage_of
from kiln.autograd.index_lists import INDEXING, index_tensors
from ..dispatch_mode import KilnDispatchMode
from ..fast_meta import host_scalars_arg, meta_result
from ..shapes.fake_ops import is_symbolic
from ..shapes.meta_calls import call_meta, reads_int_sizes, retry_python_composite
from kiln.autograd.sym_nodes import SymNodes, SymbolicUnsupported

aten = torch.ops.aten
_META = torch.device("meta")


@dataclass
class _Storage:
    base: torch.Tensor          # the meta tensor that created the storage
    version: int = 0
    input_index: int | None = None
    #: the base's current value is laid out as the base (what storage addressing reads)
    layout_exact: bool = True


@dataclass
class _Info:
    node: fx.Node
    storage: _Storage
    version: int
    chain: tuple                # ((op, rest_args, kwargs, index|None), ...) from base
    device: torch.device
    #: per step of ``chain``, the grad mode the graph had set when it was made (None:
    #: the mode the graph was called in)
    modes: tuple = ()


@dataclass
class TraceResult:
    """The joint graph and what the runtime needs to call it like the user's graph."""
    graph: fx.Graph
    constants: dict[str, torch.Tensor]
    num_inputs: int
    #: positions of the forward outputs of ``graph`` (the compiled function's outputs):
    #: user outputs, then new values of mutated inputs, then bases of aliased outputs
    num_fw_outputs: int
    #: how to build each user output: ("fn", k) | ("input", i) (the input tensor itself)
    #: | ("input_view", i, chain, modes) | ("base_view", k, chain, modes) | ("const", value)
    #: (``modes``: per view step, the grad mode the graph had set when it was made, None
    #: for the call's)
    output_specs: list
    #: (input index, forward-output position of its new value)
    mutations: list
    #: forward-output positions that carry a gradient (have a tangent placeholder)
    differentiable: list
    #: input indices whose gradient the backward returns, in order
    grad_inputs: list = field(default_factory=list)
    #: per grad input, the positions in ``differentiable`` its gradient is computed from
    grad_deps: list = field(default_factory=list)
    #: in-place geometry changes of inputs (``t_``, ``squeeze_``…) to replay on the real
    #: inputs after the graph: (input index, op, args after self, kwargs, the grad mode
    #: the graph had set, None for the call's)
    meta_mutations: list = field(default_factory=list)
    #: inputs whose storage the graph addresses by offset relative to the input's start,
    #: exact only for an input that starts its storage (checked per call)
    storage_inputs: list = field(default_factory=list)
    #: forward nodes whose values the backward must keep as copies: of storages the
    #: user can write after the call (inputs', outputs') that eager's autograd does not
    #: save, so that such a write never fails the backward (``eager_saved``)
    copied: frozenset = frozenset()
    #: (("input", i) | ("output", k)) + (positions in ``differentiable`` whose eager
    #: backward reads the tensor's storage,): tensors whose later in-place writes fail
    #: eager's backward from those outputs (``eager_saved.Witnesses``)
    witnesses: list = field(default_factory=list)
    #: output view chains or geometry changes carry symbolic sizes, made concrete per
    #: call from the inputs' sizes (``symbolic.concrete_steps``)
    symbolic_steps: bool = False
    #: inputs sharing their version counter with an input whose geometry the runtime
    #: changes after the forward (``trace_joint(partners=...)``): the replay bumps
    #: their versions too, so the backward keeps copies of what it saves of them
    version_partners: tuple = ()

    @functools.cached_property
    def plain_outputs(self) -> int | None:
        """n when the user outputs are simply the graph's first n results."""
        if all(s[0] == "fn" and s[1] == k for k, s in enumerate(self.output_specs)):
            return len(self.output_specs)
        return None


#: view ops whose result is not a view (``detach``): made from the base after the graph,
#: sharing its version counter as eager's do
_ALIASES = (aten.detach.default, aten.alias.default)


def as_strided_from(t: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """``t``'s storage viewed at ``size``/``stride``, ``offset`` elements from ``t``'s
    own start (a view step of an output spec: the real output's offset is its own)."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _owned_by_output(mode, o, owner) -> bool:
    """Is output ``o`` (of an intermediate storage) the output ``owner`` or a view of
    it (its view chain extends the owner's)?"""
    if owner is None:
        return False
    chain, own = mode.infos[id(o)].chain, mode.infos[id(owner)].chain
    return o is owner or (len(chain) >= len(own) and chain[:len(own)] == own)


def _has_device_arg(op) -> bool:
    return any(a.name == "device" for a in op._schema.arguments)


class _TraceMode(Functionalize, KilnDispatchMode):
    """Records aten ops on meta tensors into ``self.graph``, functionalizing as it goes."""

    def __init__(self, default_device: torch.device, ops: opinfo.OpSet = opinfo.CORE):
        super().__init__()
        self.ops = ops
        self.graph = fx.Graph()
        self.infos: dict[int, _Info] = {}
        self.keep: list[torch.Tensor] = []      # keeps ids stable
        self.constants: dict[str, torch.Tensor] = {}
        self.default_device = default_device
        self.phase = "forward"
        self.source: fx.Node | None = None       # the torch-level node being run
        self.input_of: dict[int, int] = {}       # id(meta input) -> input index
        #: in-place geometry changes of inputs, to replay on the real ones:
        #: (input index, op, args after self, kwargs, grad mode set)
        self.meta_mutations: list = []
        #: input index -> the meta inputs sharing its version counter at run time
        #: (``trace_joint(partners=...)``), bumped with it by a geometry change
        self.version_partners: dict[int, list] = {}
        #: inputs addressed by storage offset (as_strided), assumed to start their storage
        self.storage_inputs: set[int] = set()
        #: the grad mode the graph's own ``_set_grad_enabled`` nodes set last (None: the
        #: mode it was called in, which the trace's own may not be)
        self.grad_set: bool | None = None
        #: the graph's symbolic sizes (``sym_nodes.SymNodes``) when the inputs have some
        self.sym = None
        self.writes = 0             # mutations recorded so far

    # --- bookkeeping ------------------------------------------------------------
    def register(self, t, node, storage=None, chain=(), device=None):
        if storage is None:
            storage = _Storage(t)
        info = _Info(node, storage, storage.version, chain, device or self.default_device)
        self.infos[id(t)] = info
        self.keep.append(t)
        node.meta["val"] = t
        node.meta["device"] = info.device
        return info

    def _node(self, op, target, args, kwargs=None, name=None):
        n = self.graph.create_node(op, target, args, kwargs or {}, name=name)
        n.meta["phase"] = self.phase
        if self.source is not None:
            n.meta["source"] = self.source.name
            if "kiln_user_line" in self.source.meta:
                n.meta["kiln_user_line"] = self.source.meta["kiln_user_line"]
            if self.source.meta.get("stack_trace"):
                n.meta["stack_trace"] = self.source.meta["stack_trace"]
        return n

    def _constant(self, t: torch.Tensor) -> torch.Tensor:
        """A real tensor met during tracing becomes a get_attr constant."""
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = t
        m = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=_META)
        self.register(m, self._node("get_attr", name, ()), device=t.device)
        return m

    def value(self, t):
        """The node holding ``t``'s current value, re-derived from its base if the
        storage was written since."""
        info = self.infos.get(id(t))
        if info is None:
            raise AotUnsupported("K0108", f"untracked tensor {tuple(t.shape)} {t.device}")
        st = self.infos[id(t)].storage
        if info.version != st.version:
            self._check_storage_views(info.chain, st)
            with self:
                fresh = _replay(info.chain, st.base)
            info.node, info.version = self.infos[id(fresh)].node, st.version
        return info.node

    def _meta_args(self, args, kwargs):
        def to_meta(a):
            if isinstance(a, torch.Tensor) and a.device != _META:
                return self._constant(a)
            return a
        return tree_map(to_meta, (args, kwargs))

    def _device_of(self, op, args, kwargs) -> torch.device:
        """The device of ``op``'s result: its first tensor argument's, but where every
        CPU tensor argument is 0-d, an accelerator argument's (eager: ``cuda_t *
        torch.tensor(2.0)`` is on CUDA); ``copy`` writes into its first argument."""
        found = [(self.infos[id(a)].device, a.dim() == 0)
                 for a in leaves((args, kwargs))
                 if isinstance(a, torch.Tensor) and id(a) in self.infos]
        if not found:
            return torch.get_default_device()
        other = next((d for d, _ in found if d.type != "cpu"), None)
        if (other is not None and op is not aten.copy.default
                and all(scalar for d, scalar in found if d.type == "cpu")):
            return other
        return found[0][0]

    # --- the dispatch rules -----------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        args, kwargs = self._meta_args(args, kwargs)
        if func is aten._local_scalar_dense.default:
            raise AotUnsupported("K0109", "a tensor's value (.item(), a data-dependent branch) is "
                                 "needed, but tracing runs on meta tensors")
        if func is aten._to_copy.default and isinstance(args[0], _NUMBERS):
            return _number_to_copy(self, *args, **kwargs)
        if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default):
            return args[0] if func is aten.lift_fresh.default else self._record(
                aten.clone.default, args, kwargs)
        if opinfo.is_mutation(func):
            self.writes += 1
            return self._mutate(func, args, kwargs)
        if func is aten.detach.default:
            # ``alias`` in the graph; replayed as ``detach`` on a real input it aliases,
            # which gives eager's tensor (no grad, no view base)
            return self._view(aten.alias.default, args, kwargs, step_op=func)
        table = self.ops.table
        if func in table:
            try:
                with self:
                    r = table[func](*args, **kwargs)
            except AotUnsupported:
                raise
            except Exception:           # noqa: BLE001  (the op's own kernel decides)
                # a decomposition refusing arguments the op takes (torch._refs.addcmul:
                # a float value for integer tensors): the op is recorded whole, and
                # raises here only where its own (meta) kernel does, as eager's would
                r = NotImplemented
            if r is not NotImplemented:
                return r
        if func in _HIDDEN_WRITES:
            r = _HIDDEN_WRITES[func](self, *args, **kwargs)
            if r is not NotImplemented:
                return r
        if func not in self.ops.keep_whole and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        if opinfo.is_view(func):
            return self._view(func, args, kwargs)
        return self._record(func, args, kwargs)

    def _record(self, func, args, kwargs):
        device = None
        if _has_device_arg(func):
            given = kwargs.get("device")
            if given is not None and torch.device(given) != _META:
                device = torch.device(given)
            elif given is not None or not any(isinstance(a, torch.Tensor)
                                              for a in leaves(args)):
                device = self.default_device if given is not None else \
                    torch.get_default_device()
            if device is not None:
                kwargs = {**kwargs, "device": _META}
        if device is None:
            device = self._device_of(func, args, kwargs)
        out = meta_result(func, args, kwargs, device)
        if out is None:
            args_ = host_scalars_arg(func, args, self._on_cpu)
            out = func(*args_, **kwargs) if self.sym is None else \
                call_meta(func, args_, kwargs)
        rec_kwargs = dict(kwargs)
        if "device" in rec_kwargs:
            rec_kwargs["device"] = device
        if _has_device_arg(func) and isinstance(out, torch.Tensor) and \
                rec_kwargs.get("dtype") is None and any(
                    a.name == "dtype" and a.kwarg_only for a in func._schema.arguments):
            # a factory in the default dtype: the one traced (capture guards it), spelled
            # out so that no compiler picks its own
            rec_kwargs["dtype"] = out.dtype
        node = self._node("call_function", func, *self._to_nodes(args, rec_kwargs))
        self._register_outputs(out, node, device)
        return out

    def _on_cpu(self, t) -> bool:
        info = self.infos.get(id(t)) if isinstance(t, torch.Tensor) else None
        return info is not None and info.device.type == "cpu"

    def _to_nodes(self, args, kwargs):
        if self.sym is not None:
            return tree_map(lambda a: self.value(a) if isinstance(a, torch.Tensor)
                            else self.sym.value(a), (args, kwargs))
        return tree_map(lambda a: self.value(a) if isinstance(a, torch.Tensor) else a,
                        (args, kwargs))

    def _register_outputs(self, out, node, device, view_of=None, step=None):
        """Give each tensor result a node (getitem for tuple results). ``view_of``:
        the info of the tensor the results alias, if the op is a view."""
        def reg(t, n, index):
            if view_of is None:
                self.register(t, n, device=device)
            else:
                op, rest, kw = step
                info = self.register(t, n, view_of.storage,
                                     view_of.chain + ((op, rest, kw, index),),
                                     view_of.device)
                info.modes = view_of.modes + (self.grad_set,)
        if isinstance(out, torch.Tensor):
            reg(out, node, None)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = tuple(out)
            node.meta["device"] = device
            for i, t in enumerate(out):
                if isinstance(t, torch.Tensor):
                    g = self._node("call_function", operator.getitem, (node, i))
                    reg(t, g, i)
        else:
            node.meta["val"] = out

    def _check_storage_views(self, chain, st):
        """as_strided of a storage written in place addresses the base's functional
        value, whose layout must be the base's (and whose offsets are relative to it)."""
        if st.version and any(op in STORAGE_VIEWS for op, *_ in chain):
            if not st.layout_exact:
                raise AotUnsupported("K0106", "as_strided of a tensor written in place whose layout "
                                     "the functional graph does not keep")
            self.storage_addressed(st)

    def _view(self, func, args, kwargs, step_op=None):
        src = args[0]
        info = self.infos[id(src)]
        if func in STORAGE_VIEWS:
            self._check_storage_views(((func,),), info.storage)
        out = func(*args, **kwargs) if self.sym is None else call_meta(func, args, kwargs)
        node = self._node("call_function", func, *self._to_nodes(args, kwargs))
        self._register_outputs(out, node, info.device, view_of=info,
                               step=(step_op or func, tuple(args[1:]), dict(kwargs)))
        return out


def _batch_norm_with_stats(mode, input, weight, bias, running_mean, running_var,
                           training, momentum, eps):
    """``native_batch_norm`` in training mode writes its running statistics although
    its schema does not say so: record ``_native_batch_norm_legit_functional`` (the
    same kernel, returning the new statistics) and write them like any mutation."""
    if not training or running_mean is None or running_var is None:
        return NotImplemented
    with mode:
        out, mean, rstd, new_mean, new_var = \
            aten._native_batch_norm_legit_functional.default(
                input, weight, bias, running_mean, running_var, training, momentum, eps)
    mode._write(running_mean, new_mean)
    mode._write(running_var, new_var)
    return out, mean, rstd


def _batch_norm_backward_in_training(mode, grad_out, input, weight, running_mean,
                                     running_var, save_mean, save_invstd, train, eps,
                                     output_mask):
    """In training the backward reads the saved batch statistics only: pass no running
    statistics, so that their new values are not kept alive for the backward."""
    if not train or (running_mean is None and running_var is None):
        return NotImplemented
    return mode._record(aten.native_batch_norm_backward.default,
                        (grad_out, input, weight, None, None, save_mean, save_invstd,
                         train, eps, output_mask), {})


_NUMBERS = (bool, int, float, complex)
_NUMBER_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64,
                  complex: torch.complex128}


def _number_to_copy(mode, value, dtype=None, device=None, **_layout):
    """``_to_copy`` of a Python number: a scalar operand that ``vmap``'s batching rules
    move to the batched tensor's device (the dispatcher hands the number itself to a
    dispatch mode). The same 0-d tensor, made directly."""
    return mode._record(aten.scalar_tensor.default, (value,), {
        "dtype": dtype or _NUMBER_DTYPES[type(value)],
        "device": device if device is not None else torch.device("cpu")})


#: Ops recorded by a rule of their own (reached only when the op set does not
#: decompose them): kernels that write an argument their schema does not mark as
#: written, recorded functionally; arguments an op does not read, dropped.
_HIDDEN_WRITES = {aten.native_batch_norm.default: _batch_norm_with_stats,
                  aten.native_batch_norm_backward.default:
                      _batch_norm_backward_in_training}


class _Runner(fx.Interpreter):
    """Runs the torch-level graph, telling the mode which user node each op comes from."""

    def __init__(self, gm, mode):
        super().__init__(gm)
        self.mode = mode

    def call_function(self, target, args, kwargs):
        if target in INDEXING and len(args) > 1 and isinstance(args[0], torch.Tensor) \
                and isinstance(args[1], (list, tuple)):
            info = self.mode.infos.get(id(args[0]))
            index = index_tensors(args[1], info.device if info else None)
            args = (args[0], index, *args[2:])
        if self.mode.sym is None:
            return super().call_function(target, args, kwargs)
        writes = self.mode.writes
        try:
            return super().call_function(target, args, kwargs)
        except RuntimeError as e:
            # a C++ composite reading int sizes (2.11's 3-d matmul): its Python composite
            # instead, where the failed attempt wrote nothing (its other records are dead)
            if self.mode.writes != writes or not reads_int_sizes(str(e)):
                raise
        return retry_python_composite(lambda: super(_Runner, self).call_function(
            target, args, kwargs))

    def run_node(self, n):
        self.mode.source = n
        r = super().run_node(n)
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            self.mode.grad_set = bool(n.args[0])
        return r


def _meta_copy(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=_META)


class _StandIn(torch.autograd.Function):
    """An input that requires grad, traced as a non-leaf (in-place ops then behave as
    on eager's non-leaf inputs) with the input's very strides (a clone would make an
    expanded input contiguous, and the graph would view it as if it were)."""

    @staticmethod
    def forward(ctx, leaf):
        return _meta_copy(leaf)

    @staticmethod
    def backward(ctx, grad):
        return grad


def trace_joint(gm: fx.GraphModule, example_inputs, train: bool, requires_grad=None,
                devices=None, ops=None, aliases=None, grad_at_entry=None,
                shape_env=None, partners=None) -> TraceResult:
    """Trace ``gm`` on meta copies of ``example_inputs``; with ``train``, also the
    backward for every output that requires grad. See the module docstring.
    ``requires_grad`` and ``devices`` (per input) override the examples' own, so that
    meta stand-ins can be traced as the real tensors they represent. ``ops``: the op
    set profile (``ops.OpSet`` or "core" / "eager"; default "core"). ``aliases``:
    inputs that share storage with another input, ``{member: (base, geometry)}``; the
    member is traced as a view of the base input — ``alias`` when ``geometry`` is None
    (the same tensor), else ``as_strided(base, *geometry)`` (the base is contiguous,
    at storage offset 0, and neither requires grad) — so that a write through either
    is seen through the other (see ``runtime._alias_key``). ``grad_at_entry``: the grad
    mode the graph starts in (default: ``train``); a training trace may start with grad
    off when the graph turns it on itself (``torch._C._set_grad_enabled`` nodes).
    ``shape_env``: the ``ShapeEnv`` of the examples' symbolic sizes (``symbolic.py``),
    whose sizes the graph then computes from its inputs (``sym_nodes``).
    ``partners``: ``{i: (j, ...)}``, inputs ``j`` sharing input ``i``'s version counter
    (views of one tensor; ``runtime._version_partners``): an in-place geometry change of
    ``i`` bumps their versions as eager's does, so that a tensor eager saved of them
    before it fails the traced backward as it fails eager's (the graph then runs
    eagerly, ``K0111``)."""
    ops = opinfo.op_set(ops)
    if _names_meta_device(gm):
        raise AotUnsupported("K0110", "the graph moves tensors to the meta device, the device "
                             "tracing itself runs on")
    if devices is None:
        devices = [a.device if isinstance(a, torch.Tensor) else None
                   for a in example_inputs]
    if requires_grad is None:
        requires_grad = [isinstance(a, torch.Tensor) and a.requires_grad
                         for a in example_inputs]
    # factories made from a tensor (``empty_like`` inside dropout) reach the tracer
    # with ``device=meta`` and no tensor: they are put on the graph's accelerator when
    # it has one, as CPU inputs beside CUDA ones are 0-d scalars and constants
    tensor_devices = [d for d in devices if d is not None]
    default_device = next((d for d in tensor_devices if d.type != "cpu"),
                          tensor_devices[0] if tensor_devices else torch.get_default_device())
    mode = _TraceMode(default_device, ops)
    graph = mode.graph
    if shape_env is not None:
        mode.sym = SymNodes(lambda target, args: mode._node("call_function", target, args),
                            shape_env)

    aliases = aliases or {}
    leaves, metas, grad_inputs = [], [], []
    history = {}        # input index -> its autograd node before the graph
    for i, a in enumerate(example_inputs):
        ph = graph.placeholder(f"primals_{i + 1}")
        ph.meta["phase"] = "forward"
        if not isinstance(a, torch.Tensor):
            ph.meta["val"] = a
            metas.append(a)
            if isinstance(a, torch.SymInt) and mode.sym is not None:
                mode.sym.define(a.node.expr, ph)
            continue
        if i in aliases:               # made from its base below; this input unused
            ph.meta["val"] = _meta_copy(a)
            ph.meta["device"] = devices[i]
            metas.append(None)
            continue
        m = _meta_copy(a)
        if train and requires_grad[i]:
            leaf = m.requires_grad_(True)
            leaves.append(leaf)
            grad_inputs.append(i)
            with torch.enable_grad():
                m = _StandIn.apply(leaf)
        metas.append(m)
        history[i] = m.grad_fn
        info = mode.register(m, ph, device=devices[i])
        info.storage.input_index = i
        mode.input_of[id(m)] = i
        if mode.sym is not None:
            mode.sym.of_input(m, ph)
    for i, (base, geometry) in sorted(aliases.items()):
        with mode:
            if geometry is None:
                metas[i] = aten.alias.default(metas[base])
            else:
                metas[i] = aten.as_strided.default(metas[base], *geometry)
        mode.input_of[id(metas[i])] = i

    for i, js in (partners or {}).items():
        if isinstance(metas[i], torch.Tensor):
            mode.version_partners[i] = [metas[j] for j in js
                                        if isinstance(metas[j], torch.Tensor)]

    entry_mode = train if grad_at_entry is None else grad_at_entry
    with torch.set_grad_enabled(entry_mode), mode, _attention_mode(mode):
        outs = _Runner(gm, mode).run(*metas)
    mode.source = None
    flat_outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]

    # Which storages the outputs share, to spot aliasing.
    fw_values: list[torch.Tensor] = []          # forward outputs of the compiled function
    specs: list = []
    storage_users: dict[int, int] = {}
    for o in flat_outs:
        if isinstance(o, torch.Tensor):
            st = mode.infos[id(o)].storage
            storage_users[id(st)] = storage_users.get(id(st), 0) + 1
    bases: dict[int, int] = {}
    # an output that is not a view but whose geometry changed in place (``t_``: a view
    # chain from its storage's base, which is now a stand-in without its gradient) owns
    # its storage: it is returned as it is, and the other outputs there as its views
    owners: dict[int, torch.Tensor] = {}
    for o in flat_outs:
        if isinstance(o, torch.Tensor) and not o._is_view():
            info = mode.infos[id(o)]
            st = info.storage
            if st.input_index is None and info.chain and info.chain[-1][0] not in _ALIASES \
                    and (o.requires_grad or not st.base.requires_grad):
                owners.setdefault(id(st), o)
    owner_slot: dict[int, int] = {}
    for o in flat_outs:
        if not isinstance(o, torch.Tensor):
            specs.append(("const", o))
            continue
        info = mode.infos[id(o)]
        st = info.storage
        if any(o is m for m in metas):
            # the input itself (with any in-place geometry change replayed on it)
            specs.append(("input", next(i for i, m in enumerate(metas) if o is m)))
        elif st.input_index is not None:
            # relative to an aliased member where the output is (a view of) it
            owner, best = st.input_index, 0
            for i in aliases:
                member = mode.infos[id(metas[i])]
                n = len(member.chain)
                if member.storage is st and n > best and info.chain[:n] == member.chain:
                    owner, best = i, n
            specs.append(("input_view", owner, info.chain[best:], info.modes[best:]))
        elif _owned_by_output(mode, o, owners.get(id(st))):
            # rebuilt from the output that owns the storage (after ``t_``, say)
            owner = owners[id(st)]
            if id(st) not in owner_slot:
                owner_slot[id(st)] = len(fw_values)
                fw_values.append(owner)
            k = owner_slot[id(st)]
            n = len(mode.infos[id(owner)].chain)
            specs.append(("fn", k) if o is owner else
                         ("base_view", k, info.chain[n:], info.modes[n:]))
        elif (storage_users[id(st)] > 1 or info.chain) and (
                st.base.requires_grad or not o.requires_grad):
            # a view of an intermediate is made from its base after the graph, as eager
            # makes it: one made inside the graph refuses in-place writes that eager's
            # takes (made by the autograd.Function, or under no_grad by an inference path)
            if id(st) not in bases:
                bases[id(st)] = -1   # filled below, after mutations
            specs.append(("storage_view", st, info.chain, info.modes))
        elif owners.get(id(st)) is not None and info.chain:
            # a view made before the owner's geometry changed: eager's is a view of
            # the owner still (as_strided over the same storage), never a copy
            owner = owners[id(st)]
            if id(st) not in owner_slot:
                owner_slot[id(st)] = len(fw_values)
                fw_values.append(owner)
            step = (as_strided_from, (tuple(o.shape), tuple(o.stride()),
                                      o.storage_offset() - owner.storage_offset()), {}, None)
            specs.append(("base_view", owner_slot[id(st)], (step,), tuple(info.modes[-1:])))
        else:
            specs.append(("fn", len(fw_values)))
            fw_values.append(o)

    mutations = []
    # New values of inputs whose writes autograd did not record (made with grad off,
    # or through a detached alias): eager's input keeps its autograd history, and its
    # new value carries no gradient of its own.
    gradless = set()
    for i, m in enumerate(metas):
        if isinstance(m, torch.Tensor):
            st = mode.infos[id(m)].storage
            if st.version != 0 and st.input_index == i:
                if m.grad_fn is history[i]:
                    gradless.add(len(fw_values))
                elif st.base is not m and m.requires_grad:
                    raise AotUnsupported("K0107", "an input that requires grad is written in "
                                         "place after an in-place change of its geometry")
                mutations.append((i, len(fw_values)))
                fw_values.append(st.base)
    for k, spec in enumerate(specs):
        if spec[0] == "storage_view":
            st = spec[1]
            if bases[id(st)] == -1:
                bases[id(st)] = len(fw_values)
                fw_values.append(st.base)
            specs[k] = ("base_view", bases[id(st)], *spec[2:])

    fw_nodes = [mode.value(v) for v in fw_values]
    differentiable = [k for k, v in enumerate(fw_values)
                      if train and v.requires_grad and k not in gradless
                      and (v.dtype.is_floating_point or v.dtype.is_complex)]

    bw_nodes = []
    copied, witnesses = frozenset(), []
    if train and differentiable and leaves:
        copied, witnesses = _user_writable(graph, metas, fw_values, specs, differentiable)
        mode.phase = "backward"
        tangents = []
        for j, k in enumerate(differentiable):
            v = fw_values[k]
            t = torch.empty(v.shape, dtype=v.dtype, device=_META)
            ph = mode._node("placeholder", f"tangents_{j + 1}", ())
            mode.register(t, ph, device=mode.infos[id(v)].device)
            tangents.append(t)
        try:
            with mode:
                grads = torch.autograd.grad([fw_values[k] for k in differentiable],
                                            leaves, tangents, allow_unused=True)
        except RuntimeError as e:
            reason = next((r for m, r in _BACKWARD_ONLY_ERRORS if m in str(e)), None)
            if reason is None:
                raise
            raise AotUnsupported("K0111", f"{reason}: {str(e).splitlines()[0]}") from e
        bw_nodes = [mode.value(g) if g is not None else None for g in grads]
        grad_deps = _grad_deps([fw_values[k] for k in differentiable], leaves)
    else:
        grad_inputs, grad_deps = [], []

    if mode.sym is not None and any(is_symbolic([n.args, n.kwargs]) for n in graph.nodes):
        # a size that reached an argument other than through the mode (never a node):
        # run as it is, it would be the traced size
        raise SymbolicUnsupported("a symbolic size left as a constant in the graph")
    _order_placeholders(graph)
    graph.output((*fw_nodes, *bw_nodes))
    _drop_aliases(graph)
    graph.eliminate_dead_code(is_impure_node=opinfo.has_effect)
    return TraceResult(graph, mode.constants, len(example_inputs), len(fw_nodes), specs,
                       mutations, differentiable, grad_inputs, grad_deps,
                       mode.meta_mutations, sorted(mode.storage_inputs), copied,
                       witnesses, mode.sym is not None and _symbolic_steps(
                           specs, mode.meta_mutations),
                       tuple(sorted({j for js in (partners or {}).values() for j in js})))


def _symbolic_steps(specs, meta_mutations) -> bool:
    """Do the steps the runtime replays on real tensors (output views, geometry
    changes) carry symbolic sizes (to be made concrete per call)?"""
    def steps(chain):
        return [(rest, kw) for _op, rest, kw, *_ in chain]
    for spec in specs:
        if spec[0] in ("input_view", "base_view") and is_symbolic(steps(spec[2])):
            return True
    return any(is_symbolic(list(m[2])) or is_symbolic(m[3]) for m in meta_mutations)


def _user_writable(graph: fx.Graph, metas, fw_values, specs, differentiable):
    """What the user can write after the call — the inputs, and the outputs the graph
    hands out — against what eager's autograd saves (``eager_saved``): the forward
    nodes of storages it saves nothing of (``TraceResult.copied``), and the witnesses
    of those it does (``TraceResult.witnesses``)."""
    visible: dict = {}       # storage -> ("input", i) | ("output", k)
    for i, m in enumerate(metas):
        if isinstance(m, torch.Tensor):
            visible.setdefault(storage_of(m), ("input", i))
    for spec in specs:
        if spec[0] in ("fn", "base_view"):
            visible.setdefault(storage_of(fw_values[spec[1]]), ("output", spec[1]))
    per_output = saved_storages([fw_values[k] for k in differentiable], set(visible))
    saved = frozenset().union(*per_output)
    private = set(visible) - saved
    copied = frozenset(n for n in graph.nodes
                       if isinstance(n.meta.get("val"), torch.Tensor)
                       and storage_of(n.meta["val"]) in private) if private else frozenset()
    witnesses = [(*who, frozenset(p for p, s in enumerate(per_output) if st in s))
                 for st, who in visible.items() if st in saved]
    return copied, witnesses


#: errors eager's backward raises when (and only if) it reaches a node — the trace
#: differentiates every output that requires grad, wherever a backward will start:
#: such a graph runs eagerly, raising exactly where eager does
_BACKWARD_ONLY_ERRORS = (
    ("modified by an inplace operation",
     "the backward reads a tensor the forward modified in place"),
    ("is not implemented",     # floor_divide's NotImplemented node, igamma's formula
     "the backward reaches an op whose derivative PyTorch does not implement"),
    # a tensor's geometry changed in place with grad off (``squeeze_`` under no_grad):
    # its grad_fn still expects the old shape, and the engine refuses the gradient
    ("invalid gradient at index",
     "the backward reaches a tensor whose shape changed in place with grad off"),
)


def _grad_deps(outputs, leaves) -> list:
    """For each leaf, the positions of the outputs whose autograd graph reaches it:
    eager's backward leaves ``.grad`` alone (None) when none of those outputs gets a
    gradient, so the compiled backward returns None for it then, not zeros."""
    position = {id(leaf): j for j, leaf in enumerate(leaves)}
    memo: dict = {}

    def reach(fn) -> frozenset:
        if fn is None:
            return frozenset()
        if fn in memo:
            return memo[fn]
        found = set()
        var = getattr(fn, "variable", None)
        if var is not None and id(var) in position:
            found.add(position[id(var)])
        stack, seen = [fn], {fn}
        while stack:                       # iterative: graphs are deep
            n = stack.pop()
            if n is not fn and n in memo:
                found |= memo[n]
                continue
            var = getattr(n, "variable", None)
            if var is not None and id(var) in position:
                found.add(position[id(var)])
            for nxt, _ in n.next_functions:
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        memo[fn] = frozenset(found)
        return memo[fn]

    deps = [set() for _ in leaves]
    for k, o in enumerate(outputs):
        for j in reach(o.grad_fn):
            deps[j].add(k)
    return [frozenset(d) for d in deps]


def _names_meta_device(gm: fx.GraphModule) -> bool:
    """Does an op of ``gm`` name the meta device (``x.to("meta")``)? Tracing reads a
    ``device=meta`` argument as its own, so such a graph is not traced."""
    for n in gm.graph.nodes:
        for a in leaves((n.args, n.kwargs)):
            if (isinstance(a, torch.device) and a.type == "meta") or (
                    isinstance(a, str) and a.startswith("meta")):
                return True
    return False


def _attention_mode(mode: _TraceMode):
    if not mode.ops.whole_attention:
        return contextlib.nullcontext()
    from kiln.autograd.sdpa import AttentionMode

    def device_of(t):
        info = mode.infos.get(id(t))
        return info.device if info is not None else None
    return AttentionMode(device_of)


def _drop_aliases(graph: fx.Graph) -> None:
    """``aten.alias`` (what ``detach`` becomes) is the identity in a functional graph."""
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is aten.alias.default:
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)


def _order_placeholders(graph: fx.Graph) -> None:
    """Move every placeholder (primals, then tangents) to the top of the graph."""
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = None
    for p in phs:
        if anchor is None:
            first = next(iter(graph.nodes))
            if first is not p:
                first.prepend(p)
        else:
            anchor.append(p)
        anchor = p
