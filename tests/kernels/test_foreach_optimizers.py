"""Whole training steps with foreach optimizers through the kernel compiler: values
against eager after three steps, every ``_foreach_*`` op lowered, at most one kernel per
parameter (``foreach_train_case.py``), on the C++ path, the Triton path (interpreter,
in a child process) and CUDA when present."""
import os
import subprocess
import sys

import pytest
import torch

import kiln

from .foreach_train_case import CUDA_ONLY, OPTIMIZERS, Net, _options, check

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QUICK = {"adamw"}
CPU = [n for n in OPTIMIZERS if n not in CUDA_ONLY]


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CPU])
def test_train_step_cpp(name):
    check(name)


def _step_only(name, backends):
    """Three ``opt.step()`` calls, compiled with each backend, on the same gradients."""
    cls, kw = OPTIMIZERS[name]
    torch.manual_seed(0)
    models = [Net() for _ in backends]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [cls(m.parameters(), **_options(kw, "cpu")) for m in models]
    steps = [kiln.compile(lambda o: o.step(), backend=b) if b != "eager" else (lambda o: o.step())
             for b in backends]
    for _ in range(3):
        grads = [torch.randn_like(p) for p in models[0].parameters()]
        for m in models:
            for p, g in zip(m.parameters(), grads):
                p.grad = g.clone()
        for step, o in zip(steps, opts):
            step(o)
    return models, opts


@pytest.mark.parametrize("name", ["sgd_momentum", "sgd_nesterov_wd"])
def test_sgd_update_is_eagers_bit_for_bit(name):
    """The same ops as eager's foreach SGD, rounded as its CPU kernels round them."""
    (m1, m2), (o1, o2) = _step_only(name, ["kiln", "eager"])
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)
        for k in o2.state[q]:
            assert torch.equal(o1.state[p][k], o2.state[q][k]), k


@pytest.mark.parametrize("name", ["adam", "adamw_amsgrad_maximize"])
def test_adam_update_is_the_graphs_own_to_the_last_bits(name):
    """Adam's traced step (the capturable path: bias corrections as float32 tensor
    maths, where eager's uses Python floats) run by kiln's kernels and by PyTorch
    (aot_eager): the optimizer state agrees exactly, the parameters to 2 units in the
    last place (ATen's AVX-512 kernels fuse the update's multiply-add, kiln's C++ does
    not contract; on AVX2 they agree exactly); each stays within float32 rounding of
    eager."""
    (m1, m2, m3), (o1, o2, o3) = _step_only(name, ["kiln", "aot_eager", "eager"])
    for p, q, r in zip(m1.parameters(), m2.parameters(), m3.parameters()):
        ulp = torch.nextafter(q.abs(), torch.tensor(float("inf"))) - q.abs()
        assert bool(((p - q).abs() <= 2 * ulp).all()), (p - q).abs().max()
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
        for k in o2.state[q]:
            assert torch.equal(o1.state[p][k], o2.state[q][k]), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_train_step_cuda(name):
    check(name, device="cuda")


@pytest.mark.slow
def test_train_step_triton_interpreter(tmp_path):
    """The Triton kernels, run by Triton's interpreter on the CPU (tiny sizes)."""
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_KERNEL_TARGET="triton",
               KILN_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(HERE, "foreach_train_case.py"), *CPU],
                       env=env, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "ok", r.stdout[-2000:]


@pytest.mark.parametrize("name", ["adam", "adamw_amsgrad_maximize"])
def test_first_step_graph_on_a_gpu_stand_in_is_lowered(name):
    """The first step's graph as a GPU trace captures it (the counters made in the
    graph on the CPU, the loss its only 0-d input, on the device), lowered for a
    stand-in accelerator: only the counters' own add (CPU) stays with aten; the device
    ops reading the CPU bias corrections and step sizes (``_foreach_div.List``,
    ``_foreach_addcdiv.Tensor``) are lowered, as test_train_step_cuda requires."""
    from kiln.kernels import compile as kc
    from .host_prologue_cases import optimizer_graph
    gm, stand_in = optimizer_graph(name, which=0)
    assert not any(t.device.type == "cpu" for t in stand_in)
    p = kc.plan(gm, stand_in, "triton")
    assert p.artefacts["fallbacks"] == ["aten._foreach_add.Scalar"], p.artefacts["fallbacks"]
