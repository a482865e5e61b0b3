"""Training steps whose optimizer runs its foreach path, compiled with the ``kiln``
backend, against eager: shared by ``test_foreach_optimizers.py`` (C++ in process, CUDA
when present) and run as a script by it under ``TRITON_INTERPRET=1
KILN_KERNEL_TARGET=triton`` (``python foreach_train_case.py NAME...``: prints "ok").

Each check runs three steps of the same model and data through the compiled step and
through eager, then compares parameters, gradients and optimizer state, and checks
the kernel compiler lowered every ``_foreach_*`` op of the optimizer graphs (none left
to run as aten) into at most one kernel per parameter.
"""
from __future__ import annotations

import copy
import re
import sys

import torch

import kiln
import kiln.kernels.backend as kernel_backend

OPTIMIZERS = {
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "sgd_nesterov_wd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True,
                                              weight_decay=0.01)),
    "sgd_dampening_maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1,
                                                     maximize=True)),
    "sgd_tensor_lr": (torch.optim.SGD, dict(lr="tensor:0.1", momentum=0.9)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_amsgrad_wd": (torch.optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adamw_amsgrad_maximize": (torch.optim.AdamW, dict(lr=0.01, amsgrad=True, maximize=True)),
    # a tensor lr with Adam's foreach path needs capturable=True: CUDA only
    "adamw_tensor_lr_capturable": (torch.optim.AdamW, dict(lr="tensor:0.01", capturable=True,
                                                           weight_decay=0.1)),
}
CUDA_ONLY = {"adamw_tensor_lr_capturable"}


class Net(torch.nn.Module):
    """Parameters of several shapes, some alike (biases and LayerNorm's: the same
    size), and one the loss never reaches (no gradient, no state)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Parameter(torch.randn(5))

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def train_step(model, opt, x, y):
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _options(kw, device):
    out = dict(kw, foreach=True)
    if isinstance(kw.get("lr"), str):
        out["lr"] = torch.tensor(float(kw["lr"].split(":")[1]), device=device)
    return out


class Recorder:
    """Keeps every aten graph the kernel compiler is handed, with its compiled graph."""

    def __init__(self):
        self.compiled = []

    def __call__(self, gm, example_inputs, *a, **kw):
        c = self.inner(gm, example_inputs, *a, **kw)
        self.compiled.append((gm, c))
        return c

    def optimizer_graphs(self):
        return [(gm, c) for gm, c in self.compiled
                if any("_foreach_" in str(n.target) for n in gm.graph.nodes)]


def check(name, device="cpu", steps=3):
    cls, kw = OPTIMIZERS[name]
    torch.manual_seed(0)
    m1 = Net().to(device)
    m2 = copy.deepcopy(m1)
    o1, o2 = cls(m1.parameters(), **_options(kw, device)), cls(m2.parameters(), **_options(kw, device))
    rec = Recorder()
    rec.inner, kernel_backend.compile_aten_graph = kernel_backend.compile_aten_graph, rec
    try:
        compiled = kiln.compile(train_step, backend="kiln")
        torch.manual_seed(1)
        for _ in range(steps):
            x, y = torch.randn(6, 4, device=device), torch.randn(6, 3, device=device)
            torch.testing.assert_close(compiled(m1, o1, x, y), train_step(m2, o2, x, y),
                                       rtol=1e-5, atol=1e-6)
    finally:
        kernel_backend.compile_aten_graph = rec.inner
    assert_same_state(m1, o1, m2, o2)
    graphs = rec.optimizer_graphs()
    assert graphs, f"{name}: no optimizer graph with foreach ops reached the kernel compiler"
    n_params = sum(1 for p in m1.parameters() if p.grad is not None or p in o1.state)
    for gm, c in graphs:
        assert_lowered(name, gm, c.artefacts, n_params)
    return graphs


def assert_same_state(m1, o1, m2, o2):
    for (pname, p), q in zip(m1.named_parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=pname)
        assert (p.grad is None) == (q.grad is None), pname
        s1, s2 = o1.state.get(p, {}), o2.state.get(q, {})
        assert s1.keys() == s2.keys(), (pname, s1.keys(), s2.keys())
        for k in s1:
            a, b = s1[k], s2[k]
            assert (a.dtype, a.device, a.shape) == (b.dtype, b.device, b.shape), (pname, k)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{pname} {k}")


def assert_lowered(name, gm, artefacts, n_params):
    """No ``_foreach_`` op on the graph's device left to aten (on a GPU, the new step
    counters stay on the CPU, computed there as eager does), and the kernels doing the
    work (all but the 0-d step counters') number at most one per parameter."""
    assert artefacts["target"] in ("cpp", "triton"), (name, artefacts)
    on_cpu = {n.name for n in gm.graph.nodes if str(n.meta.get("device")) == "cpu"}
    graph_on_cpu = all(str(n.meta.get("device")) == "cpu" for n in gm.graph.nodes
                       if n.op == "placeholder" and "device" in n.meta)
    left = [line for line in artefacts["ir"].splitlines() if "extern aten._foreach_" in line
            and (graph_on_cpu or line.rsplit("# ", 1)[-1].strip() not in on_cpu)]
    assert not left, (name, left)
    kernels = re.findall(r"^kernel \d+: outer=\[(.*?)\] inner=\[(.*?)\]", artefacts["schedule"], re.M)
    sized = [k for k in kernels if k != ("", "")]
    # where the bias corrections are computed on the CPU from the CPU step counters
    # (eager's layout on a GPU), the parameter update after them cannot join the
    # moments' kernel before them: two kernels a parameter
    per_param = 2 if "host_scalars" in artefacts["schedule"] else 1
    assert len(sized) <= per_param * n_params, (name, n_params, artefacts["schedule"])


if __name__ == "__main__":
    for n in sys.argv[1:]:
        check(n)
    print("ok")
