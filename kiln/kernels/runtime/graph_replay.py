"""Replaying a compiled graph's launches from a recorded CUDA graph (``KILN_CUDAGRAPHS``).

A graph of many small launches spends most of a call on the host (resnet18 at batch 16:
~90%); a recorded CUDA graph replays them all with one launch. ``GraphReplay`` records a
``Runtime``'s steps on its second call and replays them after.

Host values. A graph that reads one-element CPU tensors (an optimizer's step counters)
runs its CPU ops and stages those values on the host every call, copying them into a
static device buffer the recorded graph reads (``host_prologue``).

Inputs. One at the same address as on the call before (a parameter) is read in place;
one that moves every call (a batch) is copied into a static buffer first. One that
moves once (the backward's saved activations, once the forward is itself replayed from
the graph's memory) records the graph again at its new address instead of being copied
from then on.

Memory. Every graph on a device is recorded into one shared memory pool (``_Pool``), so
graphs share their temporaries: a training backward reuses what its forward freed.
Outputs are handed out as aliases of the graph's memory, never copied: a forward's
saved activations cost their bytes once, and a replay launches nothing but the graph.
That is safe only while nothing still holds memory a replay will overwrite. A replay
of graph G writes what G allocated while being recorded: its outputs and temporaries.
Graphs keep their outputs allocated, so outputs of graphs recorded before G were never
G's to write; G's own outputs, and those of graphs recorded after G (which may lie in
G's temporaries), must no longer be held by anyone when G replays. Whether something
holds an output is its storage's reference count against the pool's own.

When something does: the graph whose output is held copies that output out from then
on (the caller keeps it across calls: ``loss = step(x)`` holds the last loss while the
next call runs; copies are the caller's own), and G is recorded again, allocating
around what is held. After ``RECORD_LIMIT`` recordings G makes plain calls.

Held outputs met make plain calls first: the graph's outputs that something holds are
copied out from then on and the call runs the steps unrecorded (allocating around what
is held); only a storage still held after ``HELD_PLAIN_CALLS`` such calls records the
graph again. A caller keeping a pass of a size stream's outputs (one per size) while the
next pass runs costs each size a plain call or two, not a recording each.

Sizes. Each input-size signature is its own Runtime, each with its own recording; the
variants of one graph share a ``replay_lru.Recordings``, which keeps at most
``config.cudagraph_max_recordings`` of them (least recently used dropped) and what
they learned. A new variant of a graph whose other variants were called runs plainly
at its first call and records at its second as the family learned: inputs at another
address than at the family's latest call (this size's batch) are copied in, the others
(parameters) read in place; outputs any variant copies out, every variant copies out
from then on (the caller keeping one size's outputs keeps the others'). So a size
stream replays every size from its third call, and a size seen once costs a plain run
and no recording: in serving with many lengths, most seen once early on, recording
each at its first call took a quarter of the first pass (a LLaMA stream over 24 lengths:
14.5 s, 11.2 s without recordings). A size that ran op by op while its kernels compiled
(``size_seen``) has had its plain call: its first call with kernels records at once,
after a warm-up run. Not for a graph with a host prologue.
"""
from __future__ import annotations

import bisect
import itertools
import operator
import weakref

import torch

from ... import config
from ...debug.logs import log_for
from .. import ir
from . import host_prologue
from .replay_lru import Recordings

#: graphs of fewer launches than this make plain calls (one launch is not worth a
#: graph); a step of Triton kernels launches each of its groups (an optimizer's graph:
#: a few steps, a launch a parameter)
GRAPH_MIN_STEPS = 8
#: recordings of one graph before it gives up on replay (inputs that keep moving,
#: outputs held across calls); graphs sharing the pool record again in cascade while
#: addresses settle (FSDP2's 24 per-block graphs over its first steps: up to about 8)
RECORD_LIMIT = 10
#: calls a graph runs unrecorded while outputs it could overwrite are held (by the
#: caller, or another graph's leftover aliases) before it records again around them: a
#: caller keeping one pass of a size stream while the next runs holds each for a call
#: or two of every other size's graph, and then lets go
HELD_PLAIN_CALLS = 2
_RANDOM = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "poisson",
           "exponential", "geometric", "cauchy", "log_normal")
