"""Never slower than eager (``KILN_PERF_FALLBACK``): each compiled callable is timed
against an eager variant of the same computation during its first calls, and the faster
of the two is kept for good.

Where, and against what. Two places, each an artefact with its own trial and choice:
- ``InferenceChoice`` (the kiln backend's callable for a torch-level graph): calls that
  take the inference path are timed as a whole — autograd stage, kernels, the writes
  to mutated inputs — against the torch-level graph run by PyTorch, which is exactly
  eager's ops (fused batch norm where the aten graph has it decomposed).
- ``maybe_trial`` (in ``kernels.compile.CompiledGraph``): each specialisation of a
  training forward or backward aten graph (and of any aten graph compiled directly)
  against the graph module run op by op (what ``aot_eager`` runs). A training step is
  not one call, so forward and backward decide each on their own; mixing is sound, as
  the eager variant of a graph has its inputs, outputs and layouts, so a compiled
  backward reads an eager forward's saved tensors as it reads its own. The inference
  path's aten graph gets no trial of its own when ``InferenceChoice`` times it.

The shape class. A compiled graph is specialised to one input signature (sizes,
strides, dtypes, devices), so it has one trial and one choice; the choice is recorded
under ``shape_class`` (sizes, dtypes, devices), which is what a specialisation over
symbolic sizes would key its trials by.

How, cheaply and soundly. Each call runs exactly one of the two variants, never both,
so a graph that writes an input (or draws random numbers) does so once per call, as
eager does, and no copies are needed; results during the trial come from either
variant, both of them correct. Call 1 is the compiled one's first call (kernels load,
errors are caught by ``CompiledGraph``); a compiled graph replayed from a CUDA graph
also records on its second call, and a call that recorded again is not a sample. Then
the two alternate in blocks, compiled first: one untimed call (a warm-up, and a buffer
against what the other variant left running) and ``PER_BLOCK`` calls timed by the host
clock less garbage collection (``_GcClock``; the device synchronised before and after
on CUDA), until each has ``config.perf_fallback_rounds`` samples — or sooner when one
is more than ``CLEAR`` times faster on every sample, or eager's first call alone is
``FIRST_CLEAR`` times slower than every compiled sample — and at most ``MAX_CALLS``
calls in all, after which a variant with fewer than ``MIN_SAMPLES`` samples leaves the
compiled graph in place. Eager wins only when its median beats the compiled median by
more than ``MARGIN``: noise (a replayed graph against eager on a busy host) keeps the
compiled graph.

One-off work is no sample: a timed call during which kiln compiled anything (a stage
under ``timing.timed``: a new size's lowering, kernels, the autograd stage), recorded
a CUDA graph (``graph_replay.recordings``) or ran one unrecorded around held outputs
(``graph_replay.held_plain_calls``) says nothing about the steady state, so it is
dropped; ``one_off_work()`` counts them.

A stream of sizes. The torch-level graph of a function whose sizes are symbolic is one
callable for every size (``InferenceChoice``), so its samples come from calls at
different sizes: each is divided by the numel of the arguments with symbolic sizes at
that call (``dynamic_scale``), so that the two variants are compared per element
rather than by which sizes each happened to draw. A call at sizes the compiled variant
has not run yet runs it (its compile, its recording), outside the blocks and the call
count: run eagerly instead, the size would compile only at its next call, a whole pass
of the stream later. Without that, and with the one-off
rule, a stream's first pass timed the compiled variant on its per-size compiles and
chose eager for every size.

If an aten graph's eager variant raises where the graph can be run again (no input
written, no random draw), the compiled one is run on the same inputs: a success means
kiln's eager alternative is at fault, and the compiled graph is kept for good; otherwise
the error is the program's own and is raised. Otherwise (a graph that writes an input
or draws, or the torch-level graph, which is eager itself) eager's error is raised as
it stands.

Each decision is logged under ``KILN_LOGS=perf`` (graph, shape class, both medians,
the choice) and kept in ``perf_choices``.
"""
from __future__ import annotations

import gc
import statistics
import time
import weakref

import torch

