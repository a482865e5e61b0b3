"""Running compiled aten graphs: the ``torch.autograd.Function`` and the epilogue.

``aot_compile`` returns an ``AotFunction``. Each call picks a path:

* **training** (grad mode on and an input requires grad): the forward graph runs once;
  its differentiable outputs then hang from one ``torch.autograd.Function`` node per
  independent part of the gradient dependencies (``grad_parts``; usually one), which
  saves what the partitioner chose (``ctx.save_for_backward``) and whose backward runs
  its backward graph. Saved tensors follow autograd's rules, so ``retain_graph`` works
  and a second backward without it fails as in eager; double backward is refused
  clearly (``_RefuseDoubleBackward``).
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
In a training call, inputs of no elements sharing a storage (a version counter) with a
written one count too: the copy of the new value bumps the counter after the forward
saved what the backward needs, where eager bumps it at the op.
In-place geometry changes (``t_``, ``unsqueeze_``…) are replayed on their inputs after
the forward, bumping the version counter every view of the tensor shares, where eager
bumps it at the op: a training call where another input shares that counter takes a
path traced with the bump reaching that input too (``_version_partners``), so that a
tensor eager saved of it before the change fails the traced backward (the call then runs
eagerly) and what the backward saves of it is a copy.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from kiln.amp_off import suspended as autocast_suspended
from kiln.autograd.ops import op_set
from kiln.autograd.grad_parts import free_symbols, restrict_backward, split
from kiln.autograd.partition import partition
from kiln.autograd.eager_saved import Witnesses
from kiln.autograd.functionalize import AotUnsupported, replay_in_modes
from kiln.autograd import trace_cache
from kiln.autograd.trace import TraceResult, _meta_copy, trace_joint
from kiln.autograd.specialize import per_size
from kiln.autograd.symbolic import (aot_compile_dynamic, capture_env, concrete_steps,
                                    refuse_aliased, symbolic_entry, traced_symbolically)
from kiln.debug.breaks import describe, tag
from kiln.debug import trace_dir
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
        _log.info("%s:\n%s", title, gm.print_readable(print_output=False), extra={"kiln_gm": gm})


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
    """A compiled forward/backward pair for one requires_grad pattern. The forward runs
    once; its differentiable outputs then hang from one autograd node per group of
    outputs reaching the same inputs (``grad_parts``: usually one), whose backward runs
    the backward graph specialised to the tangents it gets."""

    def __init__(self, tr: TraceResult, fw_compiler, bw_compiler):
        with timed("aot_partition"):
            part = partition(tr.graph, tr.num_fw_outputs,
                             {i for i, _ in tr.mutations} | {m[0] for m in tr.meta_mutations}
                             | set(tr.version_partners),
                             copied=tr.copied)
        self.trace = tr
        self.num_saved = len(part.saved)
        self.saved_bytes = part.saved_bytes
        self.fw_module = _module(part.forward, tr.constants, "KilnForward")
        self.bw_module = _module(part.backward, tr.constants, "KilnBackward")
        _log_graph("forward graph", self.fw_module)
        _log_graph("backward graph", self.bw_module)
        self.bw_compiler = bw_compiler
        self.trace_owner = trace_dir.current()   # a backward compiled later is filed there
        with timed("aot_compile_fw"):
            self.fw = fw_compiler(self.fw_module, _example_values(part.forward))
        #: (grad slots, outputs) -> _Node
        self._nodes: dict[tuple, _Node] = {}
        #: which grad inputs are leaves without hooks -> the nodes of such a call
        self._plans: dict[tuple, list] = {}
        #: the last call's witnesses (``eager_saved``), settled by ``AotFunction`` once
        #: the call is over (inputs written back)
        self.unsettled: Witnesses | None = None
        parts = split(tr.grad_deps, len(tr.differentiable))
        self._single = [self._node(parts[0])] if len(parts) == 1 else None
        if self._single is not None and self._single[0].whole:
            # the usual case: compiled now, so that errors surface early
            self._single[0].backward_for((True,) * len(tr.differentiable))

    def _node(self, part) -> _Node:
        key = (tuple(part.grad_slots), tuple(part.outputs))
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = _Node(self, part)
        return node

    def _plan(self, args) -> list:
        """The nodes of this call: outputs reaching the same inputs share one, where
        leaves without hooks are not told apart (``grad_parts.split``)."""
        if self._single is not None:
            return self._single
        tr = self.trace
        plain = tuple(_plain_leaf(args[i]) for i in tr.grad_inputs)
        nodes = self._plans.get(plain)
        if nodes is None:
            parts = split(tr.grad_deps, len(tr.differentiable),
                          frozenset(j for j, p in enumerate(plain) if p))
            nodes = self._plans[plain] = [self._node(p) for p in parts]
        return nodes

    def __call__(self, args):
        tr = self.trace
        nodes = self._plan(args)
        with torch.no_grad():
            outs = self.fw(*args)
        n = tr.num_fw_outputs
        fw_outs, saved = list(outs[:n]), tuple(outs[n:])
        del outs
        witnesses = Witnesses()
        if tr.witnesses:
            saved = witnesses.unversioned(saved, [(j, fw_outs[i]) for j, (kind, i, _) in
                                                  enumerate(tr.witnesses) if kind == "output"])
        with torch.enable_grad():       # the graph may turn grad mode on itself
            for node in nodes:
                node(args, fw_outs, saved, witnesses)
        if tr.witnesses:
            witnesses.watch([(args[i] if kind == "input" else fw_outs[i], deps)
                             for kind, i, deps in tr.witnesses])
            self.unsettled = witnesses
        return fw_outs


def _plain_leaf(a: torch.Tensor) -> bool:
    """A leaf without hooks: its gradient accumulation, run with no gradient, does
    nothing at all."""
    return a.is_leaf and not a._backward_hooks and not a._post_accumulate_grad_hooks


class _Node:
    """The autograd node of one group of outputs (``grad_parts.Part``): calling it
    replaces the group's outputs in ``fw_outs`` by the node's (which carry its
    grad_fn). Its backward graph is specialised per pattern of present tangents and
    compiled when first needed."""

    def __init__(self, training: _Training, part):
        tr = training.trace
        self.training = training
        self.part = part
        self.inputs = [tr.grad_inputs[j] for j in part.grad_slots]
        self.outputs = [tr.differentiable[p] for p in part.outputs]
        local = {p: q for q, p in enumerate(part.outputs)}
        #: per input, the positions (among this node's outputs) of those reaching it
        self.deps = [[local[p] for p in tr.grad_deps[j] if p in local]
                     for j in part.grad_slots]
        self.whole = len(part.grad_slots) == len(tr.grad_inputs) and \
            len(part.outputs) == len(tr.differentiable)
        #: tangents of symbolic sizes: a backward may take an absent one for its sizes
        self.sized_by_tangents = any(
            free_symbols(n.meta.get("val")) for n in [
                n for n in training.bw_module.graph.nodes if n.op == "placeholder"
            ][training.num_saved:])
        #: present-tangent pattern -> [backward module, positions of its saved values
        #: among the node's, positions of its tangents among the node's outputs,
        #: the compiled backward (boxed) once compiled]
        self.backwards: dict[tuple, list] = {}
        all_present = (True,) * len(self.outputs)
        if self.whole:
            #: positions (in the forward's saved values) of those this node keeps
            self.saved = list(range(training.num_saved))
            self.backwards[all_present] = [training.bw_module, self.saved,
                                           list(range(len(self.outputs))), None]
        else:
            self.saved = None          # set by the first variant: all present
            self._variant(all_present)
        self.function = self._function()

    def _variant(self, present: tuple) -> list:
        entry = self.backwards.get(present)
        if entry is None:
            training = self.training
            n_saved = training.num_saved
            graph, kept = restrict_backward(
                training.bw_module.graph, n_saved, self.part.grad_slots,
                {p for p, on in zip(self.part.outputs, present) if on})
            module = _module(graph, training.trace.constants, "KilnBackward")
            _log_graph(f"backward graph for tangents {present}", module)
            local = {p: q for q, p in enumerate(self.part.outputs)}
            saved = [k for k in kept if k < n_saved]
            if self.saved is None:
                self.saved = saved
            # every variant reads a subset of the all-present one's, which the node keeps
            saved = [self.saved.index(k) for k in saved]
            entry = self.backwards[present] = [
                module, saved, [local[k - n_saved] for k in kept if k >= n_saved], None]
        return entry

    def backward_for(self, present: tuple):
        """(boxed backward, saved positions, tangent positions) of this node when only
        the tangents flagged in ``present`` (one per output) carry a gradient."""
        entry = self._variant(present)
        if entry[3] is None:
            module = entry[0]
            with timed("aot_compile_bw"), trace_dir.within(self.training.trace_owner):
                bw = self.training.bw_compiler(module, _example_values(module.graph))
            boxed = getattr(bw, "call_boxed", None)
            entry[3] = boxed if boxed is not None else (lambda a: bw(*a))
        return entry[3], entry[1], entry[2]

    def _function(self):
        node = self
        n_inputs = len(self.inputs)

        class _CompiledFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, produced, *inputs_and_anchors):
                fw_outs, saved, ctx.witnesses = produced
                ctx.anchors = inputs_and_anchors[n_inputs:]
                kept = [saved[k] for k in node.saved]
                # sizes (ints) the backward reads of symbolic graphs stay on the ctx
                ctx.sizes = {j: v for j, v in enumerate(kept)
                             if not isinstance(v, torch.Tensor) and v is not None}
                ctx.save_for_backward(*(None if j in ctx.sizes else v
                                        for j, v in enumerate(kept)))
                # autograd would fill a zero gradient for every output the loss does
                # not reach, which eager never adds (0 * inf is NaN): the backward is
                # specialised to the gradients that come instead
                ctx.set_materialize_grads(False)
                outs = tuple(fw_outs[k] for k in node.outputs)
                if node.sized_by_tangents:
                    # an absent tangent may be passed for its sizes (grad_parts:
                    # ``_size_carriers``)
                    ctx.out_layouts = [(o.shape, o.dtype, o.device) for o in outs]
                return outs

            @staticmethod
            def backward(ctx, *grads):
                create_graph = torch.is_grad_enabled()
                present = tuple(g is not None for g in grads)
                if not any(present):
                    return (None,) * (1 + n_inputs + len(ctx.anchors))
                ctx.witnesses.check({p for p, on in zip(node.part.outputs, present) if on})
                bw, saved_at, tangents_at = node.backward_for(present)
                ctx.witnesses.check_reads(node.saved[k] for k in saved_at)
                with torch.no_grad(), autocast_suspended():   # casts are in the graph
                    # read only when a tensor is used: a second backward through a node
                    # that saves nothing works in eager, as does one that saves only
                    # sizes (eager's keep them as ints, as ``ctx.sizes`` does)
                    tensors = any(k not in ctx.sizes for k in saved_at)
                    saved = ctx.saved_tensors if tensors else [None] * len(node.saved)
                    if ctx.sizes and saved_at:
                        saved = [ctx.sizes.get(j, v) for j, v in enumerate(saved)]
                    args = [*(saved[k] for k in saved_at),
                            *(grads[q].contiguous() if grads[q] is not None
                              else _size_carrier(ctx.out_layouts[q])
                              for q in tangents_at)]
                    del saved
                    # the backward graph frees each saved activation after its last
                    # reader (a boxed call); the ctx's references would outlive it
                    ctx.maybe_clear_saved_tensors()
                    gin = bw(args)
                result = [None] * (1 + n_inputs + len(ctx.anchors))
                for q, (g, ds) in enumerate(zip(gin, node.deps)):
                    if not any(present[d] for d in ds):
                        continue        # eager's backward never reaches this input
                    if create_graph and g is not None:
                        g = _RefuseDoubleBackward.apply(g, *ctx.anchors)
                    result[1 + q] = g
                return tuple(result)

        return _CompiledFunction

    def __call__(self, args, fw_outs, saved, witnesses):
        ins = [args[i] for i in self.inputs]
        anchors = [_anchor(a) for a in ins if a.requires_grad]
        res = self.function.apply((fw_outs, saved, witnesses), *ins, *anchors)
        for k, r in zip(self.outputs, res):
            fw_outs[k] = r


def _size_carrier(layout) -> torch.Tensor:
    """A zero of an output's shape, dtype and device holding one element: passed for an
    absent tangent that a backward takes for its sizes only (nothing reads it)."""
    shape, dtype, device = layout
    return torch.zeros((), dtype=dtype, device=device).expand(shape)


def _anchor(a: torch.Tensor) -> torch.Tensor:
    """A tensor whose grad_fn leads to input ``a``: with create_graph=True the
    gradients hang from it, so a double backward reaches _RefuseDoubleBackward instead
    of silently missing a term. A leaf (a parameter) is its own anchor; other inputs
    get an empty view-copy holding no data, so the backward does not keep their
    values alive."""
    return a if a.is_leaf else a.as_strided((0,), (1,)).clone()


class _Inference:
    def __init__(self, tr: TraceResult, compiler, in_place: bool = False):
        graph = tr.graph
        self.module = _module(graph, tr.constants, "KilnInference")
        if in_place and tr.mutations:
            # the kernel compiler may write these outputs into their inputs
            # (kernels.runtime.in_place.MUTATIONS); the copy after the call skips them
            self.module.meta["kiln_input_mutations"] = [(i, k) for i, k in tr.mutations]
        _log_graph("inference graph", self.module)
        with timed("aot_compile_inference"):
            self.fn = compiler(self.module, _example_values(graph))

    def __call__(self, args):
        return tuple(self.fn(*args))


class _Eager:
    """A path the tracer cannot express (``AotUnsupported``): its calls run the
    torch-level graph eagerly, which is eager's semantics exactly."""

    def __init__(self, reason: str, break_id=None):
        self.reason = reason
        self.break_id = break_id