_log = log_for("perf_hints")
_use_count = torch._C._storage_Use_Count


class _Pool:
    """One device's shared CUDA-graph memory pool and the outputs recorded into it.

    ``entries``: [seq, storage, base, owner, outputs] per output storage of each current
    recording, in recording order; ``base`` is its reference count held by the pool
    alone, ``owner`` a weak reference to the GraphReplay that recorded it, ``outputs``
    the positions of the outputs that view it. ``retired``: the same for recordings no
    longer replayed (recorded again, given up, garbage-collected), kept, with their
    memory, until nothing outside holds them."""

    def __init__(self):
        # A pool exists while a graph recorded into it, or a MemPool, holds it: when
        # the last graph goes (recorded again, say), recording into its id again trips
        # an assertion in the caching allocator; the MemPool keeps it held for good.
        mem_pool = getattr(torch.cuda, "MemPool", None)
        self.keeper = mem_pool() if mem_pool is not None else None
        self.handle = self.keeper.id if self.keeper is not None else \
            torch.cuda.graph_pool_handle()
        self.entries = []
        self.retired = []
        self.seq = itertools.count()

    def add(self, owner, storages) -> int:
        """Register a recording's output storages, [(storage, output positions)]."""
        seq = next(self.seq)
        ref = weakref.ref(owner, self._retire_ref)
        for st, outputs in storages:
            self.entries.append([seq, st, _use_count(st._cdata), ref, outputs])
        return seq

    def retire(self, owner) -> None:
        """``owner`` no longer replays its recording: its outputs stay protected while
        something holds them; the others' memory goes back to the pool now (before a
        new recording allocates)."""
        self._retire_where(lambda ref: ref() is owner)

    def _retire_ref(self, ref) -> None:
        """A recording's GraphReplay was garbage-collected."""
        self._retire_where(lambda r: r is ref)

    def _retire_where(self, is_owner) -> None:
        going = [e for e in self.entries if is_owner(e[3])]
        if going:
            self.entries = [e for e in self.entries if not is_owner(e[3])]
            self.retired += going
        self.retired = [e for e in self.retired if _use_count(e[1]._cdata) > e[2]]

    def held_after(self, seq: int) -> list:
        """(owner or None when retired, output positions, storage) of the storages
        recorded at or after ``seq`` that something outside the pool still holds. Called
        before every replay: it reads only those storages' reference counts."""
        held = []
        if self.retired:
            self.retired = [e for e in self.retired if _use_count(e[1]._cdata) > e[2]]
            held += [(None, e[4], e[1]._cdata) for e in self.retired if e[0] >= seq]
        entries = self.entries
        for k in range(bisect.bisect_left(entries, seq, key=_seq), len(entries)):
            e = entries[k]
            if _use_count(e[1]._cdata) > e[2]:
                held.append((e[3](), e[4], e[1]._cdata))
        return held

    def owns(self, t: torch.Tensor) -> bool:
        """Is ``t`` a view of a current recording's output?"""
        c = t.untyped_storage()._cdata
        return any(e[1]._cdata == c for e in self.entries)


def _seq(entry) -> int:
    return entry[0]


_POOLS: dict[int, _Pool] = {}


#: CUDA graphs recorded in this process (``perf_fallback.one_off_work``: a timed call
#: that recorded is no sample)
recordings = 0
#: calls run unrecorded around held outputs (``HELD_PLAIN_CALLS``): no sample either
held_plain_calls = 0


def _pool(device) -> _Pool:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _POOLS:
        _POOLS[idx] = _Pool()
    return _POOLS[idx]


