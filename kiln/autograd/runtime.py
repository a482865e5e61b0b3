"""Running compiled aten graphs: the ``torch.autograd.Function`` and the epilogue.

``aot_compile`` returns an ``AotFunction``. Each call picks a path:

* **training** (grad mode on and an input requires grad): the forward graph runs inside
  ``_CompiledFunction.forward``, saving what the partitioner chose with
  ``ctx.save_for_backward``; ``.backward()`` from user code runs the whole backward
  graph as one autograd node. Saved tensors follow autograd's rules, so
  ``retain_graph`` works and a second backward without it fails as in eager; double
  backward is refused clearly (``once_differentiable``).
* **inference**: a forward-only graph, nothing saved.

After either, new values of mutated inputs are copied into the real inputs (once),
and outputs that alias inputs or each other are rebuilt as views by replaying their
view chains on real tensors, so aliasing is exactly eager's.
Paths are compiled on first use and cached by the inputs' requires_grad pattern.

Inputs sharing storage: graphs are traced with each input in its own storage, which
is exact as long as no input the graph writes shares storage with another. When one
does (checked per call, for graphs that write inputs only), the call takes a path
traced with the sharing made explicit (``_alias_key``: the other inputs become views
of a base input inside the graph), or, where that cannot be modelled, runs the
torch-level graph eagerly (``AotFunction.eager_calls``, logged under "fallbacks").
"""
from __future__ import annotations

import torch
import torch.fx as fx

from kiln.autograd.ops import op_set
from kiln.autograd.partition import partition
from kiln.autograd.functionalize import AotUnsupported, _replay
from kiln.autograd.trace import TraceResult, _meta_copy, trace_joint
from kiln.debug.logs import enabled, log_for
from kiln.debug.timing import timed

_log = log_for("aot_graphs")
_fallback_log = log_for("fallbacks")


def _default_compiler(gm: fx.GraphModule, example_inputs):
    return gm


def _module(graph: fx.Graph, constants: dict, name: str) -> fx.GraphModule:
    root = torch.nn.Module()
    for k, v in constants.items():
        setattr(root, k, v)
    graph.lint()
    return fx.GraphModule(root, graph, class_name=name)


def _log_graph(title: str, gm: fx.GraphModule) -> None:
    if enabled("aot_graphs"):
        _log.info("%s:\n%s", title, gm.print_readable(print_output=False))


def _example_values(graph: fx.Graph):
    """Meta stand-ins for a graph's placeholders (what compilers get as examples)."""
    return [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]


class _RefuseDoubleBackward(torch.autograd.Function):
    """Marks first-order gradients of a compiled graph: differentiating them again is
    an error, never a silently missing term."""

    @staticmethod
    def forward(ctx, g, *anchors):
        return g.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "kiln: double backward through a kiln-compiled graph is not supported "
            "(the backward graph is compiled once-differentiable); run this part "
            "eagerly, e.g. with kiln.disable")


