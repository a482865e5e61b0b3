"""A reshape that merges dims keeps a lazy value lazy when its reads stay affine
(``kernels/lowering/reindex.py``), and a gather reads a lazy value where it picks: an LM
loss's fp32 cast of its bf16 logits, flattened to [B*S, V], is computed inside the
loss's reductions instead of stored (forward and backward). C++ here; the same cases
through Triton under the interpreter in a child pytest (``merge_reshape_cases.py``)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import compile as kcompile
from kiln.kernels import ir
from kiln.kernels.lowering import reindex
from kiln.kernels.lowering.base import Lazy

from .merge_reshape_cases import (CASES, Head, check_case, gpt2, gpt2_inputs, head_inputs,
                                  lm_plans, logits_sized)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
aten = torch.ops.aten


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_cpp(name):
    check_case(name, "cpp")


@pytest.mark.parametrize("src,dst,runs", [
    ((2, 16, 37), (32, 37), [((0, 1), (0,)), ((2,), (1,))]),
    ((32, 37), (2, 16, 37), [((0,), (0, 1)), ((1,), (2,))]),
    ((6, 4), (4, 6), [((0, 1), (0, 1))]),
    ((2, 1, 16, 1, 37), (32, 1, 37), [((0, 2), (0,)), ((4,), (2,))]),
    ((1, 1), (1,), []),
    ((0, 3), (3, 0), None), ((2, 3), (5,), None)])
def test_reshape_runs(src, dst, runs):
    assert reindex.reshape_runs(src, dst) == runs


def _strided_lazy(sizes, strides):
    """A lazy value reading buffer ``b`` at ``strides`` (plus one: a pointwise op)."""
    def fn(idx):
        return ir.Op("neg", (ir.Load("b", ir.linear_index(idx, strides), torch.float32),),
                     torch.float32)
    return Lazy(tuple(sizes), torch.float32, fn)


def _positions(sizes):
    return torch.cartesian_prod(*[torch.arange(s) for s in sizes]).view(-1, len(sizes)).tolist()


def _read_at(e, names, pos) -> int:
    (load,) = [x for x in ir.walk(e) if isinstance(x, ir.Load)]
    env = dict(zip(names, pos))
    return sum(k * env[v] for v, k in load.index.terms) + load.index.const


@pytest.mark.parametrize("src,dst,perm", [
    ((2, 3, 4), (6, 4), None), ((2, 3, 4), (24,), None), ((2, 3, 4), (2, 12), None),
    ((6, 4), (4, 6), None), ((2, 1, 3, 1, 4), (6, 1, 4), None), ((4, 6), (2, 12), None),
    ((3, 2, 4), (6, 4), (1, 0, 2)), ((2, 3, 4), (6, 4), (0, 2, 1))])
def test_every_element_is_read_where_torch_puts_it(src, dst, perm):
    """The re-indexed value reads, at every output position, the buffer element that
    torch's reshape puts there; a value whose layout does not merge (a permuted read)
    is declined."""
    buf = torch.arange(int(torch.tensor(src).prod()))
    base = buf.view(src) if perm is None else \
        buf.view([src[p] for p in perm]).permute(*[perm.index(i) for i in range(len(src))])
    lazy = _strided_lazy(src, base.stride())
    out = reindex.reshape_lazy(lazy, dst)
    try:
        want = base.view(dst)
    except RuntimeError:        # torch would copy: the merged index needs a division
        assert out is None
        return
    assert out is not None
    names = [f"y{j}" for j in range(len(dst))]
    e = out.load([ir.Affine.var(n) for n in names])
    for pos in _positions(dst):
        assert _read_at(e, names, pos) == want[tuple(pos)].item()


def _merge_read_by_product(x, w):
    y = aten.view.default(aten.relu.default(x), [32, 37])
    return (aten.mm.default(y, w), aten.exp.default(y))


def test_a_merged_value_stored_after_all_keeps_its_own_shape():
    """Read by a product and by a pointwise op, the merged value is stored — in its
    shape before the merge (the loop nest of the kernel computing it), then viewed."""
    x, w = torch.randn(2, 16, 37), torch.randn(37, 5)
    with config.patch(graph_cache=False):
        rt, art = kcompile.build(fx.symbolic_trace(_merge_read_by_product), [x, w], "cpp")
        p = kcompile.plan(fx.symbolic_trace(_merge_read_by_product), [x, w], "cpp")
    for a, b in zip(rt(x, w), _merge_read_by_product(x, w)):
        assert a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b)
    relu = [b for b in p.lowered.buffers if isinstance(b, ir.Pointwise) and b.numel == 32 * 37
            and b.name not in {v.buf for v in p.lowered.outputs}]
    assert [tuple(b.sizes) for b in relu] == [(2, 16, 37)], art["ir"]


def _shared_by_gather(x, y):
    v = aten.mul.Tensor(x, 3.0)
    return (aten.amax.default(v, [1]), aten.gather.default(v, 1, y))


@pytest.mark.parametrize("k,stored", [(2, 0), (9, 1)])
def test_a_gather_reader_counts_as_reading_once_when_it_picks_fewer(k, stored):
    """A value read by a reduction and a gather: computed again in both when the
    gather picks no more elements than the value has (recompute's READS_PER_RESULT);
    stored when it picks more (each pick would compute it again)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 7, generator=g), torch.randint(0, 7, (4, k), generator=g)
    with config.patch(graph_cache=False):
        rt, art = kcompile.build(fx.symbolic_trace(_shared_by_gather), [x, y], "cpp")
        p = kcompile.plan(fx.symbolic_trace(_shared_by_gather), [x, y], "cpp")
    for a, b in zip(rt(x, y), _shared_by_gather(x, y)):
        torch.testing.assert_close(a, b)
    outs = {v.buf for v in p.lowered.outputs}
    mids = [b for b in p.lowered.buffers if isinstance(b, ir.Pointwise) and b.name not in outs]
    assert len(mids) == stored, art["ir"]


