"""CUDA-graph recordings of one graph's size variants, bounded (``runtime/replay_lru``):
the bookkeeping of ``GraphReplay`` checked on the CPU with a fake recorder (the
recording itself is GPU-only: ``tests/kernels/test_triton_gpu.py`` and the GPU runs)."""
from __future__ import annotations

import logging

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.kernels import compile_aten_graph
from kiln.kernels.runtime import graph_replay
from kiln.kernels.runtime.replay_lru import Recordings


class FakePool:
    handle = None

    def add(self, owner, storages):
        return 0

    def retire(self, owner):
        pass

    def held_after(self, seq):
        return []

    def owns(self, t):
        return False


class FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


class FakeReplay(graph_replay.GraphReplay):
    """Records by running the steps once (as a capture does) into a graph that counts
    its replays."""
    captures = 0

    def _capture(self, rt, static):
        FakeReplay.captures += 1
        return FakeGraph(), rt.run_flat(rt.take_inputs(static))

    @staticmethod
    def _on_host(t):
        return False


def _variant(rows, family, monkeypatch):
    x = torch.randn(rows, 19)

    def f(a):
        return (a * 2).relu() + 1
    cg = compile_aten_graph(make_fx(f)(x), [x], "cpp", perf_fallback=False)
    rt = next(iter(cg.variants.values()))
    monkeypatch.setattr(graph_replay, "_pool", lambda device: FakePool())
    rp = FakeReplay(rt)
    rp.family = family
    return rt, rp, x, f


def test_recordings_bounded_least_recently_used_dropped(monkeypatch, caplog):
    family = Recordings(limit=2)
    vs = {n: _variant(n, family, monkeypatch) for n in (21, 22, 23)}

    def call(n):
        rt, rp, x, f = vs[n]
        out = rp(rt, (x,))
        torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, f(x))
        return rp

    a, b, c = (vs[n][1] for n in (21, 22, 23))
    call(21)                       # the family's first variant: warm-up, plain
    call(21)                       # recorded
    call(22)                       # a new size of a family that was called: plain
    assert b.calls == 1 and b.records == 0 and b.from_family
    call(22)                       # recorded at its second call
    assert b.records == 1
    call(22)                       # replayed
    assert a in family and b in family and FakeReplay.captures >= 2
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        call(23)                   # plain
        call(23)                   # recorded: the least recently used (21) is dropped
    assert c in family and a not in family and a.graph is None and a.dropped == 1
    assert "exceed 2" in caplog.text
    call(22)                       # replayed: now the most recent
    assert b.graph.replays >= 2
    call(21)                       # recorded again: drops 23, the least recent now
    assert a in family and c not in family and a.records == 2
    call(23)                       # recorded again: drops 22
    assert b not in family and c in family
    call(21)                       # replayed
    call(22)                       # recorded again: drops 23 a second time
    assert c.disabled and "dropped twice" in c.reason and len(family) == 2
    captures = FakeReplay.captures
    call(23)                       # plain launches from now on
    assert FakeReplay.captures == captures and c.graph is None


def test_recordings_default_bound_from_config(monkeypatch):
    import kiln
    monkeypatch.setattr(kiln.config, "cudagraph_max_recordings", 3)
    fam = Recordings()
    objs = [FakeGraph() for _ in range(5)]       # any weak-referenceable object
    dropped = [fam.add(o) for o in objs]
    assert [len(d) for d in dropped] == [0, 0, 0, 1, 1] and dropped[3] == [objs[0]]
    fam.touch(objs[2])
    assert fam.add(FakeGraph()) == [objs[3]]


def _two_input_variant(rows, w, family, monkeypatch, pool):
    x = torch.randn(rows, 19)

    def f(a, b):
        return (a * b).relu() + 1
    cg = compile_aten_graph(make_fx(f)(x, w), [x, w], "cpp", perf_fallback=False)
    rt = next(iter(cg.variants.values()))
    monkeypatch.setattr(graph_replay, "_pool", lambda device: pool)
    rp = FakeReplay(rt)
    rp.family = family
    return rt, rp, x, f


