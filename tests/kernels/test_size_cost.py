"""What a new size of a symbolic graph costs the host (issue 23): the lowering's
shortcuts (``Lazy.load`` made once per index, ``ir.op_count`` cached on the expression,
a plan's IR and schedule texts made at first read) change no plan. A symbolic graph is
specialised at several sizes and planned with the shortcuts and without them (the
plain walks put back); sources, IR and schedule texts must be byte-identical."""
from __future__ import annotations

import pickle

import pytest
import torch

from benchmarks import size_variants
from kiln import config
from kiln.autograd import specialize
from kiln.kernels import compile as kcompile, ir
from kiln.kernels.lowering import base
from kiln.kernels.plan_artefacts import Artefacts


def _plain_op_count(e, limit=None):
    """``ir.op_count`` as a plain walk, nothing cached."""
    seen, todo, n = set(), [e], 0
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        if isinstance(x, ir.Op):
            n += 1
            if limit is not None and n > limit:
                return n
        todo.extend(x.children())
    return n


def _convnet():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4),
    ).eval()
    return (lambda x: m(x)), [torch.randn(b, 3, 16, 16) for b in (2, 3)], [1, 5, 8, 13]


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    cfg.use_cache = False
    m = LlamaForCausalLM(cfg).eval()
    return (lambda x: m(x).logits[:, -1, :]), [torch.randint(0, 128, (2, n)) for n in (9, 12)], \
        [7, 16, 33]