from ... import config
from ...debug import timing, trace_dir
from ...debug.logs import log_for
from ...ops import is_mutation, is_random

_log = log_for("perf")

#: eager is kept only when its median is faster than the compiled median by this share
MARGIN = 0.10
#: timed calls in a row of one variant, after one untimed call: a call right after the
#: other variant pays for what that one left behind (caches, a thread pool still busy)
PER_BLOCK = 2
#: with two samples each, a variant this many times faster on every sample wins at once
CLEAR = 2.0
#: a first eager call this many times slower than every compiled sample decides at once
FIRST_CLEAR = 4.0
#: the most calls a trial makes before it decides with what it has
MAX_CALLS = 40
#: timed samples of each variant a decision on medians needs: with fewer after
#: ``MAX_CALLS`` calls, the compiled variant is kept (one sample can be an outlier)
MIN_SAMPLES = 2

#: test hook: ``adjust(which, seconds) -> seconds`` for each timed sample ("compiled" or
#: "eager"), so a test can give the decision fixed timings; None in normal use
adjust = None


def one_off_work() -> int:
    """A count that grows whenever kiln compiles something (any ``timing.timed`` stage),
    records a CUDA graph, runs a replayed graph unrecorded around outputs a caller
    holds, or runs a size op by op while its kernels compile (``size_prebuild``): a
    passing state. A timed call that changed it is no sample."""
    from . import graph_replay
    from .. import size_prebuild
    return timing.events() + graph_replay.recordings + graph_replay.held_plain_calls + \
        size_prebuild.eager_calls


def dynamic_scale(gm):
    """``args -> float`` for a graph some of whose placeholders have symbolic sizes
    (``meta["kiln_sym"]``, set by capture): the total numel of those arguments, and the
    value of symbolic int arguments; None for a graph of static sizes (every call the
    same size, nothing to divide by)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    picks = [i for i, ph in enumerate(phs)
             if any(isinstance(d, torch.SymInt) for d in _as_tuple(ph.meta.get("kiln_sym")))]
    if not picks:
        return None

    def scale(args) -> float:
        total = 0
        for i in picks:
            a = args[i] if i < len(args) else None
            if isinstance(a, torch.Tensor):
                total += a.numel()
            elif isinstance(a, int):
                total += a
        return float(max(total, 1))
    return scale


def _as_tuple(sym) -> tuple:
    return sym if isinstance(sym, tuple) else (sym,)


def shape_class(sig) -> tuple:
    """The decision's key, from a specialisation's signature (``compile._signature``):
    sizes, dtype and device of each tensor argument, the type of any other."""
    return tuple((tuple(a[0]), a[2], a[3]) if isinstance(a[0], torch.Size) else a[0]
                 for a in sig)


def graph_name(gm) -> str:
    """A readable name: the graph's class and the first user line it computes."""
    name = type(gm).__name__
    for n in gm.graph.nodes:
        where = n.meta.get("kiln_user_line")
        if where is not None:
            file, line, fn = where
            return f"{name} ({file}:{line} in {fn})"
    return name


class EagerVariant:
    """The graph module run by PyTorch: the alternative a compiled graph is timed against."""

    def __init__(self, gm):
        self.gm = gm

    def __call__(self, *args):
        return self.gm(*args)

    def call_boxed(self, args: list):
        inputs = list(args)
        args.clear()
        return self.gm(*inputs)


def _repeatable(gm) -> bool:
    """Can the graph run twice on the same inputs with the effect of once? Not when an
    op writes an argument or draws random numbers."""
    for n in gm.graph.nodes:
        t = n.target
        if n.op == "call_function" and isinstance(t, torch._ops.OpOverload) and \
                (is_mutation(t) or is_random(t)):
            return False
    return True


def maybe_trial(rt, owner, sig, enabled=True):
    """``rt`` wrapped in a Trial when the fallback is on, else ``rt`` itself; decided,
    the winner replaces the Trial in ``owner.variants[sig]`` (``owner``: the
    ``CompiledGraph``, held weakly)."""
    if not enabled or not config.perf_fallback or config.perf_fallback_rounds < 1:
        return rt
    ref = weakref.ref(owner)

    def settle(trial, winner, record):
        owner = ref()
        if owner is None:
            return
        if owner.variants.get(sig) is trial:
            owner.variants[sig] = winner
            owner._last = None
        owner.perf_choices[record["shape_class"]] = record

    return Trial(rt, EagerVariant(owner.gm), settle, graph_name(owner.gm), shape_class(sig),
                 _repeatable(owner.gm), getattr(owner, "_trace_owner", None))


