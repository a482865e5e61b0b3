"""One-element CPU tensors in a GPU graph (kiln/kernels/lowering/host_scalars.py): read
by the device's kernels through one copy per op, or computed on the device where only
its kernels read them. Lowered here for a stand-in accelerator (the meta device: no GPU
needed to lower); the values on a real GPU are test_foreach_optimizers.py's CUDA tests.
A replayed graph makes its host copies outside the recording: test_host_prologue.py."""
import operator

import torch
import torch.fx as fx

from kiln.kernels import ir
from kiln.kernels.lowering import GraphLowering
from kiln.kernels.lowering.host_scalars import HostScalars

aten = torch.ops.aten


def _adam_steps(a, b, s1, s2, lr):
    """Adam's step counters (CPU, as eager keeps them) and a bias correction from them."""
    st = aten._foreach_add.Scalar([s1, s2], 1)
    bc = aten._foreach_sub.Scalar(aten._foreach_pow.ScalarAndTensor(0.9, [st[0], st[1]]), 1)
    r = aten._foreach_div.List([a, b], bc)
    q = aten._foreach_mul.Tensor([r[0], r[1]], lr)
    return q[0], q[1], st[0], st[1], aten.mul.Tensor(a, s1)


def _lower(fn, inputs):
    return GraphLowering(fx.symbolic_trace(fn), inputs, "triton").run()


def _inputs():
    return [torch.empty(4, 5, device="meta"), torch.empty(7, device="meta"),
            torch.tensor(2.0), torch.tensor(3.0), torch.tensor(0.1)]


def _externs(lo):
    return [(b.name, b.op) for b in lo.buffers if isinstance(b, ir.Extern)]


def test_device_ops_read_cpu_scalars_through_a_copy():
    lo = _lower(_adam_steps, _inputs())
    ops = [op for _, op in _externs(lo)]
    # the new step counters are outputs: computed on the CPU, by aten, as eager does
    assert aten._foreach_add.Scalar in ops
    assert lo.fallbacks == ["aten._foreach_add.Scalar"]
    # every device op is lowered, reading host values from device copies
    copies = [name for name, op in _externs(lo) if isinstance(op, HostScalars)]
    assert len(copies) == 3
    kernels = [b for b in lo.buffers if isinstance(b, ir.Pointwise)]
    on_device = {"in0", "in1"} | set(copies) | {b.name for b in kernels}
    assert len(kernels) == 3 and all(b.reads() <= on_device for b in kernels)


def test_a_cpu_chain_only_the_device_reads_is_computed_there():
    """The bias correction (pow, sub) is inlined into the kernels: no CPU op for it,
    and one copy of the step counters it starts from."""
    lo = _lower(_adam_steps, _inputs())
    assert {n.name for n in lo.device_side} >= {"_foreach_pow_scalar_and_tensor",
                                                "_foreach_sub_scalar"}
    ops = [op for _, op in _externs(lo)]
    assert aten._foreach_pow.ScalarAndTensor not in ops and aten._foreach_sub.Scalar not in ops
    body = ir.format_program(lo.buffers)
    assert "pow(0.9," in body


def test_a_cpu_graph_is_untouched():
    lo = GraphLowering(fx.symbolic_trace(_adam_steps),
                       [torch.randn(4, 5), torch.randn(7), torch.tensor(2.0), torch.tensor(3.0),
                        torch.tensor(0.1)], "cpp").run()
    assert not lo.device_side and not lo.host_copies and not lo.fallbacks
    assert not any(isinstance(op, HostScalars) for _, op in _externs(lo))


def test_cpu_constants_of_a_graph_without_cpu_inputs_stay_with_aten():
    """Without CPU inputs a graph may be replayed from a CUDA graph, which keeps a
    constant's value but would replay a host copy's: its CPU values stay with aten."""
    g = fx.Graph()
    x = g.placeholder("x")
    c = g.get_attr("c")
    g.output((g.call_function(aten.mul.Tensor, (x, c)),))
    root = torch.nn.Module()
    root.register_buffer("c", torch.tensor(2.0))
    lo = GraphLowering(fx.GraphModule(root, g), [torch.empty(4, device="meta")], "triton").run()
    assert not lo.host_values and lo.fallbacks == ["aten.mul.Tensor"]
    assert not any(isinstance(op, HostScalars) for _, op in _externs(lo))


