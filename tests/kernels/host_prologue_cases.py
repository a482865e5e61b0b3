"""A GPU graph reading CPU step counters, built on a CPU machine: lowered for a stand-in
accelerator (the meta device) as the Triton target, so its kernels read the counters
through host copies as on a GPU. Shared by ``test_host_prologue.py`` (the split, with
kernels that do nothing) and ``test_host_prologue_interp.py`` (Triton's interpreter
running the kernels on CPU tensors: ``python host_prologue_cases.py`` prints "ok")."""
from __future__ import annotations

import sys

import torch
import torch.fx as fx

aten = torch.ops.aten


def adam_like(p1, p2, g1, g2, m1, m2, s1, s2, lr):
    """Adam's shape: CPU step counters bumped, bias corrections from them, a tensor lr."""
    st = aten._foreach_add.Scalar([s1, s2], 1)
    m = aten._foreach_add.List(aten._foreach_mul.Scalar([m1, m2], 0.9), [g1, g2], alpha=0.1)
    bc = aten._foreach_sub.Scalar(aten._foreach_pow.ScalarAndTensor(0.9, [st[0], st[1]]), 1)
    r = aten._foreach_div.List([m[0], m[1]], [bc[0], bc[1]])
    q = aten._foreach_mul.Tensor([r[0], r[1]], lr)
    new = aten._foreach_add.List([p1, p2], [q[0], q[1]])
    return new[0], new[1], m[0], m[1], st[0], st[1]


SHAPES = [(4, 5), (7,), (4, 5), (7,), (4, 5), (7,)]
HOST = [torch.tensor(2.0), torch.tensor(3.0), torch.tensor(0.1)]


def stand_in_inputs():
    return [torch.empty(*s, device="meta") for s in SHAPES] + [h.clone() for h in HOST]


def real_inputs(seed, steps=(2.0, 3.0), lr=0.1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in SHAPES] + \
        [torch.tensor(steps[0]), torch.tensor(steps[1]), torch.tensor(lr)]


def runtime(fn=adam_like, inputs=None, kernels=None):
    """(graph module, Runtime on the stand-in device): ``kernels`` None gives kernels
    that do nothing (what the split needs), else the loaded Triton kernels."""
    from kiln.kernels import compile as kc
    from kiln.kernels.runtime.runner import Runtime
    gm = fx.symbolic_trace(fn)
    p = kc.plan(gm, inputs if inputs is not None else stand_in_inputs(), "triton")
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
        assert host.views["buf3"].tolist() == [steps[0] + 1, steps[1] + 1]


if __name__ == "__main__":
    interpreted()
    print("ok")
    sys.exit(0)