def _plans(psg, base_args, sizes, target):
    out = []
    with config.patch(graph_cache=False):
        for n in sizes:
            args = size_variants.at_size(psg, base_args, n)
            values = specialize.solve(specialize._equations(psg.placeholders, args), psg.symbols)
            gm, keep, _ = specialize.specialise(psg.gm, values, args)
            p = kcompile.plan(gm, [args[i] for i in keep], target)
            out.append((p.source, p.artefacts["ir"], p.artefacts["schedule"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("target", ["triton", "cpp"])
@pytest.mark.parametrize("workload", [_convnet, _llama], ids=["convnet", "llama"])
def test_artefact_texts_as_at_scheduling(workload, target, monkeypatch):
    """The IR and schedule texts made at first read are those made right after
    scheduling (where ``plan`` made them before): code generation changes neither."""
    from kiln.kernels.scheduler import format_schedule
    made = []
    real = kcompile._schedule

    def schedule(lo, tgt):
        sched = real(lo, tgt)
        made.append((ir.format_program(lo.buffers), format_schedule(sched)))
        return sched
    monkeypatch.setattr(kcompile, "_schedule", schedule)
    run, inputs, sizes = workload()
    psg, base_args = size_variants.symbolic_graph(run, inputs)
    plans = _plans(psg, base_args, sizes, target)
    assert len(made) == len(plans) == len(sizes)
    for (_, text, sched), (text0, sched0) in zip(plans, made):
        assert text == text0 and sched == sched0


@pytest.mark.slow
@pytest.mark.parametrize("target", ["triton", "cpp"])
@pytest.mark.parametrize("workload", [_convnet, _llama], ids=["convnet", "llama"])
def test_shortcuts_change_no_plan(workload, target, monkeypatch):
    run, inputs, sizes = workload()
    psg, base_args = size_variants.symbolic_graph(run, inputs)
    fast = _plans(psg, base_args, sizes, target)
    monkeypatch.setattr(base.Lazy, "load", lambda self, idx: self.fn(idx))
    monkeypatch.setattr(ir, "op_count", _plain_op_count)
    monkeypatch.setattr(ir, "ops_exceed", lambda e, limit: (_plain_op_count(e, limit) > limit,
                                                            _plain_op_count(e) > 0))
    plain = _plans(psg, base_args, sizes, target)
    assert len({f[0] for f in fast}) >= 1
    for n, f, p in zip(sizes, fast, plain):
        assert f == p, f"size {n}: the plan differs from the plain path's"


def test_lazy_load_is_made_once_per_index():
    calls = []

    def fn(idx):
        calls.append(list(idx))
        return ir.Op("add", (ir.Load("b", idx[0], torch.float32), ir.Const(1.0, torch.float32)),
                     torch.float32)
    lz = base.Lazy((4,), torch.float32, fn)
    x0, x1 = ir.Affine.var("x0"), ir.Affine.var("x1")
    a, b, c = lz.load([x0]), lz.load([ir.Affine.var("x0")]), lz.load([x1])
    assert a is b and a is not c and a != c
    assert calls == [[x0], [x1]]


def test_op_count_cached_matches_the_walk():
    x = ir.Load("b", ir.Affine.var("x0"), torch.float32)
    e = x
    for i in range(10):
        e = ir.Op("mul" if i % 2 else "add", (e, x), torch.float32)
    shared = ir.Op("add", (e, e), torch.float32)
    for limit in (3, None, 5, 20, 2, None, 11, 10, 12):
        assert ir.op_count(shared, limit) == _plain_op_count(shared, limit), limit
        assert ir.op_count(e, limit) == _plain_op_count(e, limit), limit
    fresh = ir.Op("neg", (e,), torch.float32)
    assert ir.op_count(fresh, 4) == 5 and ir.op_count(fresh, 2) == 3 and ir.op_count(fresh) == 11
    # the caches are not pickled
    assert not {"_ops", "_ops_over"} & set(pickle.loads(pickle.dumps(fresh)).__dict__)


def test_op_count_and_reads_of_long_chains():
    """Long chains (past the engine's inlining limit): counts exact under every limit,
    with parts of them counted (and cached) first; reads every buffer."""
    loads = [ir.Load(f"b{i}", ir.Affine.var("x0"), torch.float32) for i in range(5)]
    e, steps = loads[0], []
    for i in range(2 * 128):
        e = ir.Op("add", (e, loads[i % 5]), torch.float32)
        steps.append(e)
    for i in (3, 128 - 2, 128 + 7, len(steps) - 1):
        x = steps[i]
        ir.op_count(steps[max(i - 40, 0)])      # a part of it cached first
        for limit in (None, 1, 96, 128, 128 + 1, 10**6):
            assert ir.op_count(x, limit) == _plain_op_count(x, limit), (i, limit)
        assert ir.loaded_buffers(x) == frozenset(y.buf for y in ir.walk(x) if isinstance(y, ir.Load))


def test_ops_exceed_matches_the_count():
    """The bound settles what it can; shared sub-expressions (a bound above the count)
    and long chains are counted."""
    import random
    rng = random.Random(0)
    leaves = [ir.Load(f"b{i}", ir.Affine.var("x0"), torch.float32) for i in range(3)] + \
        [ir.Const(2.0, torch.float32)]
    pool = list(leaves)
    for i in range(300):
        a, b = rng.choice(pool[-20:]), rng.choice(pool)
        pool.append(ir.Op(rng.choice(["add", "mul", "max"]), (a, b), torch.float32))
    for e in leaves + pool[::7]:
        for limit in (0, 1, 5, 96):
            n = _plain_op_count(e)
            assert ir.ops_exceed(e, limit) == (n > limit, n > 0), (e, limit)
    x = leaves[0]
    sq = ir.Op("mul", (ir.Op("neg", (x,), torch.float32),) * 2, torch.float32)
    assert ir._op_bound(sq) == 3 and ir.op_count(sq) == 2 and ir.ops_exceed(sq, 2) == (False, True)
    assert ir.ops_exceed(x, 0) == (False, False)


def test_artefacts_are_made_at_first_read():
    made = []

    def make():
        made.append(1)
        return "text"
    a = Artefacts({"target": "cpp"}, {"ir": make})
    assert made == [] and "ir" in a and len(a) == 2 and a.get("nope") is None
    assert a["ir"] == "text" and a["ir"] == "text" and made == [1]
    b = Artefacts({"target": "cpp"}, {"ir": make})
    assert dict(b) == {"target": "cpp", "ir": "text"} and sorted(b) == ["ir", "target"]
    c = pickle.loads(pickle.dumps(Artefacts({}, {"ir": make})))
    assert type(c) is dict and c == {"ir": "text"}
    with pytest.raises(KeyError):
        a["missing"]


def test_meta_runs_remembered_by_layout_and_dtype():
    """``GraphLowering._meta_run`` answers from its table only for the same op,
    argument layouts, dtypes and scalars; anything else runs again."""
    from kiln.kernels.lowering import engine
    lo = object.__new__(engine.GraphLowering)
    lo.by_name = {"a": ir.Input("a", (2, 3, 4, 4), (48, 1, 12, 3), torch.float32),
                  "w": ir.Input("w", (5, 3, 1, 1), (3, 1, 1, 1), torch.float32),
                  "h": ir.Input("h", (2, 3, 4, 4), (48, 1, 12, 3), torch.float16)}
    conv = torch.ops.aten.convolution.default

    def arg(buf, strides=(48, 1, 12, 3)):
        return ir.ExternArg(buf, (2, 3, 4, 4), strides, 0)
    w = ir.ExternArg("w", (5, 3, 1, 1), (3, 1, 1, 1), 0)
    rest = (None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    cl = lo._meta_run(conv, (arg("a"), w) + rest, {})
    assert lo._meta_run(conv, (arg("a"), w) + rest, {}) is cl

    def direct(strides, stride=(1, 1)):
        x = torch.empty_strided((2, 3, 4, 4), strides, device="meta")
        return conv(x, torch.empty(5, 3, 1, 1, device="meta"), None, list(stride), [0, 0],
                    [1, 1], False, [0, 0], 1)
    assert (cl.shape, cl.stride()) == (direct((48, 1, 12, 3)).shape, direct((48, 1, 12, 3)).stride())
    plain = lo._meta_run(conv, (arg("a", (48, 16, 4, 1)), w) + rest, {})
    assert plain is not cl and plain.stride() == direct((48, 16, 4, 1)).stride()
    strided = lo._meta_run(conv, (arg("a"), w) + (None, [2, 2]) + rest[2:], {})
    assert strided.shape == (2, 5, 2, 2) == direct((48, 1, 12, 3), (2, 2)).shape
    assert engine._frozen([1], {}) != engine._frozen([1.0], {}) != engine._frozen((True,), {})
    assert engine._frozen((arg("a"),), lo.by_name) != engine._frozen((arg("h"),), lo.by_name)