def test_a_new_size_records_at_its_second_call_from_what_the_family_learned(monkeypatch):
    """The second size of a graph runs plainly at its first call (a size seen once
    records nothing) and records at its second as the family learned: its batch (at
    another address than the family's latest call, though at its own first call's) is
    copied in, the shared weight read in place, and the outputs the family copies out
    are copied out. A graph writing an input in place does the same: its first call
    writes once, the recording's replay once."""
    family, pool = Recordings(), FakePool()
    w = torch.randn(19)
    rt_a, a, xa, f = _two_input_variant(21, w, family, monkeypatch, pool)
    rt_b, b, xb, _ = _two_input_variant(22, w, family, monkeypatch, pool)
    for _ in range(3):
        xa = xa.clone()            # a batch at a new address every call
        torch.testing.assert_close(a(rt_a, (xa, w)), f(xa, w))
    assert a.records == 2 and a.moving == {0}          # moved once, then moving
    family.copied.add(0)           # as if a caller kept an output of a's
    torch.testing.assert_close(b(rt_b, (xb, w)), f(xb, w))
    assert b.calls == 1 and b.records == 0 and b.graph is None
    torch.testing.assert_close(a(rt_a, (xa, w)), f(xa, w))     # the family's latest call
    out = b(rt_b, (xb, w))         # the same batch tensor as its first call
    torch.testing.assert_close(out, f(xb, w))
    assert b.calls == 2 and b.records == 1 and b.graph is not None
    assert b.moving == {0} and b.copied == {0}
    xb = xb.clone()
    torch.testing.assert_close(b(rt_b, (xb, w)), f(xb, w))
    assert b.records == 1 and b.graph.replays == 2     # replayed, batch copied in
    family.copied.clear()
    assert b(rt_b, (xb, w)) is not None and b.copied == {0}     # its own, kept
    own = a.outs[0][0].data_ptr()                  # a's output storage in the pool
    assert a(rt_a, (xa, w)).untyped_storage().data_ptr() == own      # an alias
    family.copied.add(0)           # another size's caller keeps its output: a copies too
    assert a(rt_a, (xa, w)).untyped_storage().data_ptr() != own
    rt_c, c, xc, _ = _two_input_variant(23, w, family, monkeypatch, pool)
    rt_c.in_place_inputs = {"x"}
    c(rt_c, (xc, w))
    assert c.records == 0 and c.graph is None
    c(rt_c, (xc, w))
    assert c.records == 1 and c.graph is not None


def test_a_size_that_ran_op_by_op_records_at_its_first_call_with_kernels(monkeypatch):
    """A size whose kernels compiled in the background ran op by op meanwhile
    (``size_seen``): its first call with kernels warms up and records at once, as the
    family learned; one writing an input in place waits for its second call."""
    family, pool = Recordings(), FakePool()
    w = torch.randn(19)
    rt_a, a, xa, f = _two_input_variant(21, w, family, monkeypatch, pool)
    for _ in range(2):
        torch.testing.assert_close(a(rt_a, (xa, w)), f(xa, w))
    rt_b, b, xb, _ = _two_input_variant(22, w, family, monkeypatch, pool)
    b.size_seen = True
    torch.testing.assert_close(b(rt_b, (xb, w)), f(xb, w))
    assert b.calls == 1 and b.records == 1 and b.graph is not None and b.moving == {0}
    xb = xb.clone()
    torch.testing.assert_close(b(rt_b, (xb, w)), f(xb, w))
    assert b.records == 1 and b.graph.replays == 2
    rt_c, c, xc, _ = _two_input_variant(23, w, family, monkeypatch, pool)
    rt_c.in_place_inputs = {"x"}
    c.size_seen = True
    c(rt_c, (xc, w))
    assert c.records == 0 and c.graph is None


class HeldPool(FakePool):
    """A pool whose ``held`` storages (cdata) something outside holds."""
    def __init__(self):
        self.held = []

    def held_after(self, seq):
        return [(None, {0}, cdata) for cdata in self.held]


def test_held_outputs_met_first_make_a_plain_call(monkeypatch):
    """Outputs held by a caller (a pass of a size stream kept while the next runs): calls
    meeting them run unrecorded, the graph's own outputs copied out from then on; only a
    storage still held after HELD_PLAIN_CALLS calls records the graph again."""
    family, pool = Recordings(), HeldPool()
    w = torch.randn(19)
    rt, g, x, f = _two_input_variant(21, w, family, monkeypatch, pool)
    g(rt, (x, w))
    g(rt, (x, w))
    assert g.records == 1
    pool.held = [101, 102]
    torch.testing.assert_close(g(rt, (x, w)), f(x, w))
    assert g.records == 1 and g.plain_for_held == 1
    pool.held = [103]              # another storage held: a first meeting
    g(rt, (x, w))
    assert g.records == 1 and g.plain_for_held == 2
    pool.held = [101]              # met a second time: plain still
    g(rt, (x, w))
    assert g.records == 1 and g.plain_for_held == 3
    pool.held = [101, 103]         # 101 held past HELD_PLAIN_CALLS: recorded again
    g(rt, (x, w))
    assert graph_replay.HELD_PLAIN_CALLS == 2
    assert g.records == 2 and g.plain_for_held == 3
    pool.held = []
    g(rt, (x, w))
    assert g.records == 2 and g.graph.replays >= 1
