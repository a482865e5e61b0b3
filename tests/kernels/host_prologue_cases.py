"""A GPU graph reading CPU step counters, built on a CPU machine: lowered for a stand-in
accelerator (the meta device) as the Triton target, so its kernels read the counters
through host copies as on a GPU. Shared by ``test_host_prologue.py`` (the split, with
kernels that do nothing) and ``test_host_prologue_interp.py`` (Triton's interpreter
running the kernels on CPU tensors: ``python host_prologue_cases.py`` prints "ok")."""
from __future__ import annotations

import operator
import sys

import torch
import torch.fx as fx

aten = torch.ops.aten


def adam_graph(n=2) -> fx.GraphModule:
    """Adam's shape over ``n`` parameters: CPU step counters bumped, bias corrections
    from them, a tensor lr. Inputs: params, grads, moments (device), counters, lr (CPU);
    outputs: new params, new moments, new counters."""
    g = fx.Graph()
    cf = g.call_function
    ps, gs, ms, ss = ([g.placeholder(f"{k}{i}") for i in range(n)] for k in "pgms")
    lr = g.placeholder("lr")

    def items(node):
        return [cf(operator.getitem, (node, i)) for i in range(n)]
    st = items(cf(aten._foreach_add.Scalar, (ss, 1)))
    m = items(cf(aten._foreach_add.List, (items(cf(aten._foreach_mul.Scalar, (ms, 0.9))), gs),
                 {"alpha": 0.1}))
    bc = items(cf(aten._foreach_sub.Scalar, (items(cf(aten._foreach_pow.ScalarAndTensor,
                                                      (0.9, st))), 1)))
    r = items(cf(aten._foreach_div.List, (m, bc)))
    q = items(cf(aten._foreach_mul.Tensor, (r, lr)))
    new = items(cf(aten._foreach_add.List, (ps, q)))
    g.output(tuple(new + m + st))
    return fx.GraphModule(torch.nn.Module(), g)


def shapes(n=2):
    return [[(4, 5), (7,)][i % 2] for i in range(n)] * 3


def stand_in_inputs(n=2):
    return [torch.empty(*s, device="meta") for s in shapes(n)] + \
        [torch.tensor(2.0 + i) for i in range(n)] + [torch.tensor(0.1)]


def real_inputs(seed, steps=(2.0, 3.0), lr=0.1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(device) for s in shapes(len(steps))] + \
        [torch.tensor(float(s)) for s in steps] + [torch.tensor(lr)]


def runtime(n=2, kernels=None, gm=None, inputs=None):
    """(graph module, Runtime on the stand-in device) of ``adam_graph(n)`` or ``gm``
    on ``inputs``: ``kernels`` None gives kernels that do nothing (what the split
    needs), else the loaded Triton kernels."""
    from kiln.kernels import compile as kc
    from kiln.kernels.runtime.runner import Runtime
    if gm is None:
        gm, inputs = adam_graph(n), stand_in_inputs(n)
    p = kc.plan(gm, inputs, "triton")
    if kernels is None:
        kernels = [_nothing(params) for _, params in p.entries]
    else:
        kernels = kc._load(p, "triton")
    return gm, Runtime(p.lowered, p.sched, kc._steps(p, kernels, "triton"), p.lowered.device)


def _nothing(params):
    def kernel(rt, tensors):
        pass
    kernel.params = params
    return kernel


def interpreted():
    """The split graph run for real, call after call: the prologue on the CPU, the
    rest (Triton under the interpreter, CPU tensors standing in for the device's)
    reading the counters from the static buffer; each call against eager."""
    from kiln.kernels.runtime import host_prologue
    _, plan = host_prologue.first_call(runtime()[1], stand_in_inputs())   # the same steps
    gm, rt = runtime(kernels=True)
    assert isinstance(plan, host_prologue.HostPlan), plan
    rt.device = torch.device("cpu")
    host = host_prologue.HostPrologue(rt, plan, device="cpu")
    addresses = {n: v.data_ptr() for n, v in host.views.items()}
    for call, steps in enumerate([(2.0, 3.0), (3.0, 4.0), (10.0, 1.0)]):
        args = real_inputs(call, steps, lr=0.1 * (call + 1))
        versions = [a._version for a in args]
        got = host.run(args)
        flat = host.strip(host.device_rt.run_flat(host.device_tensors(args, got)))
        for i, t in got.outputs.items():
            flat[i] = t
        want = gm(*args)
        assert len(flat) == len(want)
        for a, b in zip(flat, want):
            assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert [a._version for a in args] == versions       # the graph is functional
        assert {n: v.data_ptr() for n, v in host.views.items()} == addresses
        assert host.views[plan.copies[0].name].tolist() == [steps[0] + 1, steps[1] + 1]


if __name__ == "__main__":
    interpreted()
    print("ok")
    sys.exit(0)
