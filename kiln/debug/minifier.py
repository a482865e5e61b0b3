"""The minifier (``KILN_REPRO_AFTER``, ``KILN_REPRO_LEVEL``): a stage's graphs are
checked as they compile and run; when one fails, kiln shrinks it to the smallest graph
that still fails the same way and writes a standalone ``repro.py``.

Stages (where the graph is taken, and what the repro runs on it, ``repro_runtime``):
``capture`` the torch-level graph handed to the backend (hooked in
``capture/backend_call.py``); ``autograd`` the aten graphs the autograd stage hands to
the kernel compiler (``kernels/backend.py``); ``kernels`` every graph the kernel
compiler builds (``kernels/compile.py``), its kernels run directly. Levels: ``error``
(compiling or running raises, and eager does not raise the same exception type) or
``accuracy`` (also: a result or a written input differs from eager's beyond
``repro_runtime.TOLERANCE``; graphs with random ops are checked only with
``fallback_random``, since kiln's kernels draw other random numbers than eager).

While checking, ``suppress_errors`` is off inside the stage, so its own eager fallbacks
do not hide the failure; once a failure is reported the user's setting decides again (a
kernel-level graph then runs eagerly, or the error is raised; a capture-level error
goes on to the capture's handling). At accuracy level every checked call returns
eager's result, computed on the real inputs (the compiled graph runs on copies).

Shrinking is delta debugging (ddmin) over *units* — an op and the ``getitem``s taking
its results apart. A candidate keeps some units; a value they read from a dropped one
becomes a new input of the recorded geometry, and inputs nothing reads go. Each
candidate is written with ``repro_writer`` and run as the file would run it, on random
inputs of the recorded shapes, strides and dtypes (``repro_runtime.outcome``); a
failure that random inputs do not reproduce is logged, and no file is written.
"""
from __future__ import annotations

import logging
import operator
import os
import threading

import torch
import torch.fx as fx

from kiln import config
from kiln.debug import repro_runtime as rr
from kiln.debug import repro_writer

log = logging.getLogger("kiln.minifier")
_busy = threading.local()
_written: list = []


def active(stage: str) -> bool:
    """Whether graphs of ``stage`` are checked now (never while minifying)."""
    after = config.repro_after
    if not after:
        return False
    if after not in rr.STAGES:
        raise ValueError(f"unknown KILN_REPRO_AFTER {after!r}; known: {', '.join(rr.STAGES)}")
    if config.repro_level not in rr.LEVELS:
        raise ValueError(f"unknown KILN_REPRO_LEVEL {config.repro_level!r}; "
                         f"known: {', '.join(rr.LEVELS)}")
    return after == stage and not getattr(_busy, "on", False)


def stage_compiler(stage: str, compiler):
    """``compiler(gm, example_inputs)``, its graphs checked when ``stage`` is active."""
    def checked(gm, example_inputs):
        if not active(stage):
            return compiler(gm, example_inputs)
        return Checked(stage, gm, lambda: compiler(gm, example_inputs), example_inputs)

    return checked


def backend_name(backend) -> str | None:
    """The registered name of ``backend`` (a repro names it; the user's code it cannot)."""
    from kiln import backends

    for name, entry in backends._registry.items():
        if entry is backend:
            return name
        if isinstance(entry, str) and getattr(backend, "__module__", None) \
                and entry == f"{backend.__module__}.{backend.__name__}":
            return name
    return None


def _real(values) -> bool:
    return not any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in values)