class AotFunction:
    """What ``aot_compile`` returns: call it like the torch-level graph."""

    def __init__(self, gm, example_inputs, fw_compiler, bw_compiler, inference_compiler,
                 decompositions=None, devices=None, symbolic=None, specialize=False):
        self.gm = gm
        self.ops = op_set(decompositions)
        # Meta stand-ins and devices only: the real examples are not kept alive.
        self.examples = [_meta_copy(a) if isinstance(a, torch.Tensor) else a
                         for a in example_inputs]
        #: the ShapeEnv of symbolic examples (``symbolic.py``): the graphs serve every
        #: size; a path the symbolic trace cannot serve raises SymbolicUnsupported
        self.shape_env = None
        if symbolic is not None:
            self.examples, self.shape_env = symbolic
        self.devices = list(devices) if devices is not None else [
            a.device if isinstance(a, torch.Tensor) else None for a in example_inputs]
        #: calls run eagerly: the tracer cannot express the graph (``_Eager``), or inputs
        #: share storage with a mutated input in a way it does not model (``_alias_key``)
        self.eager_calls = 0
        #: why calls ran eagerly, each reason once
        self.eager_reasons: list[str] = []
        #: paths traced for inputs sharing storage: alias key -> {pattern: entry}
        self._aliased: dict[tuple, dict] = {}
        #: training paths traced for inputs sharing a version counter with one whose
        #: geometry the graph changes: (partners, pattern, grad) -> (entry, trace)
        self._partnered: dict[tuple, tuple] = {}
        self.fw_compiler = fw_compiler or _default_compiler
        self.bw_compiler = bw_compiler or _default_compiler
        self.inference_compiler = inference_compiler or self.fw_compiler
        if specialize and self.shape_env is not None:
            # compilers of concrete sizes: each graph compiled per size after this trace
            self.fw_compiler, self.bw_compiler, self.inference_compiler = (
                per_size(c) for c in (self.fw_compiler, self.bw_compiler,
                                      self.inference_compiler))
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
        if self.shape_env is not None:
            self._entry = symbolic_entry(self._entry)
            self._aliased_entry = refuse_aliased
            self._partnered_entry = refuse_aliased     # traced per size, as those
        # Compile the path the example inputs ask for now, so errors surface early.
        self._entry(example_inputs)

    def _trace(self, train, pattern=None, aliases=None, grad_at_entry=None, partners=None):
        """The joint graph of one path, or ``_Eager`` where the tracer cannot express it."""
        if self.shape_env is not None:
            return traced_symbolically(lambda: trace_joint(
                self.gm, self.examples, train=train, requires_grad=pattern,
                devices=self.devices, ops=self.ops, aliases=aliases,
                grad_at_entry=grad_at_entry, shape_env=self.shape_env,
                partners=partners), self.shape_env)
        try:
            with timed("aot_trace"):
                return trace_cache.traced(
                    lambda: trace_joint(self.gm, self.examples, train=train,
                                        requires_grad=pattern, devices=self.devices,
                                        ops=self.ops, aliases=aliases,
                                        grad_at_entry=grad_at_entry, partners=partners),
                    self.gm, self.examples, self.devices, self.ops, train=train,
                    pattern=pattern, aliases=aliases, grad_at_entry=grad_at_entry,
                    partners=partners)
        except AotUnsupported as e:
            return _Eager(str(e).split("\n")[0], e.break_id)

    def _entry(self, args):
        """(entry, trace) of the path these arguments take: a ``_Training`` or
        ``_Inference`` with its trace, or an ``_Eager`` (trace None)."""
        grad = torch.is_grad_enabled()
        # without grad mode (nor a graph turning it on) the path is inference whatever
        # requires grad: the pattern, a read per input, is not needed
        pattern = tuple([isinstance(a, torch.Tensor) and a.requires_grad for a in args]) \
            if grad or self._enables_grad else ()
        key = (pattern, grad)   # the grad mode the graph starts in
        if any(pattern) and key not in self._gradless:
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
            # inputs here share no storage with a mutated one (checked per call)
            self._inference = _Inference(tr, self.inference_compiler, in_place=True)
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

    def _partnered_entry(self, args, partners):
        """The training path for inputs sharing a version counter with one whose geometry
        the graph changes in place (``_version_partners``), traced on first use."""
        key = (partners, tuple([isinstance(a, torch.Tensor) and a.requires_grad
                                for a in args]), torch.is_grad_enabled())
        path = self._partnered.get(key)
        if path is None:
            tr = self._trace(True, key[1], grad_at_entry=key[2],
                             partners={i: js for i, js in partners})
            if isinstance(tr, _Eager):
                path = tr, None
            elif tr.grad_inputs:
                path = _Training(tr, self.fw_compiler, self.bw_compiler), tr
            else:   # not met: the trace without partners had grad inputs (same pattern)
                path = _Eager("inputs share a version counter with one whose geometry "
                              "the graph changes in place", "K0112"), None
            self._partnered[key] = path
        return path

    def __call__(self, *args):
        entry, tr = self._entry(args)
        if tr is not None and tr.mutations and _shares_storage_with_mutated(
                args, tr.mutations, empty := isinstance(entry, _Training)):
            key = _alias_key(args, tr.mutations, empty)
            if key is None:
                return self._run_eagerly(args, "K0112", "inputs share storage with an input the "
                                               "graph mutates in place")
            entry, tr = self._aliased_entry(args, key)
        if isinstance(entry, _Training) and tr.meta_mutations:
            partners = _version_partners(args, tr.meta_mutations)
            if partners is not None:
                if tr.mutations and _shares_storage_with_mutated(args, tr.mutations, True):
                    return self._run_eagerly(args, "K0112", "inputs share storage with an "
                                             "input the graph mutates in place and with "
                                             "one whose geometry it changes in place")
                entry, tr = self._partnered_entry(args, partners)
        if isinstance(entry, _Eager):
            return self._run_eagerly(args, entry.break_id, entry.reason)
        if tr.storage_inputs and any(args[i].storage_offset() for i in tr.storage_inputs):
            return self._run_eagerly(args, "K0113", "the graph addresses the storage of an input "
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
        if tr.witnesses and isinstance(entry, _Training):
            entry.unsettled.settle()
        if tr.symbolic_steps:
            tr = concrete_steps(tr, args)
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
                result.append(replay_in_modes(spec[2], spec[3], args[spec[1]]))
            elif kind == "base_view":
                result.append(replay_in_modes(spec[2], spec[3], outs[spec[1]]))
            elif kind == "input":
                result.append(None)          # after the geometry changes, below
            else:
                result.append(spec[1])
        for i, op, rest, kwargs, grad in tr.meta_mutations:
            with torch.set_grad_enabled(torch.is_grad_enabled() if grad is None else grad):
                op(args[i], *rest, **kwargs)
        if tr.witnesses and isinstance(entry, _Training):
            entry.unsettled.settle()        # again: after the geometry changes too
        for k, spec in enumerate(tr.output_specs):
            if spec[0] == "input":
                result[k] = args[spec[1]]
        return tuple(result)

    def _run_eagerly(self, args, break_id, reason):
        """Run the torch-level graph eagerly (exactly eager's semantics), for calls the
        compiled graphs would not reproduce; each reason (tagged with its ``break_id``)
        is logged once."""
        tagged = tag(break_id, reason)
        if tagged not in self.eager_reasons:
            self.eager_reasons.append(tagged)
            _fallback_log.warning("kiln: running a compiled graph eagerly: %s", describe(break_id, reason))
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
    written = [args[i] for i, k in mutations if outs[k] is args[i]]
    if written:
        # written in place by the compiled graph (kernels/runtime/in_place.py): only
        # autograd's record of the write is left, as a kernel of its own would leave it
        torch.autograd.graph.increment_version(written)
    for i, k in mutations:
        if outs[k] is args[i]:
            continue
        if not outs[k].requires_grad:
            dst, src = groups.setdefault((args[i].device, args[i].dtype, outs[k].dtype),
                                         ([], []))
            dst.append(args[i])
            src.append(outs[k])
    if groups:
        with torch.no_grad():
            for dst, src in groups.values():
                torch._foreach_copy_(dst, src)
    # recorded by autograd as eager recorded the write (the graph may have turned grad
    # mode on for it inside a call made with grad off)
    with torch.enable_grad():
        for i, k in mutations:
            if outs[k].requires_grad and outs[k] is not args[i]:
                args[i].copy_(outs[k])


def _storage_key(a: torch.Tensor, empty: bool):
    """Which storage ``a`` is a view of, for grouping arguments: its address, or with
    ``empty`` for a storage of no bytes (whose address says nothing) the storage itself,
    which its views share with their version counter; None where left out."""
    st = a.untyped_storage()
    if st.nbytes():
        return st.data_ptr()
    return ("empty", st._cdata) if empty else None


def _shares_storage_with_mutated(args, mutations, empty=False) -> bool:
    """Does a tensor argument the graph mutates share its storage with another one?

    First the common answer, cheaply (an optimizer step passes hundreds of tensors
    every call): the storages' addresses, computed from each tensor's own, all differ.
    Tensors of no elements read and write nothing; they are counted with ``empty``
    only (a training call): the write-back of a mutation still bumps the version
    counter every view of the written tensor shares, after the forward saved what the
    backward needs, where eager bumps it at the op: a saved view of a written one of
    no elements would fail the backward (fuzz seed 2011)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    starts = [a.data_ptr() - a.storage_offset() * a.element_size()
              for a in tensors if a.numel()]
    if len(set(starts)) == len(starts) and (not empty or len(starts) == len(tensors)):
        return False
    owners: dict = {}
    for a in tensors:
        key = _storage_key(a, empty)
        if key is not None:
            owners[key] = owners.get(key, 0) + 1
    for i, _ in mutations:
        key = _storage_key(args[i], empty)
        if key is not None and owners.get(key, 0) > 1:
            return True
    return False


def _version_partners(args, meta_mutations):
    """Which tensor arguments share their version counter (their storage: views of one
    tensor) with an input whose geometry the graph changes in place, as a hashable
    ``((i, (j, ...)), ...)``, or None when none does (the common case).

    The runtime replays such a change after the forward, bumping the version of every
    view of the tensor, which eager bumps at the op: a view of a partner saved for the
    backward would then be refused by autograd, though eager saved it after the bump."""
    changed = {m[0] for m in meta_mutations}
    groups: dict[int, list[int]] = {}
    for j, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            groups.setdefault(a.untyped_storage()._cdata, []).append(j)
    if len(groups) == sum(len(g) for g in groups.values()):
        return None
    key = []
    for i in sorted(changed):
        members = groups.get(args[i].untyped_storage()._cdata, [])
        if len(members) > 1:
            key.append((i, tuple(j for j in members if j != i)))
    return tuple(key) if key else None


def _alias_key(args, mutations, empty=False):
    """How tensor arguments share storage with the inputs the graph writes, as a
    hashable key ``((base, member, geometry), ...)`` for ``trace_joint(aliases=...)``,
    or None when the tracer cannot model it (the call then runs eagerly).

    Modelled: in each group of arguments sharing a storage with a written input, one
    *base* (contiguous, storage offset 0) holds every other member's elements (same
    dtype, within its numel), and no member requires grad (a member traced as a view
    of the base would route its gradient into the base's). A member with the base's
    very geometry is the same tensor (geometry None). ``empty``: storages of no bytes
    are grouped too (``_shares_storage_with_mutated``)."""
    groups: dict = {}
    for j, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            ptr = _storage_key(a, empty)
            if ptr is not None:
                groups.setdefault(ptr, []).append(j)
    key = []
    done = set()
    for i, _ in mutations:
        ptr = _storage_key(args[i], empty)
        members = groups.get(ptr, []) if ptr is not None else []
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
                inference_compiler=None, decompositions=None, devices=None, symbolic=None,
                specialize=False):
    """Ahead-of-time autograd for a torch-level graph: see the module docstring.
    Each compiler is ``compiler(aten_gm, example_inputs) -> callable`` (default: run
    the aten graph as it is). ``decompositions``: the op set profile, "core" (the
    default: core aten, what the kernel compiler lowers) or "eager" (ops with efficient
    aten kernels kept whole, for running the graphs op by op; ``ops.OpSet``).
    ``devices``: the real device of each input when ``example_inputs`` are meta
    stand-ins (tracing a CUDA program on a machine without a GPU). ``symbolic``:
    (examples with symbolic sizes, their ShapeEnv) from ``symbolic.symbolic_examples``;
    without it, a graph whose placeholders carry symbolic sizes (``kiln_sym``) is traced
    symbolically all the same, its graphs then compiled per concrete size
    (``specialize``: the compilers take plain int sizes; ``specialize.per_size``)."""
    if symbolic is None and capture_env(gm) is not None:
        return aot_compile_dynamic(gm, example_inputs, specialize=True, fw_compiler=fw_compiler,
                                   bw_compiler=bw_compiler,
                                   inference_compiler=inference_compiler,
                                   decompositions=decompositions, devices=devices)
    return AotFunction(gm, example_inputs, fw_compiler, bw_compiler, inference_compiler,
                       decompositions, devices, symbolic, specialize)