class GraphReplay:
    """Records a Runtime's steps in a CUDA graph on its second call and replays it after
    (see the module doc). Anything unexpected (capture failing: host syncs, unsupported
    ops) falls back to plain calls for good; ``reason`` says why."""

    def __init__(self, rt):
        self.calls = 0
        self.records = 0
        self.replays = 0
        self.host = None               # the host prologue, for a graph reading CPU values
        self.ptrs = None
        self.graph = None
        self.disabled = False
        self.reason = None
        self.moving = set()            # inputs copied into static buffers
        self.moved_once = set()        # inputs that moved once after recording
        self.copied = set()            # outputs handed out as copies, not aliases
        #: first called after other variants of its graph: records at its second call
        #: as they learned (``_family_recording``)
        self.from_family = False
        #: this size ran before, op by op while its kernels compiled (``size_prebuild``):
        #: its first call records at once, after a warm-up run (not for a graph writing an
        #: input in place, which the warm-up would write twice)
        self.size_seen = False
        self.write_back = []           # (position, static copy) of moving inputs written
        self.seq = -1
        self.outs = None               # per output: (storage, offset, sizes, strides, dtype)
        self.pool = _pool(rt.device)
        self.position = {name: pos for pos, name in rt.inputs}
        self.positions = tuple(pos for pos, _ in rt.inputs)
        #: the inputs of a call, picked from its arguments by one C-level call (a model's
        #: parameters are hundreds of inputs, read every call)
        self.pick = _picker(self.positions)
        #: the addresses of the inputs read in place, from all inputs' (set at recording)
        self.pick_stable = None
        self.stable_ptrs = None
        #: the recordings of this graph's size variants (``replay_lru``); set by the
        #: compiled graph that owns this Runtime, else this variant's own
        self.family = Recordings()
        self.dropped = 0               # times the family dropped this recording
        self.seen_held = {}            # held storage -> calls that met it, since recording
        self.plain_for_held = 0        # calls run plainly on meeting held outputs

    @staticmethod
    def maybe(rt):
        mode = config.cudagraphs
        if mode == "0" or rt.device.type != "cuda" or not torch.cuda.is_available():
            return None
        if any(k == "const" for k, _ in rt.out_plan):
            return None
        for s in rt.steps:
            op = getattr(getattr(s, "b", None), "op", None)
            if op is not None and any(r in str(getattr(op, "__name__", op)) for r in _RANDOM):
                return None
            if getattr(op, "replayable", True) is False:    # reads host values when called
                return None
        if mode != "1" and len(rt.sched.groups) < GRAPH_MIN_STEPS:
            return None
        return GraphReplay(rt)

    def __call__(self, rt, args):
        if self.disabled:
            return rt.run(args)
        self.calls += 1
        if self.calls == 1:                      # warm-up: compiles, library plans
            if not host_prologue.wanted(rt, args):
                ptrs = self._addresses(args)
                self.from_family = self.family.last_ptrs is not None
                if self.from_family and self.size_seen and not rt.in_place_inputs:
                    rt.run(args)                 # the warm-up, whose outputs are dropped
                    return self._family_recording(rt, args, ptrs)
                self.ptrs = ptrs
                self._learn_ptrs(rt, ptrs)
                return rt.run(args)
            # CPU values: split off a host prologue, or replay nothing (the reason)
            out, plan = host_prologue.first_call(rt, args)
            if isinstance(plan, str):
                self._disable(plan)
            else:
                self.host = host_prologue.HostPrologue(rt, plan)
                self.ptrs = self.host.pointers(rt, args)
            return out
        host = None
        if self.host is not None:
            try:
                host = self.host.run(rt, args)
            except Exception as e:    # noqa: BLE001  (the plain call raises the program's own)
                self._disable(f"host prologue failed: {type(e).__name__}: {e}")
                return rt.run(args)
        ptrs = self.host.pointers(rt, args) if host is not None else \
            self._addresses(args)
        if self.graph is None and self.from_family and host is None:
            return self._family_recording(rt, args, ptrs)
        if self.graph is None:
            # inputs that moved since the first call are read in place for now: the
            # backward's saved activations move once, when the forward starts replaying
            self.moved_once |= {i for i, (p, q) in enumerate(zip(ptrs, self.ptrs)) if p != q}
            return self._record(rt, args, ptrs, host)
        moved = [] if self.pick_stable(ptrs) == self.stable_ptrs else \
            [i for i in self.stable if ptrs[i] != self.ptrs[i]]
        if moved:
            # record again, reading it at its new address; if it moves again it is
            # copied in from then on, unless it is another graph's output (that moves
            # only when its graph records again)
            for i in moved:
                if i in self.moved_once and not self.pool.owns(args[rt.inputs[i][0]]):
                    self.moving.add(i)
                    self.family.moving.add(rt.inputs[i][0])
            self.moved_once.update(moved)
            return self._record(rt, args, ptrs, host)
        held = self.pool.held_after(self.seq)
        if held:
            self._copy_held(held, args)
            met = {cdata for _, _, cdata in held}
            seen = self.seen_held
            if host is None and all(seen.get(c, 0) < HELD_PLAIN_CALLS for c in met):
                # this call runs unrecorded (allocating around what is held); still held
                # after HELD_PLAIN_CALLS calls, the graph records again around them
                for c in met:
                    seen[c] = seen.get(c, 0) + 1
                global held_plain_calls
                held_plain_calls += 1
                self.plain_for_held += 1
                self._learn_ptrs(rt, ptrs)
                return rt.run(args)
            return self._record(rt, args, ptrs, host)
        if self.copies:              # one launch sequence for every moving input
            torch._foreach_copy_([st for _, st in self.copies],
                                 [args[rt.inputs[i][0]] for i, _ in self.copies])
        self.family.touch(self)
        self._learn_ptrs(rt, ptrs)
        self.graph.replay()
        self._write_back(args)
        self.replays += 1
        return self._outputs(rt, args, host)

    def _addresses(self, args) -> list:
        """The data addresses of this call's inputs, in ``rt.inputs`` order."""
        return list(map(_DATA_PTR, self.pick(args)))

    def _family_recording(self, rt, args, ptrs):
        """The second call of a size variant of a graph whose other variants were
        called: recorded as the family learned (``_record``), replayed for this call's
        outputs. Inputs are told apart by the family's latest call, not by this
        variant's first (a caller may pass one batch tensor to a size every pass)."""
        self.from_family = False
        fam = self.family
        positions, at = fam.last_ptrs
        last = dict(zip(positions, at))
        for i, (pos, _) in enumerate(rt.inputs):
            if self.pool.owns(args[pos]):
                continue        # another graph's output: recorded again if it moves
            if pos in fam.moving or last.get(pos) != ptrs[i]:
                self.moving.add(i)
        self.copied |= {i for i in fam.copied if i < len(rt.out_plan)}
        return self._record(rt, args, ptrs)

    def _learn_ptrs(self, rt, ptrs):
        """The family's record of each input's address at its latest call."""
        self.family.last_ptrs = (self.positions, ptrs)

    def _write_back(self, args):
        """Moving inputs the graph writes in place (``in_place``) were written in their
        static copies: copy those into the caller's tensors."""
        if self.write_back:
            torch._foreach_copy_([args[pos] for pos, _ in self.write_back],
                                 [st for _, st in self.write_back])

    def _copy_held(self, held, args):
        """Outputs held across calls are copied out from now on; except another graph's
        outputs that are this call's inputs (a backward's saved activations, after its
        forward recorded again): recording this graph again is the whole remedy."""
        inputs = {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}
        for g, outputs, cdata in held:
            if g is None or g.copied.issuperset(outputs) or (g is not self and cdata in inputs):
                continue
            g.copied.update(outputs)
            g.family.copied.update(outputs)
            _log.info("CUDA graph outputs %s are kept across calls: copying them out "
                      "from now on", sorted(outputs))

    def _disable(self, why):
        self.disabled = True
        self.reason = why
        self._release()
        _log.info("CUDA graph replay off for a graph: %s", why)

    def _drop(self):
        """The family keeps the recordings of more recently used sizes: release this
        one (recorded again if called again; dropped twice, plain calls for good)."""
        self.dropped += 1
        if self.dropped > 1:
            self._disable("dropped twice to keep the recordings of other input sizes "
                          "(KILN_CUDAGRAPH_MAX_RECORDINGS)")
        else:
            self._release()

    def _release(self):
        self.family.drop(self)
        self.pool.retire(self)
        self.graph = None
        self.outs = None

    def _outputs(self, rt, args, host=None):
        out, views, fresh = [], [], []
        # what one size variant's caller keeps, the others' caller keeps too (a stream)
        copied = self.copied | self.family.copied if self.family.copied else self.copied
        for i, spec in enumerate(self.outs):
            if spec is None:             # or made by the host prologue, this call
                out.append(None if host is None else host.outputs.get(i))
                continue
            if len(spec) == 2:           # an input, or a view of one (a saved input)
                kind, v = spec
                a = args[self.position[v if kind == "buf" else v.buf]]
                out.append(a if kind == "buf" else
                           rt.tensor_of({v.buf: a}, v.buf, v.sizes, v.strides, v.offset))
                continue
            st, off, size, stride, dtype = spec
            t = torch.empty(0, dtype=dtype, device=st.device).set_(st, off, size, stride)
            if i in copied:
                views.append(t)
                t = torch.empty_like(t)      # the layout clone() would give
                fresh.append(t)
            out.append(t)
        if fresh:                            # one launch sequence for every copied output
            torch._foreach_copy_(fresh, views)
        return rt.package(out)

    def _record(self, rt, args, ptrs, host=None):
        global recordings
        recordings += 1
        self.records += 1
        old = self.graph                 # holds the pool until the new one does
        self._release()
        if self.records > RECORD_LIMIT:
            self._disable(f"recorded {RECORD_LIMIT} times (inputs keep moving, or "
                          "outputs are kept across calls)")
            return rt.run(args)
        self.stable = [i for i in range(len(ptrs)) if i not in self.moving]
        self.pick_stable = _picker(self.stable)
        self.stable_ptrs = self.pick_stable(ptrs)
        self.ptrs = ptrs
        self.seen_held = {}
        self._learn_ptrs(rt, ptrs)
        self.copies = []
        static = list(args)
        for i in sorted(self.moving):
            pos = rt.inputs[i][0]
            a = args[pos]
            st = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            st.copy_(a)
            static[pos] = st
            self.copies.append((i, st))
        self.write_back = [(rt.inputs[i][0], st) for i, st in self.copies
                           if rt.inputs[i][1] in rt.in_place_inputs]
        try:
            graph, flat = self._capture(rt, static) if host is None else \
                self._capture(rt, static, host)
        except Exception as e:        # noqa: BLE001  (capture is best effort)
            try:
                torch.cuda.synchronize()
            except Exception:          # noqa: BLE001
                pass
            self._disable(f"capture failed: {type(e).__name__}: {e}")
            return rt.run(args)
        del old
        del static
        specs, storages = _output_specs(flat, rt)
        del flat                      # the pool's storages are now the only holders
        self.outs = specs
        self.graph = graph
        self.seq = self.pool.add(self, storages)
        for other in self.family.add(self):
            other._drop()
        graph.replay()
        self._write_back(args)
        return self._outputs(rt, args, host)

    def _capture(self, rt, static, host=None):
        """(CUDA graph, flat outputs) of the steps run on ``static`` while recording
        (with a host prologue: its device part, on this call's host values)."""
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool.handle):
            if host is None:
                flat = rt.run_flat(rt.take_inputs(static))
            else:
                flat = self.host.strip(self.host.device_rt.run_flat(
                    self.host.device_tensors(rt, static, host)))
        return graph, flat


_DATA_PTR = torch.Tensor.data_ptr


def _picker(positions):
    """A function from a sequence to the tuple of its items at ``positions``
    (``operator.itemgetter``, which gives an item rather than a tuple of one)."""
    if len(positions) == 1:
        (i,) = positions
        return lambda seq: (seq[i],)
    if not positions:
        return lambda seq: ()
    return operator.itemgetter(*positions)


def _output_specs(flat, rt):
    """Per output (storage, offset, sizes, strides, dtype) in the graph's memory, the
    runtime's plan (kind, view) for one that is an input or a view of one, or None;
    and the distinct storages, one Python object each, with the positions of the
    outputs viewing them."""
    specs, seen, users = [], {}, {}
    for i, (t, (kind, v)) in enumerate(zip(flat, rt.out_plan)):
        if t is None:
            specs.append(None)
            continue
        if isinstance(rt.buffers[v if kind == "buf" else v.buf], ir.Input):
            specs.append((kind, v))
            continue
        st = t.untyped_storage()
        st = seen.setdefault(st._cdata, st)
        users.setdefault(st._cdata, set()).add(i)
        specs.append((st, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype))
    return specs, [(st, frozenset(users[c])) for c, st in seen.items()]
