"""``kiln.CompileProfiler``: a backend that counts what compiling a whole run produced.

Pass it as the backend (``kiln.compile(fn, backend=prof)``); it compiles each graph with
a real backend underneath (``eager`` unless told otherwise) and, through the recorder
kiln.compile gives the functions it compiles (``kiln_recorder``), sees every graph
break with its ID and user line, every frame run eagerly and every recompile with the
guard that failed. ``report()`` is the summary: what to fix first is the break ID that
occurs most.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from kiln.backends import lookup_backend
from kiln.capture.eval_frame import Recorder
from kiln.debug.breaks import BREAKS, tag

_CALLS = ("call_function", "call_method", "call_module")


class CompileProfiler:
    """``prof = kiln.CompileProfiler(); kiln.compile(fn, backend=prof)(...);
    print(prof.report())``. ``backend``: what really compiles the graphs (a name or a
    callable)."""

    def __init__(self, backend="eager"):
        self.backend = backend
        self._inner = lookup_backend(backend)
        #: read by kiln.compile: the functions compiled with this backend record into it
        self.kiln_recorder = Recorder()
        #: per graph the backend was given: the names of its ops
        self.graph_ops: list[list[str]] = []
        self._compiled = []

    # --- the backend ---------------------------------------------------------------
    def __call__(self, gm, example_inputs):
        self.graph_ops.append([_op_name(n) for n in gm.graph.nodes if n.op in _CALLS])
        compiled = self._inner(gm, example_inputs)
        self._compiled.append(compiled)
        return compiled

    def prepare(self, args):
        """The real backend's one-time set-up, where it has one."""
        prepare = getattr(self._inner, "prepare", None)
        if prepare is not None:
            prepare(args)

    # --- what it saw ---------------------------------------------------------------
    @property
    def graph_count(self) -> int:
        return len(self.graph_ops)

    frame_count = graph_count      # the name PyTorch's profiler uses

    @property
    def op_count(self) -> int:
        return sum(len(ops) for ops in self.graph_ops)

    @property
    def breaks(self) -> list:
        """Every graph break (``BreakInfo``: break_id, reason, user_stack)."""
        return list(self.kiln_recorder.breaks)

    def breaks_by_id(self) -> dict[str, list]:
        """Break ID -> its breaks, the most frequent ID first."""
        groups = defaultdict(list)
        for b in self.kiln_recorder.breaks:
            groups[b.break_id or "?"].append(b)
        return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))

    @property
    def frames_run_eagerly(self) -> list[tuple]:
        """(function name, break ID, reason) per frame kiln ran eagerly."""
        return list(self.kiln_recorder.skip_infos)

    @property
    def recompiles(self) -> list[tuple]:
        """(function "name (file:line)", the guard that failed) per recompile."""
        return list(self.kiln_recorder.recompiles)

    def graph_fallbacks(self) -> list[str]:
        """Why graphs (or some of their calls) ran eagerly in the autograd stage."""
        return [r for c in self._compiled for r in getattr(c, "eager_reasons", ())]

    def get_metrics(self) -> dict:
        return {"graphs": self.graph_count, "ops": self.op_count,
                "graph_breaks": len(self.kiln_recorder.breaks),
                "break_ids": dict(Counter(b.break_id for b in self.kiln_recorder.breaks)),
                "frames_run_eagerly": len(self.kiln_recorder.skip_infos),
                "recompiles": len(self.kiln_recorder.recompiles),
                "graph_fallbacks": len(self.graph_fallbacks())}

    def report(self) -> str:
        be = self.backend if isinstance(self.backend, str) else getattr(self.backend, "__name__", "custom")
        lines = [f"kiln CompileProfiler (backend {be})",
                 f"Graphs: {self.graph_count}, ops: {self.op_count}"]
        for i, ops in enumerate(self.graph_ops, 1):
            shown = ", ".join(ops[:8]) + (f", ... ({len(ops)} ops)" if len(ops) > 8 else "")
            lines.append(f"  graph {i}: {shown}")
        groups = self.breaks_by_id()
        lines.append(f"Graph breaks: {len(self.kiln_recorder.breaks)} "
                     f"({len(groups)} distinct ID{'s' if len(groups) != 1 else ''})")
        for bid, bs in groups.items():
            info = BREAKS.get(bid)
            lines.append(f"  [{bid}] {info.title if info else 'unregistered'}: {len(bs)}")
            if info:
                lines.append(f"    hint: {info.hint}")
            seen = Counter((b.reason, b.user_stack[-1] if b.user_stack else "?") for b in bs)
            for (reason, where), n in seen.items():     # a break met again on a recompile: once
                lines.append(f"    - {reason}" + (f" (x{n})" if n > 1 else ""))
                lines.append(f"      at {where}")
        skips = self.kiln_recorder.skip_infos
        lines.append(f"Frames run eagerly: {len(skips)}")
        for name, bid, reason in skips:
            lines.append(f"  {name}: {tag(bid, reason)}")
        fallbacks = self.graph_fallbacks()
        if fallbacks:
            lines.append(f"Graphs run eagerly: {len(fallbacks)}")
            lines += [f"  {r}" for r in fallbacks]
        recompiles = self.kiln_recorder.recompiles
        lines.append(f"Recompiles: {len(recompiles)}")
        for where, guard in recompiles:
            lines.append(f"  {where}: guard failed: {guard}")
        return "\n".join(lines)

    def __repr__(self):
        return (f"CompileProfiler(graphs={self.graph_count}, breaks={len(self.kiln_recorder.breaks)}, "
                f"recompiles={len(self.kiln_recorder.recompiles)})")


def _op_name(node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))