class Trial:
    """A callable in its first calls: runs the compiled variant or the eager one, times
    both, and once decided hands the winner to ``settle(trial, winner, record)``, which
    puts it where the Trial was called from. ``repeatable``: the eager variant may be
    followed by the compiled one on the same inputs (see the module doc)."""

    def __init__(self, compiled, eager, settle, name, key, repeatable, trace_owner=None,
                 warm_calls=1, scale=None):
        self.compiled = compiled
        #: args -> the size a sample is divided by (``dynamic_scale``); None: 1
        self.scale = scale
        self.eager = eager
        self.settle = settle
        self.name, self.key, self.repeatable = name, key, repeatable
        self.trace_owner = trace_owner
        self.warm_calls = warm_calls
        self.rounds = config.perf_fallback_rounds
        self.samples = {"compiled": [], "eager": []}
        self.sizes_run = set()      # tensor sizes the compiled variant ran (a stream)
        self.calls = 0
        self.compiled_calls = 0
        #: the variant of the current block and the calls left in it
        self.block, self.block_left = None, 0
        #: the eager variant's first (untimed) call, in seconds
        self.eager_first = None
        self.decided = None
        self.record = None

    # -- calls -------------------------------------------------------------------------
    def __call__(self, *args):
        return self._call(list(args), boxed=False)

    def call_boxed(self, args: list):
        try:
            return self._call(args, boxed=True)
        finally:
            args.clear()

    def _call(self, args: list, boxed: bool):
        if self.scale is not None and self._new_size(args):
            # a size the compiled variant has not run: it compiles (and records) now,
            # no sample and no turn taken, so no size of a stream waits a pass for it
            return self._run_compiled(args, boxed, False)
        self.calls += 1
        which, timed = self._next()
        if which == "compiled":
            return self._run_compiled(args, boxed, timed)
        return self._run_eager(args, boxed, timed)

    def _new_size(self, args) -> bool:
        """Is this the first call at these tensor sizes (a stream of symbolic sizes)?"""
        key = tuple(a.shape for a in args if isinstance(a, torch.Tensor))
        if key in self.sizes_run:
            return False
        self.sizes_run.add(key)
        return True

    def _next(self):
        """(variant, timed) of this call: the compiled warm-up, then blocks of one
        untimed call and ``PER_BLOCK`` timed ones, alternating (the first compiled block's
        untimed call is the warm-up)."""
        if not self._compiled_warm():
            return "compiled", False
        if self.block is None:
            self.block, self.block_left = "compiled", PER_BLOCK
        elif self.block_left == 0:
            self.block = "eager" if self.block == "compiled" else "compiled"
            self.block_left = 1 + PER_BLOCK
        timed = self.block_left <= PER_BLOCK
        self.block_left -= 1
        return self.block, timed

    def upcoming(self) -> str:
        """The variant the next call runs ("compiled" or "eager"), without making it."""
        if not self._compiled_warm() or self.block is None:
            return "compiled"
        if self.block_left == 0:
            return "eager" if self.block == "compiled" else "compiled"
        return self.block

    def _compiled_warm(self) -> bool:
        """Has the compiled variant had its first call and, when replayed from a CUDA
        graph, its recording?"""
        if self.compiled_calls < self.warm_calls:
            return False
        g = getattr(self.compiled, "graphs", None)
        return g is None or g.disabled or g.graph is not None

    def _run_compiled(self, args, boxed, timed):
        self.compiled_calls += 1
        sync = _sync_for(args) if timed else None
        per = self._per(args) if timed else 1.0
        work = one_off_work() if timed else 0
        t0 = _start(sync)
        out = self.compiled.call_boxed(args) if boxed else self.compiled(*args)
        if timed:
            seconds = _stop(sync, t0)
            if one_off_work() == work:       # a call that recorded or compiled is no sample
                self._sample("compiled", seconds, per)
            elif self.calls >= MAX_CALLS:
                self._give_up()
        return out

    def _per(self, args) -> float:
        return 1.0 if self.scale is None else self.scale(args)

    def _run_eager(self, args, boxed, timed):
        keep = list(args) if self.repeatable else None
        first = self.eager_first is None
        sync = _sync_for(args) if timed or first else None
        per = self._per(args) if timed or first else 1.0
        t0 = _start(sync)
        try:
            out = self.eager.call_boxed(args) if boxed else self.eager(*args)
        except Exception as e:          # noqa: BLE001  (checked against the compiled graph)
            if keep is None:
                raise
            out = self.compiled(*keep)   # raises the program's own error
            self._decide("compiled", f"the eager graph raised {type(e).__name__}: {e}")
            return out
        if timed:
            self._sample("eager", _stop(sync, t0), per)
        elif first:
            self._first_eager(_stop(sync, t0), per)
        return out

    def _first_eager(self, seconds, per=1.0):
        """A first eager call already ``FIRST_CLEAR`` times slower than every compiled
        sample ends the trial: more calls of a variant that slow cost more than the
        answer is worth (an eager aten graph of decomposed batch norms, say)."""
        if adjust is not None:
            seconds = adjust("eager", seconds)
        seconds /= per
        self.eager_first = seconds
        c = self.samples["compiled"]
        if c and seconds > FIRST_CLEAR * max(c):
            self._decide("compiled", f"eager's first call took {seconds * 1e3:.3f} ms")

    # -- the decision ------------------------------------------------------------------
    def _sample(self, which, seconds, per=1.0):
        """A timed call of ``which``: ``seconds`` on the host clock, divided by ``per``
        (the call's size, for a graph of symbolic sizes)."""
        if adjust is not None:
            seconds = adjust(which, seconds)
        seconds /= per
        self.samples[which].append(seconds)
        c, e = self.samples["compiled"], self.samples["eager"]
        if len(c) >= 2 and len(e) >= 2:
            if max(c) * CLEAR < min(e):
                return self._decide("compiled")
            if max(e) * CLEAR < min(c):
                return self._decide("eager")
        if len(c) >= self.rounds and len(e) >= self.rounds:
            return self._decide(self._faster())
        if self.calls >= MAX_CALLS:
            self._give_up()

    def _give_up(self):
        """``MAX_CALLS`` made: decide on the samples there are when each variant has
        ``MIN_SAMPLES``; otherwise keep the compiled variant, whose calls were one-off
        work (a size stream's recordings, held outputs): a lone sample of either side
        says too little to send a graph to eager for good."""
        c, e = self.samples["compiled"], self.samples["eager"]
        enough = len(c) >= MIN_SAMPLES and len(e) >= MIN_SAMPLES
        self._decide(self._faster() if enough else "compiled",
                     "" if enough else f"{len(c)} compiled and {len(e)} eager timed samples "
                                       f"in {MAX_CALLS} calls")

    def _faster(self) -> str:
        c = statistics.median(self.samples["compiled"])
        e = statistics.median(self.samples["eager"])
        return "eager" if e * (1 + MARGIN) < c else "compiled"

    def _decide(self, which: str, why: str = ""):
        if self.decided is not None:
            return
        self.decided = which
        c, e = self.samples["compiled"], self.samples["eager"]
        self.record = record = {
            "choice": which, "shape_class": self.key, "graph": self.name,
            "compiled_ms": statistics.median(c) * 1e3 if c else None,
            "eager_ms": statistics.median(e) * 1e3 if e else None,
            "samples": (len(c), len(e)), "reason": why}
        self.settle(self, self.compiled if which == "compiled" else self.eager, record)
        with trace_dir.within(self.trace_owner):
            _log.info("perf: %s %s: compiled %s, eager %s (samples %d/%d) -> %s%s",
                      self.name, _shapes(self.key), _ms(record["compiled_ms"]),
                      _ms(record["eager_ms"]), len(c), len(e), which,
                      f" ({why})" if why else "")