def test_host_copies_are_scheduled_before_the_kernels():
    """The copies read only host values, so they move up to them: each parameter's new
    moment and new value then share one kernel (not one before the copy, one after)."""
    from kiln.kernels import compile as kc
    from .host_prologue_cases import adam_graph, stand_in_inputs
    p = kc.plan(adam_graph(2), stand_in_inputs(2), "triton")
    groups = p.sched.groups
    kinds = ["copy" if g.extern is not None and isinstance(g.extern.op, HostScalars)
             else "extern" if g.extern is not None else "kernel" for g in groups]
    assert kinds == ["extern", "copy", "copy", "kernel", "kernel"], kinds
    outputs = [v.buf for v in p.lowered.outputs[:4]]     # new params, new moments
    for param, moment in zip(outputs[:2], outputs[2:]):
        assert any({param, moment} <= g.names for g in groups), p.artefacts["schedule"]


def _first_adam_step() -> fx.GraphModule:
    """Adam's first step as a GPU trace captures it: the step counters are made in the
    graph (CPU constants, no state yet), bumped, and returned (the new state); the
    bias corrections and the stacked step sizes come from them on the CPU; the graph
    takes no CPU tensor (``loss``, a device 0-d, rides along unused)."""
    g = fx.Graph()
    cf = g.call_function
    ps, ms, vs = ([g.placeholder(f"{k}{i}") for i in range(2)] for k in "pmv")
    g.placeholder("loss")
    counters = [g.get_attr(f"step{i}") for i in range(2)]
    add = cf(aten._foreach_add.Scalar, (counters, 1))
    st = [cf(operator.getitem, (add, i)) for i in range(2)]
    bc1 = [cf(aten.sub.Tensor, (1, cf(aten.pow.Scalar, (0.9, s)))) for s in st]
    bc2 = [cf(aten.sub.Tensor, (1, cf(aten.pow.Scalar, (0.999, s)))) for s in st]
    sizes = cf(aten.stack.default, ([cf(aten.div.Tensor, (-0.01, b)) for b in bc1],))
    root = cf(aten._foreach_sqrt.default, (vs,))
    denom = cf(aten._foreach_div.List, ([cf(operator.getitem, (root, i)) for i in range(2)],
                                        [cf(aten.sqrt.default, (b,)) for b in bc2]))
    new = cf(aten._foreach_addcdiv.Tensor,
             (ps, ms, [cf(operator.getitem, (denom, i)) for i in range(2)], sizes))
    g.output(tuple(cf(operator.getitem, (new, i)) for i in range(2)) + tuple(st))
    m = torch.nn.Module()
    for i in range(2):
        m.register_buffer(f"step{i}", torch.tensor(0.0))
    return fx.GraphModule(m, g)


def test_a_graph_returning_cpu_values_reads_host_values():
    """A graph that takes no CPU tensor but returns some (Adam's first step, its new
    step counters made from constants) does host work every call as one taking CPU
    counters does: its device ops reading CPU values (``_foreach_div.List`` by the bias
    corrections, ``_foreach_addcdiv.Tensor`` by the stacked step sizes) are lowered,
    reading host copies, not left to aten (as a GPU run found them)."""
    shapes = [(4, 5), (7,)] * 3
    inputs = [torch.empty(s, device="meta") for s in shapes] + [torch.empty((), device="meta")]
    lo = GraphLowering(_first_adam_step(), inputs, "triton").run()
    assert lo.host_values
    assert lo.fallbacks == ["aten._foreach_add.Scalar"]        # the CPU counters' own op
    assert any(isinstance(op, HostScalars) for _, op in _externs(lo))
