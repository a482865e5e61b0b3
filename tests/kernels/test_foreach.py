"""The ``_foreach_*`` lowerings (kiln/kernels/lowering/foreach.py): each element lowered
as its per-tensor op, kept lazy until read, so a chain of list ops fuses per tensor.
Values against eager are in the shared kernel cases (``foreach`` in cases.py, C++ and
Triton); whole optimizer steps in test_foreach_optimizers.py."""
import pytest
import torch
import torch.fx as fx

from kiln.autograd.ops import CORE_OPS
from kiln.kernels import ir
from kiln.kernels.compile import build
from kiln.kernels.lowering import GraphLowering
from kiln.kernels.lowering.foreach import PER_TENSOR
from kiln.ops import CATALOGUE

from .foreach_cases import foreach_graph, foreach_inputs

aten = torch.ops.aten


def _foreach_externs(lo):
    return [b.op for b in lo.buffers if isinstance(b, ir.Extern) and "_foreach_" in str(b.op)]


@pytest.mark.parametrize("target", ["cpp", "triton"])
def test_every_foreach_op_is_lowered(target):
    """No ``_foreach_`` op of the case graph is left to run as aten (the lowering's
    removal makes every one of them an extern)."""
    gm = foreach_graph()
    n_ops = sum(1 for n in gm.graph.nodes if "_foreach_" in str(n.target))
    assert n_ops >= len(PER_TENSOR)
    lo = GraphLowering(gm, foreach_inputs(), target).run()
    assert not lo.fallbacks, lo.fallbacks
    assert not _foreach_externs(lo)


def test_the_catalogue_lists_exactly_the_lowered_ops():
    """The op catalogue names the module, and the verifier accepts them in CORE graphs
    (where a traced optimizer step puts them)."""
    listed = {op for op, i in CATALOGUE.items() if i.lowering == "foreach"}
    assert listed == set(PER_TENSOR)
    for op in PER_TENSOR:
        assert op in CORE_OPS and not CATALOGUE[op].library_call, op


def _adam_like(p0, p1, p2, g0, g1, g2, m0, m1, m2, v0, v1, v2, step):
    """Adam's update as its foreach path writes it, for three parameters."""
    ps, gs, ms, vs = [p0, p1, p2], [g0, g1, g2], [m0, m1, m2], [v0, v1, v2]
    st = aten._foreach_add.Scalar([step], 1)
    m = aten._foreach_lerp.Scalar(ms, gs, 0.1)
    v = aten._foreach_addcmul.Scalar(aten._foreach_mul.Scalar(vs, 0.999), gs, gs, 0.001)
    bc = aten._foreach_pow.ScalarAndTensor(0.999, [st[0], st[0], st[0]])
    denom = aten._foreach_add.Scalar(
        aten._foreach_div.List(aten._foreach_sqrt.default([v[0], v[1], v[2]]),
                               aten._foreach_sqrt.default(aten._foreach_neg.default(
                                   aten._foreach_sub.Scalar([bc[0], bc[1], bc[2]], 1)))), 1e-8)
    p = aten._foreach_addcdiv.Scalar(ps, [m[0], m[1], m[2]], [denom[0], denom[1], denom[2]],
                                     -0.01)
    return p[0], p[1], p[2], m[0], m[1], m[2], v[0], v[1], v[2], st[0]


def _adam_inputs():
    shapes = [(6, 5), (9,), (6, 5)]
    ts = [torch.randn(s) for s in shapes]                   # p
    ts += [torch.randn(s) for s in shapes]                  # g
    ts += [torch.randn(s) * 0.1 for s in shapes]            # m
    ts += [torch.rand(s) * 0.1 for s in shapes]             # v
    return ts + [torch.tensor(2.0)]


@pytest.mark.parametrize("target", ["cpp", "triton"])
def test_each_parameter_update_is_one_kernel(target):
    """The update reads p, g, m, v once and writes p, m, v once: one kernel per
    parameter, besides the step counter's (0-d). Each element stays lazy until read
    (realized as a list, every intermediate list would be stored), and the scheduler
    puts each parameter's three outputs together although the list ops make them one
    list after another."""
    gm = fx.symbolic_trace(_adam_like)
    lo = GraphLowering(gm, _adam_inputs(), target).run()
    from kiln.kernels.compile import _schedule
    sched = _schedule(lo, target)
    kernels = [g for g in sched.groups if g.extern is None and g.alone is None]
    sized = [g for g in kernels if ir.numel_of(g.outer + (g.red or ())) > 1]
    assert len(sized) <= 3, [(g.outer, [n.name for n in g.nodes]) for g in kernels]
    for i in range(3):                  # p_i, m_i and v_i come out of one kernel
        mine = {lo.outputs[i].buf, lo.outputs[3 + i].buf, lo.outputs[6 + i].buf}
        assert any(mine <= g.names for g in sized), (i, sched.groups)
    stored = [b for b in lo.buffers if isinstance(b, ir.Pointwise) and b.numel > 1]
    assert len(stored) == 9          # the outputs only: no intermediate list is stored