class _Training:
    """A compiled forward/backward pair for one requires_grad pattern."""

    def __init__(self, tr: TraceResult, fw_compiler, bw_compiler):
        with timed("aot_partition"):
            part = partition(tr.graph, tr.num_fw_outputs,
                             {i for i, _ in tr.mutations} | {m[0] for m in tr.meta_mutations})
        self.trace = tr
        self.num_saved = len(part.saved)
        self.saved_bytes = part.saved_bytes
        self.fw_module = _module(part.forward, tr.constants, "KilnForward")
        self.bw_module = _module(part.backward, tr.constants, "KilnBackward")
        _log_graph("forward graph", self.fw_module)
        _log_graph("backward graph", self.bw_module)
        with timed("aot_compile_fw"):
            self.fw = fw_compiler(self.fw_module, _example_values(part.forward))
        with timed("aot_compile_bw"):
            self.bw = bw_compiler(self.bw_module, _example_values(part.backward))
        boxed = getattr(self.bw, "call_boxed", None)
        self.bw_boxed = boxed if boxed is not None else (lambda args: self.bw(*args))
        fn = self
        diff = frozenset(tr.differentiable)

        class _CompiledFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args_and_anchors):
                args = args_and_anchors[: tr.num_inputs]
                ctx.anchors = args_and_anchors[tr.num_inputs:]
                outs = fn.fw(*args)
                n = tr.num_fw_outputs
                ctx.save_for_backward(*outs[n:])
                fw_outs = tuple(outs[:n])
                ctx.mark_non_differentiable(*[o for k, o in enumerate(fw_outs)
                                              if k not in diff and
                                              isinstance(o, torch.Tensor)])
                # autograd would fill a zero gradient for every output the loss does
                # not reach — BatchNorm's new running statistics, three per layer, a
                # fill launch each — though the backward graph reads only the
                # differentiable ones: those few are made here when missing
                ctx.set_materialize_grads(False)
                ctx.diff_meta = [(fw_outs[k].shape, fw_outs[k].dtype, fw_outs[k].device)
                                 for k in tr.differentiable]
                return fw_outs

            @staticmethod
            def backward(ctx, *grads):
                create_graph = torch.is_grad_enabled()
                with torch.no_grad():
                    tangents = [grads[k].contiguous() if grads[k] is not None
                                else torch.zeros(shape, dtype=dtype, device=device)
                                for k, (shape, dtype, device) in zip(tr.differentiable,
                                                                     ctx.diff_meta)]
                    args = [*ctx.saved_tensors, *tangents]
                    del tangents
                    # the backward graph frees each saved activation after its last
                    # reader (a boxed call); the ctx's references would outlive it
                    ctx.maybe_clear_saved_tensors()
                    gin = fn.bw_boxed(args)
                result = [None] * (tr.num_inputs + len(ctx.anchors))
                for i, g, deps in zip(tr.grad_inputs, gin, tr.grad_deps):
                    if all(grads[tr.differentiable[j]] is None for j in deps):
                        continue        # eager's backward never reaches this input
                    if create_graph and g is not None:
                        g = _RefuseDoubleBackward.apply(g, *ctx.anchors)
                    result[i] = g
                return tuple(result)

        self.function = _CompiledFunction

    def __call__(self, args):
        # Tensors whose grad_fn leads to each differentiable input: with
        # create_graph=True the gradients hang from them, so a double backward reaches
        # _RefuseDoubleBackward instead of silently missing a term. A leaf (a parameter)
        # is its own anchor; other inputs get an empty view-copy holding no data, so the
        # backward graph does not keep their values alive.
        anchors = []
        for i in self.trace.grad_inputs:
            a = args[i]
            if a.requires_grad:
                anchors.append(a if a.is_leaf else a.as_strided((0,), (1,)).clone())
        if not torch.is_grad_enabled():     # the graph turns grad mode on itself
            with torch.enable_grad():
                return self.function.apply(*args, *anchors)
        return self.function.apply(*args, *anchors)


class _Inference:
    def __init__(self, tr: TraceResult, compiler):
        graph = tr.graph
        self.module = _module(graph, tr.constants, "KilnInference")
        _log_graph("inference graph", self.module)
        with timed("aot_compile_inference"):
            self.fn = compiler(self.module, _example_values(graph))

    def __call__(self, args):
        return tuple(self.fn(*args))


class _Eager:
    """A path the tracer cannot express (``AotUnsupported``): its calls run the
    torch-level graph eagerly, which is eager's semantics exactly."""

    def __init__(self, reason: str):
        self.reason = reason


