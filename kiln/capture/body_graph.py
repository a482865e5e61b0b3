"""Tracing a function into a graph of its own, inside the trace of its caller.

A ``torch.func`` transform runs its function in a world of its own (one sample under
``vmap``, differentiable inputs under ``grad``), so that function cannot be inlined
into the caller's graph: it is traced into a *body* graph, which a single node of the
caller's graph then hands to the transform (``func_transforms``).

``BodyGraph`` stands in for the caller's ``OutputGraph`` while the body is traced
(``trace_body`` swaps it in as ``tx.output``). It shares everything that is about the
program — guards, the one Value per real object, graph inputs read from sources — and
keeps its own graph, grad mode and side-effect list. Tensors of the caller's graph that
the body uses (closures, globals, module parameters) are *lifted*: each becomes a
placeholder of the body, and the caller passes it in after the body's arguments.

What the body cannot do, because the transform would see it differently from a plain
call: change Python state (it would be replayed once, outside the transform, with
transform-level tensors in it), or write in place into a tensor it did not create
(an input or a lifted tensor). Both are graph breaks. Tensors made in the body are
unusable outside it (``_BodyTensor``): one that escapes through a container is a
graph break where it is used.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.output import OutputGraph


class BodyGraph(OutputGraph):
    """The graph of a function traced for a transform; see the module docstring."""

    in_transform = True

    def __init__(self, parent: OutputGraph, grad_enabled: bool, what: str):
        # not OutputGraph.__init__: guards and graph inputs are the parent's
        self.parent = parent
        self.what = what                    # "the function given to torch.func.grad"
        self.graph = fx.Graph()
        self._value_by_fake: dict = {}
        self.mutated: list = []
        self.grad_enabled = grad_enabled
        self.entry_grad_enabled = grad_enabled
        self.grad_blocks: list = []
        self._unwind_modes: set = set()
        self.lifted: list = []              # (caller's TensorValue, body placeholder Value)
        self._lifted_by_node: dict = {}
        self._args: list = []               # the body's own argument placeholders
        self._versions: list = []           # (fake, version when it entered the body)

    def __getattr__(self, name):
        # everything about the program (guards, objects, cells, globals) is the caller's
        return getattr(self.parent, name)

    # --- inputs ------------------------------------------------------------------------
    def input_tensor(self, real, source):
        return self.parent.input_tensor(real, source)

    def argument(self, fake, name: str) -> V.TensorValue:
        """A placeholder for one tensor the transform passes to the function."""
        node = self._placeholder(name)
        node.meta["example_value"] = fake
        tv = V.TensorValue(node, fake)
        self._value_by_fake[id(fake)] = tv
        self._args.append(tv)
        self._versions.append((fake, fake._version))
        return tv

    def _placeholder(self, name):
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first is None:
            return self.graph.placeholder(self._fresh(name))
        with self.graph.inserting_before(first):
            return self.graph.placeholder(self._fresh(name))

    def _lift(self, v):
        if isinstance(v, V.TensorValue):
            if v.node.graph is self.graph:
                return v
            known = self._lifted_by_node.get(v.node)
            if known is None:
                node = self._placeholder("lifted_" + v.node.name)
                node.meta["example_value"] = v.fake
                known = V.TensorValue(node, v.fake)
                self._lifted_by_node[v.node] = known
                self.lifted.append((v, known))
                self._value_by_fake[id(v.fake)] = known
                self._versions.append((v.fake, v.fake._version))
            return known
        if isinstance(v, V.NamedTupleValue):
            return v if not any(isinstance(i, V.TensorValue) for i in v.items) else \
                _unsupported("a named tuple of tensors from outside a torch.func body")
        if isinstance(v, V.TupleValue):
            return V.TupleValue([self._lift(i) for i in v.items])
        if isinstance(v, V.ListValue):
            return V.ListValue([self._lift(i) for i in v.items])
        if isinstance(v, V.DictValue):
            return V.DictValue({k: self._lift(i) for k, i in v.items.items()})
        return v

    # --- ops and state ----------------------------------------------------------------
    def op(self, kind, target, args, kwargs):
        args = [self._lift(a) for a in args]
        kwargs = {k: self._lift(v) for k, v in kwargs.items()}
        return super().op(kind, target, args, kwargs)

    def mark_mutated(self, v):
        self.mutated.append(v)

    def finish(self, outputs: list) -> fx.GraphModule:
        """Close the body over ``outputs`` (TensorValues); check what it must not do."""
        if self.mutated:
            raise Unsupported("K0035", f"{self.what} changes Python state (a transform would replay it "
                              "with its own tensors)")
        for fake, version in self._versions:
            if fake._version != version:
                raise Unsupported("K0035", f"{self.what} writes in place into a tensor it did not create "
                                  "(an input or a captured tensor)")
        for v in outputs:
            if v.node.graph is not self.graph:
                raise Unsupported("K0035", f"{self.what} returns a tensor from outside")
        self.graph.output(tuple(v.node for v in outputs))
        self.graph.lint()
        gm = fx.GraphModule(torch.nn.Module(), self.graph, class_name="TransformBody")
        for v in list(self._value_by_fake.values()):
            if v.node.graph is self.graph:
                v.__class__ = _BodyTensor
        return gm


class _BodyTensor(V.TensorValue):
    """A tensor made inside a transform's body, reached after the body ended (stored in
    a container of the caller): it stands for a per-sample or transform-level tensor that
    the caller never sees, so any use is a graph break."""

    @property
    def node(self):
        raise Unsupported("K0035", "a tensor made inside a torch.func transform's function is used "
                          "outside it")

    @node.setter
    def node(self, value):
        self.__dict__["node"] = value

    @property
    def fake(self):
        raise Unsupported("K0035", "a tensor made inside a torch.func transform's function is used "
                          "outside it")

    @fake.setter
    def fake(self, value):
        self.__dict__["fake"] = value


def trace_body(tx, body: BodyGraph, fn_value, args, kwargs):
    """Call ``fn_value`` with ``body`` as the trace's output graph; the caller's graph
    comes back whatever happens."""
    saved = tx.output
    tx.output = body
    try:
        return fn_value.call(tx, list(args), dict(kwargs))
    except UserException as e:
        # raised inside the transform: what the body did before it (Python state it
        # changed) is not replayed, so the caller cannot go on from here in a graph
        raise Unsupported("K0035", f"{body.what} raises {e.value.cls.__name__}") from None
    finally:
        tx.output = saved


def _unsupported(msg):
    raise Unsupported("K0035", msg)