class Checked:
    """A stage's compiled graph whose compile and calls are checked against eager."""

    def __init__(self, stage, gm, make, example_inputs, backend=None, target=None):
        self.stage, self.gm, self.backend, self.target = stage, gm, backend, target
        self.reported = False
        self.eager_only = False
        try:
            with config.patch(suppress_errors=False):
                self.inner = make()
        except Exception as e:  # noqa: BLE001 -- reported, then as the stage would
            self._report("error", e, list(example_inputs))
            if stage == "capture" or not config.suppress_errors:
                raise
            self._go_eager(e)

    def _go_eager(self, why):
        log.warning("kiln: a graph of the %s stage failed (%s: %s); it runs eagerly from now on",
                    self.stage, type(why).__name__, why)
        self.eager_only = True

    def __call__(self, *args):
        return self._call(list(args))

    def call_boxed(self, args: list):
        inputs = list(args)
        args.clear()
        return self._call(inputs)

    def _call(self, args):
        if self.eager_only:
            return self.gm(*args)
        if self.reported:
            return self.inner(*args)
        if config.repro_level == "accuracy":
            if _random(self.gm) and not config.fallback_random:
                log.warning("kiln minifier: a graph of the %s stage has random ops, whose "
                            "values kiln's kernels draw differently from eager's; its "
                            "accuracy is not checked (set KILN_FALLBACK_RANDOM=1 to check it)",
                            self.stage)
                self.reported = True
                return self.inner(*args)
            return self._checked_accuracy(args)
        try:
            return rr.call_compiled(self.inner, args)
        except Exception as e:  # noqa: BLE001 -- the program's own error, or kiln's
            failure = e
        try:
            self.gm(*rr.copy_inputs(args))  # copies: the real inputs stay for the caller
        except Exception as e:  # noqa: BLE001
            if type(e) is type(failure):  # eager raises it too: the program's own
                raise failure
        self._report("error", failure, args)
        if self.stage == "capture" or not config.suppress_errors:
            raise failure
        self._go_eager(failure)
        return self.gm(*args)

    def _checked_accuracy(self, args):
        copies = rr.copy_inputs(args)
        rng = torch.get_rng_state()
        expected = self.gm(*args)
        after = torch.get_rng_state()
        torch.set_rng_state(rng)
        try:
            got = rr.call_compiled(self.inner, copies)
        except Exception as e:  # noqa: BLE001 -- eager succeeded: kiln's failure
            self._report("error", e, args)
            got = None
        else:
            why = rr.difference((expected, args), (got, copies))
            if why is not None:
                self._report("accuracy", why, args)
        finally:
            torch.set_rng_state(after)
        return expected

    def _report(self, kind, detail, args):
        self.reported = True
        if self.target is None and self.stage == "kernels":
            from kiln.kernels.compile import pick_target
            self.target = pick_target(args)
        try:
            path = minify_and_write(self.stage, self.gm, [rr.spec_of(a) for a in args], kind,
                                    detail, self.backend, self.target)
        except repro_writer.Unwritable as e:
            log.warning("kiln minifier: the failing %s graph cannot be written as a "
                        "standalone file (%s)", self.stage, e)
            return
        except Exception as e:  # noqa: BLE001 -- a debugging aid must not mask the failure
            log.warning("kiln minifier: shrinking the failing %s graph failed (%s: %s)",
                        self.stage, type(e).__name__, e)
            return
        if path is not None:
            what = f"{type(detail).__name__}: {detail}" if kind == "error" else detail
            log.warning("kiln minifier: a graph of the %s stage fails (%s); minified repro "
                        "written to %s", self.stage, what, path)


def _random(gm) -> bool:
    from kiln.kernels.runtime.graph_replay import _RANDOM
    return any(n.op in ("call_function", "call_method")
               and any(r in str(getattr(n.target, "__name__", n.target)) for r in _RANDOM)
               for n in gm.graph.nodes)


def _units(gm) -> list[list[fx.Node]]:
    """The ops of ``gm`` in order, each with the getitems taking its result apart."""
    units, of = [], {}
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        src = n.args[0] if n.args else None
        if n.target is operator.getitem and isinstance(src, fx.Node) and src in of:
            of[src].append(n)
            of[n] = of[src]
            continue
        of[n] = [n]
        units.append(of[n])
    return units


def _values(gm, specs) -> dict:
    """The spec of every node's value, from one eager run on the repro's inputs."""
    specs_of = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            specs_of[n] = rr.spec_of(out)
            return out

    grad = torch.is_grad_enabled()
    try:
        Recorder(gm).run(*rr.make_inputs(specs))
    finally:
        torch.set_grad_enabled(grad)
    return specs_of


