"""A graph and its input specs as a standalone ``repro.py``.

The graph is written as the ``torch.fx`` calls that rebuild it node by node (exact: no
tracing of a module, which would run grad-mode switches instead of recording them),
with its readable forward code above as a comment. Targets are written by their import
path (``torch.ops.aten.relu.default``, ``operator.getitem``); a target that cannot be
named from an importable module makes the graph unwritable (``Unwritable``), since the
file must not depend on the user's code. Tensor constants (``get_attr``) are written as
literals. ``load(source)`` runs the same text, which is how the minifier tests each
candidate: what it tested is what the file holds.
"""
from __future__ import annotations

import importlib
import math
import textwrap

import torch
import torch.fx as fx


class Unwritable(Exception):
    """The graph holds something a standalone file cannot name."""


#: Namespaces whose C functions have no ``__module__`` (``torch.relu``), by path.
_C_NAMESPACES = ("torch", "torch.nn.functional", "torch._C._nn", "torch.special",
                 "torch.linalg", "torch.fft", "torch._C", "torch.Tensor")


def _importable(obj) -> tuple[str, str] | None:
    """(module, qualified name) under which ``obj`` can be imported back."""
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    name = getattr(obj, "__name__", None)
    if mod and name and getattr(importlib.import_module(mod), name, None) is obj:
        return mod, name
    if mod is None and name:
        for path in _C_NAMESPACES:
            ns = importlib.import_module(path) if path != "torch.Tensor" else torch.Tensor
            if getattr(ns, obj.__name__, None) is obj:
                return (path, obj.__name__) if path != "torch.Tensor" else ("torch", f"Tensor.{obj.__name__}")
        return None
    if not mod or not qual or "<" in qual:
        return None
    if mod == "builtins":
        return mod, qual
    try:
        found = importlib.import_module(mod)
        for part in qual.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return (mod, qual) if found is obj else None


class _Names:
    """The import lines a graph's targets and constants need."""

    def __init__(self):
        self.imports = {"import torch"}

    def target(self, t) -> str:
        if isinstance(t, str):
            return repr(t)
        if isinstance(t, torch._ops.OpOverload):
            ns, name = t._schema.name.split("::")
            return f"torch.ops.{ns}.{name}.{t._overloadname}"
        if isinstance(t, torch._ops.OpOverloadPacket):
            ns, name = t._qualified_op_name.split("::")
            return f"torch.ops.{ns}.{name}"
        where = _importable(t)
        if where is None:
            raise Unwritable(f"cannot name {t!r} in a standalone file")
        mod, qual = where
        if mod == "builtins":
            return qual
        top = mod.split(".")[0]
        if top == "torch":
            return f"{mod}.{qual}"
        self.imports.add(f"import {mod}")
        return f"{mod}.{qual}"

    def const(self, v, nodes: dict) -> str:
        if isinstance(v, fx.Node):
            return nodes[v]
        if isinstance(v, (list, tuple)):
            inner = ", ".join(self.const(x, nodes) for x in v)
            if isinstance(v, list):
                return f"[{inner}]"
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {self.const(x, nodes)}" for k, x in v.items()) + "}"
        if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
            return f"float({str(v)!r})"
        if v is None or isinstance(v, (bool, int, float, str, complex)):
            return repr(v)
        if isinstance(v, torch.dtype):
            return str(v)
        if isinstance(v, torch.device):
            return f"torch.device({str(v)!r})"
        if isinstance(v, (torch.layout, torch.memory_format)):
            return str(v)
        if isinstance(v, slice):
            return f"slice({self.const(v.start, nodes)}, {self.const(v.stop, nodes)}, " \
                   f"{self.const(v.step, nodes)})"
        if v is Ellipsis:
            return "Ellipsis"
        raise Unwritable(f"cannot write the constant {v!r} ({type(v).__name__})")