class AotFunction:
    """What ``aot_compile`` returns: call it like the torch-level graph."""

    def __init__(self, gm, example_inputs, fw_compiler, bw_compiler, inference_compiler,
                 decompositions=None, devices=None):
        self.gm = gm
        self.ops = op_set(decompositions)
        # Meta stand-ins and devices only: the real examples are not kept alive.
        self.examples = [_meta_copy(a) if isinstance(a, torch.Tensor) else a
                         for a in example_inputs]
        self.devices = list(devices) if devices is not None else [
            a.device if isinstance(a, torch.Tensor) else None for a in example_inputs]
        #: calls run eagerly: the tracer cannot express the graph (``_Eager``), or inputs
        #: share storage with a mutated input in a way it does not model (``_alias_key``)
        self.eager_calls = 0
        #: why calls ran eagerly, each reason once
        self.eager_reasons: list[str] = []
        #: paths traced for inputs sharing storage: alias key -> {pattern: entry}
        self._aliased: dict[tuple, dict] = {}
        self.fw_compiler = fw_compiler or _default_compiler
        self.bw_compiler = bw_compiler or _default_compiler
        self.inference_compiler = inference_compiler or self.fw_compiler
        self._training: dict[tuple, _Training] = {}
        self._inference: _Inference | None = None
        self._inference_trace: TraceResult | None = None
        #: paths the tracer cannot express: ("train", pattern) | ("inference",) -> _Eager
        self._eager: dict[tuple, _Eager] = {}
        #: requires_grad patterns under which no gradient reaches an input
        self._gradless: set[tuple] = set()
        #: the graph turns grad mode on (``_set_grad_enabled(True)`` nodes): called with
        #: grad off, it may still need a training path, traced from grad off
        self._enables_grad = any(n.op == "call_function" and n.target is torch._C._set_grad_enabled
                                 and n.args and n.args[0] for n in gm.graph.nodes)
        # Compile the path the example inputs ask for now, so errors surface early.
        self._entry(example_inputs)

    def _trace(self, train, pattern=None, aliases=None, grad_at_entry=None):
        """The joint graph of one path, or ``_Eager`` where the tracer cannot express it."""
        try:
            with timed("aot_trace"):
                return trace_joint(self.gm, self.examples, train=train,
                                   requires_grad=pattern, devices=self.devices,
                                   ops=self.ops, aliases=aliases,
                                   grad_at_entry=grad_at_entry)
        except AotUnsupported as e:
            return _Eager(str(e).split("\n")[0])

    def _entry(self, args):
        """(entry, trace) of the path these arguments take: a ``_Training`` or
        ``_Inference`` with its trace, or an ``_Eager`` (trace None)."""
        pattern = tuple([isinstance(a, torch.Tensor) and a.requires_grad for a in args])
        grad = torch.is_grad_enabled()
        key = (pattern, grad)   # the grad mode the graph starts in
        if (grad or self._enables_grad) and any(pattern) and key not in self._gradless:
            entry = self._training.get(key) or self._eager.get(("train", key))
            if entry is None:
                tr = self._trace(True, pattern, grad_at_entry=grad)
                if isinstance(tr, _Eager):
                    entry = self._eager[("train", key)] = tr
                elif tr.grad_inputs:
                    entry = self._training[key] = _Training(tr, self.fw_compiler,
                                                            self.bw_compiler)
                else:
                    self._gradless.add(key)
            if entry is not None:
                return (entry, None) if isinstance(entry, _Eager) else (entry, entry.trace)
        if ("inference",) in self._eager:
            return self._eager[("inference",)], None
        if self._inference is None:
            tr = self._trace(False)
            if isinstance(tr, _Eager):
                self._eager[("inference",)] = tr
                return tr, None
            self._inference_trace = tr
            self._inference = _Inference(tr, self.inference_compiler)
        return self._inference, self._inference_trace

    def _aliased_entry(self, args, key):
        """The path for inputs sharing storage as ``key`` says, traced on first use."""
        paths = self._aliased.setdefault(key, {})
        grad = torch.is_grad_enabled()
        train = (grad or self._enables_grad) and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        pattern = tuple([isinstance(a, torch.Tensor) and a.requires_grad for a in args]) \
            if train else None
        path = (pattern, grad)
        if path not in paths:
            aliases = {m: (b, g) for b, m, g in key}
            tr = self._trace(train, pattern, aliases, grad_at_entry=grad if train else None)
            if isinstance(tr, _Eager):
                paths[path] = tr, None
            elif train and tr.grad_inputs:
                paths[path] = _Training(tr, self.fw_compiler, self.bw_compiler), tr
            else:
                if train:
                    tr = self._trace(False, aliases=aliases)
                paths[path] = (tr, None) if isinstance(tr, _Eager) else (
                    _Inference(tr, self.inference_compiler), tr)
        return paths[path]

    def __call__(self, *args):
        entry, tr = self._entry(args)
        if tr is not None and tr.mutations and _shares_storage_with_mutated(args,
                                                                           tr.mutations):
            key = _alias_key(args, tr.mutations)
            if key is None:
                return self._run_eagerly(args, "inputs share storage with an input the "
                                               "graph mutates in place")
            entry, tr = self._aliased_entry(args, key)
        if isinstance(entry, _Eager):
            return self._run_eagerly(args, entry.reason)
        if tr.storage_inputs and any(args[i].storage_offset() for i in tr.storage_inputs):
            return self._run_eagerly(args, "the graph addresses the storage of an input "
                                           "that does not start its storage")
        if isinstance(entry, _Inference):
            if torch.is_grad_enabled():
                # no output needs a gradient (grad-free regions): none gets one
                with torch.no_grad():
                    outs = entry(args)
            else:
                outs = entry(args)
        else:
            outs = entry(args)
        if tr.mutations:
            _copy_mutations(args, outs, tr.mutations)
        n = tr.plain_outputs
        if n is not None and not tr.meta_mutations:
            # outputs are the graph's first n results, nothing to build
            return outs if len(outs) == n else outs[:n]
        result = []
        for spec in tr.output_specs:
            kind = spec[0]
            if kind == "fn":
                result.append(outs[spec[1]])
            elif kind == "input_view":
                result.append(_replay(spec[2], args[spec[1]]))
            elif kind == "base_view":
                if spec[3] is None or spec[3] == torch.is_grad_enabled():
                    result.append(_replay(spec[2], outs[spec[1]]))
                else:
                    with torch.set_grad_enabled(spec[3]):
                        result.append(_replay(spec[2], outs[spec[1]]))
            elif kind == "input":
                result.append(None)          # after the geometry changes, below
            else:
                result.append(spec[1])
        for i, op, rest, kwargs in tr.meta_mutations:
            op(args[i], *rest, **kwargs)
        for k, spec in enumerate(tr.output_specs):
            if spec[0] == "input":
                result[k] = args[spec[1]]
        return tuple(result)

    def _run_eagerly(self, args, reason):
        """Run the torch-level graph eagerly (exactly eager's semantics), for calls the
        compiled graphs would not reproduce; each reason is logged once."""
        if reason not in self.eager_reasons:
            self.eager_reasons.append(reason)
            _fallback_log.warning("kiln: running a compiled graph eagerly: %s", reason)
        self.eager_calls += 1
        out = self.gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _copy_mutations(args, outs, mutations):
    """New values into the inputs the graph wrote: one multi-tensor copy per device and
    dtype for the plain ones (BatchNorm's running stats…): a list of mixed dtypes
    (running_mean with the int64 num_batches_tracked) takes _foreach_copy_'s slow path, a
    copy launch each. A value that requires grad is copied under autograd, as eager's
    in-place op was recorded."""
    groups: dict = {}
    for i, k in mutations:
        if not outs[k].requires_grad:
            dst, src = groups.setdefault((args[i].device, args[i].dtype, outs[k].dtype),
                                         ([], []))
            dst.append(args[i])
            src.append(outs[k])
    if groups:
        with torch.no_grad():
            for dst, src in groups.values():
                torch._foreach_copy_(dst, src)
    for i, k in mutations:
        if outs[k].requires_grad:
            args[i].copy_(outs[k])