def subgraph(gm, keep: set, values: dict, specs: list):
    """The graph of the ops in ``keep``: what they read from dropped ops becomes an
    input, their results nothing kept reads become the outputs. (GraphModule, specs)."""
    g = fx.Graph()
    root = torch.nn.Module()
    env, new_specs = {}, []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    needed = []
    for n in gm.graph.nodes:
        if n in keep:
            needed += [a for a in n.all_input_nodes if a not in keep and a not in needed]
    for n in gm.graph.nodes:
        if n not in needed or n.op == "get_attr":
            continue
        env[n] = g.placeholder(n.name)
        new_specs.append(specs[placeholders.index(n)] if n.op == "placeholder" else values[n])
    for n in gm.graph.nodes:
        if n in needed and n.op == "get_attr":
            value = gm
            for part in n.target.split("."):
                value = getattr(value, part)
            name = n.target.replace(".", "_")
            root.register_buffer(name, value)
            env[n] = g.get_attr(name)
    for n in gm.graph.nodes:
        if n in keep:
            env[n] = g.node_copy(n, lambda a: env[a])
    outs = [env[n] for n in gm.graph.nodes if n in keep and not any(u in keep for u in n.users)]
    g.output(tuple(outs))
    return fx.GraphModule(root, g), new_specs


def ddmin(items: list, fails) -> list:
    """Zeller's delta debugging: a smallest sublist (1-minimal) for which ``fails``."""
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        for c in chunks:
            if fails(c):
                items, n = c, 2
                break
        else:
            for c in chunks if len(chunks) > 2 else []:
                rest = [x for x in items if x not in c]
                if fails(rest):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def _same_failure(kind, detail):
    """The test a candidate's outcome must pass to fail as the original did."""
    if kind == "error":
        want = type(detail)
        return lambda k, d: k == "error" and type(d).__name__ == want.__name__
    return lambda k, d: k == "inaccurate"


def _op_count(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def minify(stage, gm, specs, kind, detail, backend=None, target=None):
    """(source of the smallest failing graph, its specs, its op count), or None when
    the failure does not reproduce on random inputs of the recorded geometry."""
    level = "accuracy" if kind == "accuracy" else config.repro_level
    same = _same_failure(kind, detail)

    def fails(candidate, cand_specs):
        src = repro_writer.graph_source(candidate)
        with config.patch(graph_cache=False):     # candidates are not worth keeping
            k, d = rr.outcome(stage, level, repro_writer.load(src), cand_specs, backend, target)
        return same(k, d), src

    log.warning("kiln minifier: shrinking a failing graph of the %s stage (%d ops)...",
                stage, _op_count(gm))
    _busy.on = True
    try:
        ok, src = fails(gm, specs)
        if not ok:
            return None
        values = _values(gm, specs)
        best = [src, specs, _op_count(gm)]

        def test(units):
            keep = {n for u in units for n in u}
            cand, cand_specs = subgraph(gm, keep, values, specs)
            ok, src = fails(cand, cand_specs)
            if ok and _op_count(cand) <= best[2]:
                best[:] = [src, cand_specs, _op_count(cand)]
            return ok

        ddmin(_units(gm), test)
        return best
    finally:
        _busy.on = False


def repro_dir() -> str:
    trace = getattr(config, "trace_dir", None)
    return trace if trace else os.path.join(os.getcwd(), "kiln_repro")


def minify_and_write(stage, gm, specs, kind, detail, backend=None, target=None):
    """Minify; write the repro file; its path (None when nothing reproduces)."""
    if stage == "capture":
        name = backend_name(backend) if backend is not None else None
        if name is None:
            raise repro_writer.Unwritable(f"the backend {backend!r} has no registered name")
        backend = name
    original = _op_count(gm)
    found = minify(stage, gm, specs, kind, detail, backend, target)
    if found is None:
        log.warning("kiln minifier: the %s-stage failure (%s) does not reproduce on random "
                    "inputs of the same geometry; no repro written", stage, detail)
        return None
    src, small_specs, ops = found
    expected = f"{type(detail).__name__}: {detail}" if kind == "error" else \
        f"result differs from eager's ({detail})"
    gm_small = repro_writer.load(src)
    text = repro_writer.repro_source(
        gm_small, small_specs, stage, "accuracy" if kind == "accuracy" else config.repro_level,
        backend, target, expected.splitlines()[0] if expected else "",
        note=f"Minified from {original} to {ops} op(s).")
    d = repro_dir()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "repro.py" if not _written else f"repro_{len(_written) + 1}.py")
    with open(path, "w") as f:
        f.write(text)
    _written.append(path)
    return path
