"""Which backends take a graph whose sizes are symbolic as it is, and
``PerSizeCompiled`` for those that need concrete sizes: the one captured graph compiled
once per distinct signature of input sizes, strides and int values, on first use (the
variants in ``shapes/variants.SizeVariants``: least recently used dropped beyond
``config.dynamic_specializations``; a stream cycling past that runs the captured graph
as it is for new sizes); symbolic int inputs folded into the
graph as constants, the backend then taking the tensors alone. aot_eager and kiln trace
autograd once symbolically (``autograd/symbolic.py``) and come here only for a graph
that trace cannot serve."""
from __future__ import annotations

import copy
import logging

import torch
import torch.fx as fx

from kiln import config
from kiln.shapes.variants import SizeVariants


def _signature(args):
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor)
                 else ("int", a) for a in args)


def _with_ints_folded(gm, args):
    """A copy of ``gm`` whose int placeholders are the constants in ``args``."""
    if not any(not isinstance(a, torch.Tensor) for a in args):
        return gm
    graph = copy.deepcopy(gm.graph)
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    for ph, a in zip(phs, args):
        if not isinstance(a, torch.Tensor):
            ph.replace_all_uses_with(a)
            graph.erase_node(ph)
    out = fx.GraphModule(gm, graph)
    out.meta = dict(getattr(gm, "meta", {}))
    return out


class PerSizeCompiled:
    """``backend`` applied to ``gm`` for each signature of arguments it is called on."""

    def __init__(self, backend, gm, compile_graph):
        self.backend = backend
        self.gm = gm
        self.compile_graph = compile_graph    # backend_call.compile_graph, errors named
        self.variants = SizeVariants()

    @property
    def compiled(self):
        """The variants kept, by signature (least recently used first)."""
        return self.variants.table

    def _for(self, args, first=False):
        """The callable for these arguments' signature and whether it takes the tensors
        only (a compiled one) or every argument (the graph itself)."""
        key = _signature(args)
        hit = self.variants.get(key)
        if hit is not None:
            return hit
        if not self.variants.admit():
            # the stream cycles past the bound: the captured graph as it is, not compiled
            # (compiling would drop a variant it comes back to: a compile every call)
            self.variants.uncompiled_calls += 1
            return self.gm.forward, False
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        try:
            hit = (self.compile_graph(self.backend, without_symbols(_with_ints_folded(self.gm, args)),
                                      tensors), True)
        except Exception as e:  # noqa: BLE001  (the first size's failure is the compile's own)
            if first or not config.suppress_errors:
                raise
            # a later size the backend fails on runs the captured graph as it is
            logging.getLogger("kiln").warning("kiln: the backend failed on new sizes %s; "
                                              "running the captured graph for them: %s", key, e)
            hit = (self.gm.forward, False)
        return self.variants.put(key, hit)

    def __call__(self, *args):
        fn, tensors_only = self._for(args)
        return fn(*[a for a in args if isinstance(a, torch.Tensor)]) if tensors_only else fn(*args)


def _is_kiln_backend(backend) -> bool:
    """The kernel compiler's backend: its autograd stage traces the symbolic graph once
    and compiles the aten graphs per size (``autograd/specialize.py``)."""
    return getattr(backend, "__module__", None) == "kiln.kernels.backend" and \
        getattr(backend, "__name__", None) == "kiln_backend"


def wants_concrete_sizes(backend) -> bool:
    """kiln's own backends that trace with plain ints (not the eager one, which runs
    the graph as it is, nor a user's backend, which gets the symbolic graph)."""
    if getattr(backend, "kiln_symbolic", False) or _is_kiln_backend(backend):
        return False    # aot_eager and kiln: autograd traced once symbolically
    mod = getattr(backend, "__module__", None) or ""
    return mod.startswith(("kiln.autograd", "kiln.kernels"))


def without_symbols(gm):
    """A copy of ``gm`` whose placeholders carry no symbolic sizes (``kiln_sym``): a
    backend that would trace them symbolically traces the concrete examples."""
    if not any("kiln_sym" in n.meta for n in gm.graph.nodes if n.op == "placeholder"):
        return gm
    graph = copy.deepcopy(gm.graph)
    for n in graph.nodes:
        n.meta.pop("kiln_sym", None)
    out = fx.GraphModule(gm, graph)
    out.meta = dict(getattr(gm, "meta", {}))
    return out