def test_lm_head_stores_no_fp32_logits_cpp(monkeypatch):
    """The C++ path has no bf16: the same loss on fp64 logits cast from fp32 — the cast
    is stored in neither graph (the backward stores the fp32 gradient for the weight's
    product, nothing fp64 of the logits' size)."""
    class HeadF64(Head):
        def forward(self, x, y):
            logits = x @ self.w.t()
            return torch.nn.functional.cross_entropy(
                logits.double().view(-1, self.v), y.view(-1), ignore_index=-100)
    fw, bw = lm_plans("cpp", monkeypatch, HeadF64(), head_inputs(),
                      dict(rtol=1e-6, atol=1e-7), autocast=None)
    assert logits_sized(fw, 16 * 300, torch.float64) == [], fw.artefacts["ir"]
    assert logits_sized(bw, 16 * 300, torch.float64) == [], bw.artefacts["ir"]


@pytest.mark.slow
def test_gpt2_cpp(monkeypatch):
    """The whole model in float32 (the C++ path has no bf16): loss and gradients as
    eager's; the forward stores nothing of the logits' size but the product's result."""
    fw, bw = lm_plans("cpp", monkeypatch, gpt2(), gpt2_inputs(), dict(rtol=1e-4, atol=1e-5),
                      autocast=None)
    assert logits_sized(fw, 2 * 16 * 257) == [], fw.artefacts["ir"]


def _loss_on_merged(x, y):
    """An LM loss on [B, S, V] logits cast up and flattened: amax and the target's pick."""
    b, s, v = x.shape
    lg = aten.view.default(aten._to_copy.default(x, dtype=torch.float64), [b * s, v])
    picked = aten.gather.default(lg, 1, aten.unsqueeze.default(y, 1))
    return (aten.sum.default(aten.sub.Tensor(picked, aten.amax.default(lg, [1], True))),)


def _loss_inputs(b, s):
    g = torch.Generator().manual_seed(b * 100 + s)
    return torch.randn(b, s, 37, generator=g), torch.randint(0, 37, (b * s,), generator=g)


def test_merged_kernels_are_reused_across_sizes(tmp_path, monkeypatch):
    """The merged index's sizes are kernel arguments like any other (``size_args``): a
    second and third batch size of one size class run no compiler, and match eager."""
    from kiln.kernels.toolchain import cxx_build

    from .size_generic_cases import run_sizes
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    runs = []
    real = cxx_build._run_compiler
    monkeypatch.setattr(cxx_build, "_run_compiler", lambda cmd: (runs.append(cmd), real(cmd)))
    costs, _ = run_sizes(_loss_on_merged, _loss_inputs, [(2, 40), (3, 40), (2, 44)], "cpp",
                         lambda: len(runs))
    assert costs[0] >= 1 and costs[1:] == [0, 0], costs


def _child_pytest(tmp_path, select):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select,
           os.path.join(HERE, "merge_reshape_cases.py"), "--rootdir", ROOT]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    last = r.stdout.splitlines()[-1]
    assert "passed" in last and "skipped" not in last and "failed" not in last, r.stdout[-2000:]


@pytest.mark.slow
def test_triton_interpreter_cases(tmp_path):
    _child_pytest(tmp_path, "not gpt2")


@pytest.mark.slow
def test_gpt2_triton_interpreter(tmp_path):
    _child_pytest(tmp_path, "gpt2")
