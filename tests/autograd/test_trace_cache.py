"""The autograd trace cache (kiln/autograd/trace_cache.py): a graph traced again with the
same inputs reads its trace from disk, and the trace read back is the one traced (its
aten graph, node metadata and bookkeeping), for inference and training paths with
mutations and views; anything in the key that differs is a miss."""
from __future__ import annotations

import os

import pytest
import torch

import kiln
from kiln import config
from kiln.autograd import trace_cache
from kiln.autograd import trace as T


@pytest.fixture
def cache(tmp_path):
    with config.patch(trace_cache=True, cache_dir=str(tmp_path)):
        kiln.reset()
        yield tmp_path
        kiln.reset()


def _counts():
    return dict(trace_cache.stats)


def _delta(before):
    return {k: trace_cache.stats[k] - before[k] for k in before}


def program(x, w, buf):
    y = torch.nn.functional.gelu(x @ w)
    buf.add_(1)                   # a mutated input
    return y.t(), y.sum(0), buf.view(-1)[:3]   # views of an output and of an input


def _run(fn, backend, make, train):
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    args = make()
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = compiled(*args)
    ref = fn(*ref_args)
    for a, b in zip(out, ref):
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    for a, b in zip(args, ref_args):
        torch.testing.assert_close(a, b)          # the mutation reached the input
    if train:
        (out[0].sum() + out[1].sum()).backward()
        (ref[0].sum() + ref[1].sum()).backward()
        torch.testing.assert_close(args[0].grad, ref_args[0].grad)
        torch.testing.assert_close(args[1].grad, ref_args[1].grad)


def _make(train, dtype=torch.float32, n=4):
    def make():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 8, generator=g, dtype=dtype).requires_grad_(train)
        w = torch.randn(8, 8, generator=g, dtype=dtype).requires_grad_(train)
        return [x, w, torch.zeros(2, 3, dtype=dtype)]
    return make


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("train", [False, True])
def test_a_second_compile_reads_the_trace_and_matches_eager(cache, backend, train):
    c = _counts()
    _run(program, backend, _make(train), train)
    first = _delta(c)
    assert first["stored"] >= 1 and first["hits"] == 0, first
    c = _counts()
    _run(program, backend, _make(train), train)
    second = _delta(c)
    assert second["hits"] == first["stored"] and second["misses"] == 0, second


def test_the_trace_read_back_is_the_one_traced(cache):
    traced = []
    orig = T.trace_joint

    def spy(*a, **k):
        r = orig(*a, **k)
        traced.append(r)
        return r

    from kiln.autograd import runtime
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime, "trace_joint", spy)
        _run(program, "aot_eager", _make(True), True)
    tr = traced[0]
    back = trace_cache._trace_from(trace_cache.record_of(tr))
    assert [(n.op, n.name, n.target, str(n.args), str(n.kwargs)) for n in tr.graph.nodes] == \
        [(n.op, n.name, n.target, str(n.args), str(n.kwargs)) for n in back.graph.nodes]
    storages_a, storages_b = {}, {}
    for a, b in zip(tr.graph.nodes, back.graph.nodes):
        assert set(a.meta) == set(b.meta), a.name
        for k in a.meta:
            va, vb = a.meta[k], b.meta[k]
            if isinstance(va, torch.Tensor):
                assert (va.shape, va.stride(), va.storage_offset(), va.dtype, va.device) == \
                    (vb.shape, vb.stride(), vb.storage_offset(), vb.dtype, vb.device)
                # the kernel compiler asks whether a value is its whole storage and
                # whether a view shares its root's: storages come back as they were
                assert va.untyped_storage().nbytes() == vb.untyped_storage().nbytes(), a.name
                storages_a.setdefault(va.untyped_storage()._cdata, set()).add(a.name)
                storages_b.setdefault(vb.untyped_storage()._cdata, set()).add(b.name)
            elif not isinstance(va, (tuple, list)) or not any(isinstance(x, torch.Tensor) for x in va):
                assert va == vb, (a.name, k)
    assert sorted(map(sorted, storages_a.values())) == sorted(map(sorted, storages_b.values()))
    assert any(len(v) > 1 for v in storages_a.values())      # the program has views
    for f in ("num_inputs", "num_fw_outputs", "output_specs", "mutations", "differentiable",
              "grad_inputs", "grad_deps", "meta_mutations", "storage_inputs", "witnesses"):
        assert getattr(tr, f) == getattr(back, f), f
    live = {n.name for n in tr.graph.nodes}
    assert {n.name for n in tr.copied if n.name in live} == {n.name for n in back.copied}
    assert all(n.graph is back.graph for n in back.copied)


@pytest.mark.parametrize("change", ["dtype", "shape", "requires_grad", "graph"])
def test_what_the_trace_depends_on_is_in_the_key(cache, change):
    _run(program, "aot_eager", _make(False), False)
    c = _counts()
    if change == "dtype":
        _run(program, "aot_eager", _make(False, torch.float64), False)
    elif change == "shape":
        _run(program, "aot_eager", _make(False, n=5), False)
    elif change == "requires_grad":
        _run(program, "aot_eager", _make(True), True)
    else:
        def other(x, w, buf):
            y = torch.nn.functional.gelu(x @ w, approximate="tanh")
            buf.add_(1)
            return y.t(), y.sum(0), buf.view(-1)[:3]
        _run(other, "aot_eager", _make(False), False)
    d = _delta(c)
    assert d["hits"] == 0 and d["misses"] >= 1, d


def test_a_corrupt_entry_is_a_miss(cache):
    _run(program, "aot_eager", _make(False), False)
    files = [os.path.join(d, f) for d, _, fs in os.walk(cache / "aot_trace") for f in fs]
    assert files
    for path in files:
        with open(path, "r+b") as fh:
            fh.seek(30)
            fh.write(b"garbage!")
    c = _counts()
    _run(program, "aot_eager", _make(False), False)
    d = _delta(c)
    assert d["hits"] == 0 and d["misses"] >= 1 and d["stored"] >= 1, d
    c = _counts()
    _run(program, "aot_eager", _make(False), False)
    assert _delta(c)["hits"] >= 1


def test_off_reads_and_writes_nothing(tmp_path):
    with config.patch(trace_cache=False, cache_dir=str(tmp_path)):
        _run(program, "aot_eager", _make(False), False)
    assert not (tmp_path / "aot_trace").exists()