def _shapes(key, shown: int = 4) -> str:
    parts = []
    for k in key[:shown]:
        if isinstance(k, tuple) and len(k) == 3:
            shape, dtype, device = k
            parts.append(f"{str(dtype).replace('torch.', '')}{list(shape)}@{device}")
        else:
            parts.append(getattr(k, "__name__", str(k)))
    if len(key) > shown:
        parts.append(f"... {len(key) - shown} more")
    return "(" + ", ".join(parts) + ")"


def _ms(v) -> str:
    return "-" if v is None else f"{v:.3f} ms"


def _sync_for(args):
    """The CUDA device to synchronise around a timed call, or None on the CPU."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "cuda":
            return a.device
    return None


class _GcClock:
    """The host clock less the time Python's cyclic garbage collector ran: a collection
    is the whole process's cost (a large heap another library left, a compiler's caches
    say, makes one last hundreds of milliseconds), not the variant's that happened to
    trigger it, so it is no part of a sample."""

    def __init__(self):
        self.collecting = 0.0     # seconds spent in finished collections
        self.began = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self.began = time.perf_counter()
        elif self.began is not None:
            self.collecting += time.perf_counter() - self.began
            self.began = None

    def now(self) -> float:
        return time.perf_counter() - self.collecting


_clock = _GcClock()


def _start(sync) -> float:
    if sync is not None:
        torch.cuda.synchronize(sync)
    return _clock.now()


def _stop(sync, t0) -> float:
    if sync is not None:
        torch.cuda.synchronize(sync)
    return _clock.now() - t0


# --- the kiln backend's inference calls ----------------------------------------------
class TorchLevelEager:
    """The torch-level graph run by PyTorch: eager's own ops (fused batch norm, layer
    norm, convolution with its bias), what the ``eager`` backend runs; returns a tuple
    as the autograd stage's callable does."""

    def __init__(self, gm):
        self.gm = gm

    def __call__(self, *args):
        out = self.gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _enables_grad(gm) -> bool:
    return any(n.op == "call_function" and n.target is torch._C._set_grad_enabled
               and n.args and n.args[0] for n in gm.graph.nodes)