def test_adam_like_chain_matches_eager_bit_for_bit_on_the_cpu():
    """The C++ formulas are eager's CPU kernels' own (fused multiply-adds where its
    compiler contracts them: lerp, addcmul, add with alpha), so the update is exact."""
    gm = fx.symbolic_trace(_adam_like)
    inputs = _adam_inputs()
    rt, _ = build(gm, inputs, "cpp")
    for got, want in zip(rt(*inputs), gm(*inputs)):
        assert not want.isnan().any() and torch.equal(got, want)


@pytest.mark.parametrize("weight", [0.1, 0.8, -0.3])
def test_lerp_and_alpha_forms_are_exact_on_the_cpu(weight):
    def f(a, b, c, d, w, w2):
        r = aten._foreach_lerp.Scalar([a, b], [c, d], weight)
        s = aten._foreach_lerp.List([a, b], [c, d], [w, w2])
        t = aten._foreach_addcmul.Scalar([a, b], [c, d], [w, w2], -0.3)
        u = aten._foreach_add.List([a, b], [c, d], alpha=weight)
        v = aten._foreach_sub.List([a, b], [c, d], alpha=weight)
        return r[0], r[1], s[0], s[1], t[0], t[1], u[0], u[1], v[0], v[1]
    inputs = [torch.randn(1000), torch.randn(37), torch.randn(1000), torch.randn(37),
              torch.rand(1000) * 1.4 - 0.2, torch.rand(37) * 1.4 - 0.2]
    gm = fx.symbolic_trace(f)
    rt, _ = build(gm, inputs, "cpp")
    for got, want in zip(rt(*inputs), gm(*inputs)):
        assert torch.equal(got, want)


def test_integer_addcdiv_is_declined():
    """Eager raises for integer addcdiv; a kernel could not, so the formula declines
    (the op then runs as aten, raising as eager does)."""
    from kiln.kernels.lowering import Unsupported, View
    x = View("in0", (3,), (1,), 0, torch.int64)
    with pytest.raises(Unsupported):
        PER_TENSOR[aten._foreach_addcdiv.Scalar](None, None, x, x, x)


def _tensor_scalars(x0, x1, x2, a0, a1, a2, b0, b1, b2, s):
    xs, as_, bs = [x0, x1, x2], [a0, a1, a2], [b0, b1, b2]
    d = aten._foreach_addcdiv.Tensor(xs, as_, bs, s)
    m = aten._foreach_addcmul.Tensor(xs, as_, bs, s)
    return d[0], d[1], d[2], m[0], m[1], m[2]


def _tensor_scalars_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 4), (7,), ()]
    ts = [torch.randn(s, generator=g) for s in shapes * 2]
    ts += [torch.rand(s, generator=g) + 0.5 for s in shapes]
    return ts + [torch.tensor([-0.3, 1.7, 1e-3])]


def test_tensor_scalars_are_a_value_per_tensor_bit_for_bit_on_the_cpu():
    """``_foreach_addcdiv/addcmul.Tensor`` (a non-capturable Adam's step sizes): element
    i reads value i of ``scalars``; the C++ kernels do eager's CPU float ops in eager's
    order (``x + (s * a) / b``; ``fma(s * a, b, x)``), so the results are eager's bits."""
    from kiln.kernels import compile_aten_graph
    gm = fx.symbolic_trace(_tensor_scalars)
    c = compile_aten_graph(gm, _tensor_scalars_inputs(), target="cpp")
    for seed in range(3):
        args = _tensor_scalars_inputs(seed)
        for got, want in zip(c(*args), gm(*args)):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want), (got - want).abs().max()
    lo = GraphLowering(gm, _tensor_scalars_inputs(), "cpp").run()
    assert not lo.fallbacks and not _foreach_externs(lo)


def test_every_foreach_op_is_lowered_beside_cpu_scalars_on_a_device():
    """On an accelerator (the meta device stands in) the case's lists are on the
    device and the ``.Tensor`` overloads' scalars stay on the CPU, where eager wants
    them (it refuses device scalars): eager runs the graph so, and every op is lowered,
    the kernels reading the scalars through one host copy."""
    from kiln.kernels.lowering.host_scalars import HostScalars
    gm, inputs = foreach_graph(), foreach_inputs(device="meta")
    assert [t.device.type for t in inputs].count("cpu") == 1 and inputs[-1].dim() == 1
    gm(*inputs)
    lo = GraphLowering(gm, inputs, "triton").run()
    assert not lo.fallbacks, lo.fallbacks
    assert not _foreach_externs(lo)
    assert sum(isinstance(b, ir.Extern) and isinstance(b.op, HostScalars)
               for b in lo.buffers) == 1