def _tensor_literal(t: torch.Tensor) -> str:
    if t.numel() > 100_000:
        raise Unwritable(f"a constant of {t.numel()} elements is too large to write")
    data = t.detach().cpu()
    return (f"torch.tensor({data.tolist()!r}, dtype={data.dtype}).reshape({tuple(t.shape)!r})"
            f".to({str(t.device)!r})")


def graph_source(gm: fx.GraphModule) -> str:
    """Python statements building ``gm`` as ``gm`` (a GraphModule) from scratch."""
    names = _Names()
    lines = ["root = torch.nn.Module()", "g = torch.fx.Graph()"]
    nodes: dict = {}
    for i, n in enumerate(gm.graph.nodes):
        var = f"n{i}"
        if n.op == "placeholder":
            lines.append(f"{var} = g.placeholder({n.name!r})")
        elif n.op == "get_attr":
            value = gm
            for part in n.target.split("."):
                value = getattr(value, part)
            if not isinstance(value, torch.Tensor):
                raise Unwritable(f"attribute {n.target} is a {type(value).__name__}")
            attr = f"c{i}"
            lines.append(f"root.register_buffer({attr!r}, {_tensor_literal(value)})")
            lines.append(f"{var} = g.get_attr({attr!r})")
        elif n.op in ("call_function", "call_method"):
            args = names.const(tuple(n.args), nodes)
            kwargs = names.const(dict(n.kwargs), nodes)
            lines.append(f"{var} = g.{n.op}({names.target(n.target)}, {args}, {kwargs})")
        elif n.op == "output":
            lines.append(f"g.output({names.const(n.args[0], nodes)})")
        else:
            raise Unwritable(f"cannot write a {n.op} node ({n.target})")
        nodes[n] = var
    lines.append("gm = torch.fx.GraphModule(root, g)")
    return "\n".join(sorted(names.imports)) + "\n\n" + "\n".join(lines) + "\n"


def load(source: str) -> fx.GraphModule:
    """Run ``graph_source``'s text; the GraphModule it builds."""
    ns: dict = {}
    exec(compile(source, "<kiln repro graph>", "exec"), ns)
    return ns["gm"]


#: The kiln settings that change what a stage compiles; a repro sets them as they were.
CONFIG_KEYS = ("inject_bug", "kernel_target", "fallback_random", "small_matmul_macs",
               "matmul_epilogue", "partition_recompute", "cudagraphs", "autotune_min_numel",
               "graph_cache", "pad_mm", "pad_mm_min_flops")


def repro_source(gm, specs, stage, level, backend=None, target=None, expected="",
                 note="") -> str:
    """The whole ``repro.py``."""
    from kiln import config
    settings = {k: getattr(config, k) for k in CONFIG_KEYS}
    if target == "triton" or settings["kernel_target"] == "triton":
        note += "\nTriton kernels on CPU tensors run under TRITON_INTERPRET=1."
    body = graph_source(gm)
    try:
        readable = gm.code.strip()
    except Exception:  # noqa: BLE001 -- only a comment
        readable = "(no readable code)"
    header = [
        f'"""kiln minifier repro: {stage} stage, {level} level.',
        "",
        f"Fails with: {expected}" if expected else "",
        note,
        "Run alone: `python repro.py` exits non-zero while the failure reproduces.",
        '"""',
    ]
    return "\n".join(
        [line for line in header if line is not None]
        + ["", "# The graph, as readable code:"]
        + [f"# {line}" for line in readable.splitlines()]
        + ["", body,
           f"INPUTS = {specs!r}",
           f"CONFIG = {settings!r}  # kiln settings when the failure was seen",
           "",
           "if __name__ == '__main__':",
           "    from kiln.debug import repro_runtime",
           textwrap.indent(
               f"raise SystemExit(repro_runtime.run(gm, INPUTS, {stage!r}, {level!r}, "
               f"backend={backend!r}, target={target!r}, expected={expected!r}, "
               f"settings=CONFIG))", "    "),
           ""])