class InferenceChoice:
    """The kiln backend's callable for one torch-level graph: calls that take the
    inference path (grad off, or no tensor argument requiring grad) are timed against
    the torch-level graph run by PyTorch — exactly eager's ops, so not slower than eager
    but for the guards — and keep the faster; training calls go to the autograd stage's
    callable (``aot``), whose forward and backward are aten graphs timed each on its own
    (``maybe_trial``). The inference path's aten graph is then compiled without a trial
    of its own (the kernel backend asks so), so that this one times the kernels. The
    eager variant's error is raised as it is: it is eager's own."""

    def __init__(self, aot, gm, example_inputs, trace_owner=None):
        self.aot = aot
        on_cuda = any(isinstance(a, torch.Tensor) and a.device.type == "cuda"
                      for a in example_inputs)
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor)
                    else type(a) for a in example_inputs)
        self.perf_choices = {}
        # on CUDA the inference graph records its CUDA graph on its second call
        self.inference = Trial(aot, TorchLevelEager(gm), self._settle, graph_name(gm), key,
                               repeatable=False, trace_owner=trace_owner,
                               warm_calls=2 if on_cuda else 1, scale=dynamic_scale(gm))

    def _settle(self, trial, winner, record):
        self.inference = winner
        self.perf_choices[record["shape_class"]] = record

    def __call__(self, *args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            return self.aot(*args)
        return self.inference(*args)

    def __getattr__(self, name):
        # what readers ask of the autograd stage's callable (eager_reasons, …)
        aot = self.__dict__.get("aot")
        if aot is None:
            raise AttributeError(name)
        return getattr(aot, name)


def times_inference(gm) -> bool:
    """Does the kiln backend wrap ``gm``'s callable in an InferenceChoice? When the
    fallback is on and the graph cannot turn grad mode on by itself (then grad off at
    entry may still train)."""
    return config.perf_fallback and config.perf_fallback_rounds >= 1 and not _enables_grad(gm)