def _shares_storage_with_mutated(args, mutations) -> bool:
    """Does a tensor argument the graph mutates share its storage with another one?"""
    owners: dict[int, int] = {}
    for a in args:
        if isinstance(a, torch.Tensor):
            st = a.untyped_storage()
            if st.nbytes():
                key = st.data_ptr()
                owners[key] = owners.get(key, 0) + 1
    for i, _ in mutations:
        st = args[i].untyped_storage()
        if st.nbytes() and owners.get(st.data_ptr(), 0) > 1:
            return True
    return False


def _alias_key(args, mutations):
    """How tensor arguments share storage with the inputs the graph writes, as a
    hashable key ``((base, member, geometry), ...)`` for ``trace_joint(aliases=...)``,
    or None when the tracer cannot model it (the call then runs eagerly).

    Modelled: in each group of arguments sharing a storage with a written input, one
    *base* (contiguous, storage offset 0) holds every other member's elements (same
    dtype, within its numel), and no member requires grad (a member traced as a view
    of the base would route its gradient into the base's). A member with the base's
    very geometry is the same tensor (geometry None)."""
    groups: dict[int, list[int]] = {}
    for j, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            st = a.untyped_storage()
            if st.nbytes():
                groups.setdefault(st.data_ptr(), []).append(j)
    key = []
    done = set()
    for i, _ in mutations:
        ptr = args[i].untyped_storage().data_ptr()
        members = groups.get(ptr, [])
        if len(members) < 2 or ptr in done:
            continue
        done.add(ptr)
        ts = [args[j] for j in members]
        if any(t.requires_grad for t in ts) or len({t.dtype for t in ts}) > 1:
            return None
        bases = [j for j in members if args[j].is_contiguous()
                 and args[j].storage_offset() == 0]
        if not bases:
            return None
        base = max(bases, key=lambda j: args[j].numel())
        b = args[base]
        for j in members:
            if j == base:
                continue
            t = args[j]
            if t.size() == b.size() and t.stride() == b.stride() and \
                    t.storage_offset() == b.storage_offset():
                key.append((base, j, None))
                continue
            extent = 1 + sum((n - 1) * st for n, st in zip(t.size(), t.stride()) if n)
            if t.numel() == 0 or min(t.stride(), default=0) < 0 or \
                    t.storage_offset() + extent > b.numel():
                return None
            key.append((base, j, (tuple(t.size()), tuple(t.stride()), t.storage_offset())))
    return tuple(key) if key else None


def aot_compile(gm: fx.GraphModule, example_inputs, fw_compiler=None, bw_compiler=None,
                inference_compiler=None, decompositions=None, devices=None):
    """Ahead-of-time autograd for a torch-level graph: see the module docstring.
    Each compiler is ``compiler(aten_gm, example_inputs) -> callable`` (default: run
    the aten graph as it is). ``decompositions``: the op set profile, "core" (the
    default: core aten, what the kernel compiler lowers) or "eager" (ops with efficient
    aten kernels kept whole, for running the graphs op by op; ``ops.OpSet``).
    ``devices``: the real device of each input when ``example_inputs`` are meta
    stand-ins (tracing a CUDA program on a machine without a GPU)."""
    return AotFunction(gm, example_inputs, fw_compiler, bw_compiler, inference_compiler,
                       decompositions, devices)
