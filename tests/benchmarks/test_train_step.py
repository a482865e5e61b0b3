"""``python -m benchmarks.train_step`` in-process at tiny sizes: the resnet18 model, the
GradScaler path for fp16 (every backend through the scaler, scales compared), the float64
reference, and that a backend computing something else is caught by the error columns."""
from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import train_step
from benchmarks.backends import Eager, make_backend


def _run(tmp_path, *args):
    out = tmp_path / "rows.json"
    assert train_step.main([*args, "--runs", "1", "--warmup", "0", "--json", str(out)]) == 0
    return {r["backend"]: r for r in json.loads(out.read_text())["rows"]}


class _PerturbedInput(Eager):
    """Runs the step on slightly different inputs: a wrong answer the columns must show."""

    def __init__(self):
        super().__init__("perturbed")

    def compile(self, fn):
        return lambda x, y: fn(x * 1.5, y)


def test_fp16_runs_every_backend_through_the_grad_scaler(tmp_path):
    rows = _run(tmp_path, "--model", "mlp", "--autocast", "fp16", "--optimizer", "sgd",
                "--backends", "eager,kiln-aot_eager")
    eager, aot = rows["eager"], rows["kiln-aot_eager"]
    assert "error" not in aot, aot
    # the scaler is used (a 65536 start halves on overflow, else holds) and agrees
    assert len(eager["scales"]) == 3 and eager["scales"][0] in (65536.0, 32768.0)
    assert aot["scales"] == eager["scales"]
    assert aot["loss_err"] <= 1e-6 and aot["update_err"] <= 1e-5
    assert aot["err64"] <= 1.1 * eager["err64"] + 1e-6
    assert eager["speedup"] == 1.0


def test_a_wrong_backend_shows_in_loss_and_update_errors(tmp_path, monkeypatch):
    real = make_backend
    monkeypatch.setattr(train_step, "make_backend",
                        lambda n: _PerturbedInput() if n == "perturbed" else real(n))
    rows = _run(tmp_path, "--model", "mlp", "--optimizer", "sgd", "--backends", "eager,perturbed")
    bad = rows["perturbed"]
    assert bad["loss_err"] > 1e-3 and bad["update_err"] > 1e-3
    assert bad["err64"] > 10 * rows["eager"]["err64"]


def test_reference64_skips_the_steps_eager_skipped():
    a = train_step.parse(["--model", "mlp", "--autocast", "fp16"])
    model, _, _ = train_step.build(a)
    p0 = train_step._params(model)
    skipped_all, losses = train_step.reference64(a, [32768.0, 16384.0, 8192.0])
    assert all(torch.equal(p, q) for p, q in zip(p0, [t.float() for t in skipped_all]))
    assert len(losses) == 3
    stepped, _ = train_step.reference64(a, [65536.0, 65536.0, 65536.0])
    assert train_step.update_error(p0, [t.float() for t in p0], stepped) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("autocast", ["none", "bf16", "fp16"])
def test_resnet18_row(tmp_path, autocast):
    """The issue's resnet18 row at 2 images of 32 px. In float32 kiln's three steps are
    as close to float64 as eager's (err64 within 25% of eager's). Under autocast these
    sizes make the updates mostly rounding noise (batch norms over 2 values: eager's own
    err64 is about 1), so there the row must run, with kiln-aot_eager (eager's kernels
    on the captured graphs) giving eager's updates and every GradScaler scale equal."""
    pytest.importorskip("torchvision")
    torch.set_num_threads(2)
    backends = "eager,kiln" if autocast == "none" else "eager,kiln-aot_eager,kiln"
    rows = _run(tmp_path, "--model", "resnet18", "--batch", "2", "--image", "32",
                "--autocast", autocast, "--optimizer", "sgd", "--backends", backends)
    for name, r in rows.items():
        assert "error" not in r, r
        assert r["median_ms"] > 0 and r["speedup"] > 0
        assert all(math.isfinite(x) for x in r["losses"])
    if autocast == "none":
        assert rows["kiln"]["err64"] <= 1.25 * rows["eager"]["err64"] + 1e-4
        # eager's float32 losses are ~13% off float64's here, and two float32 runs as far
        # from each other: kiln's are held to float64's, as close as eager's
        assert rows["kiln"]["loss_err64"] <= 1.25 * rows["eager"]["loss_err64"] + 1e-3
    else:
        assert rows["kiln-aot_eager"]["update_err"] <= 1e-6
        assert rows["kiln-aot_eager"]["loss_err"] <= 1e-6
    if autocast == "fp16":
        assert rows["kiln"]["scales"] == rows["eager"]["scales"]
