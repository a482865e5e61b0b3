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
    for n in (21, 22):
        call(n)                    # warm-up: plain
        call(n)                    # recorded
    assert a in family and b in family and FakeReplay.captures >= 2
    call(23)
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
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
