"""The harness end to end, in-process, on tiny workloads (< 60 s on 2 cores).

Checks the JSON carries every figure, that a backend that raises is recorded as that
cell's error (kiln's columns do this while kiln is unfinished), and that a backend
returning wrong numbers is caught by the accuracy check.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import harness, report
from benchmarks.backends import Eager, make_backend
from benchmarks.workloads import Instance, Workload, select


class Raises(Eager):
    """A backend whose compile step always fails."""

    family = "test"

    def __init__(self):
        super().__init__("raises")

    def compile(self, fn):
        raise RuntimeError("deliberately broken backend")


class OffByOne(Eager):
    """A backend that compiles 'fine' but returns wrong answers."""

    family = "test"

    def __init__(self):
        super().__init__("off-by-one")

    def compile(self, fn):
        return lambda *a: fn(*a) + 1


def _tiny_train() -> Workload:
    def build(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        g = torch.Generator().manual_seed(1)
        sets = [(torch.randn(5, 8, generator=g), torch.randint(0, 4, (5,), generator=g)) for _ in range(2)]

        def forward_and_loss(x, y):
            return torch.nn.functional.cross_entropy(model(x), y)

        return Instance(fn=forward_and_loss, inputs=sets, model=model)

    return Workload("tiny_mlp", "micro", "train", torch.float32, build, tol=1e-5)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    workloads = select("cpu", "micro", quick=True, only=["sin_cos"]) + [_tiny_train()]
    assert [w.key for w in workloads] == ["sin_cos/infer/fp32", "tiny_mlp/train/fp32"]
    opts = harness.Options(device="cpu", quick=True, log=lambda s: None,
                           backends=["eager", "torch.compile:eager", "kiln-eager", Raises(), OffByOne()])
    res = harness.run(workloads, opts)
    out = tmp_path_factory.mktemp("bench")
    paths = report.write_all(res, str(out))
    res["_paths"] = paths
    return res


def _cell(res, workload, backend):
    (c,) = [c for c in res["cells"] if c["workload"].startswith(workload) and c["backend"] == backend]
    return c


def test_every_cell_present(result):
    got = {(c["workload"], c["backend"]) for c in result["cells"]}
    assert len(got) == 2 * 5


def test_figures_of_a_working_backend(result):
    for w in ("sin_cos", "tiny_mlp"):
        c = _cell(result, w, "torch.compile:eager")
        assert "error" not in c, c.get("traceback")
        assert c["runs"] >= 30
        assert c["median_ms"] > 0 and c["speedup"] > 0 and c["cold_compile_s"] > 0
        assert c["match"] is True and c["max_err"] <= c["tol"]
        assert c["graph_count"] >= 1 and c["graph_break_count"] >= 0
        assert "peak_mem_MB" in c  # None on a CPU, bytes on a GPU
    train = _cell(result, "tiny_mlp", "torch.compile:eager")
    assert "grad_err" in train and "loss_err" in train
    sc = _cell(result, "sin_cos", "torch.compile:eager")
    assert sc["GBps"] > 0 and 0 < sc["frac_copy_bw"]
    # the warm-cache subprocess rebuilt the registered workload and timed its first call
    assert sc["warm_compile_s"] > 0, sc.get("warm_error")
    assert "warm_error" in train  # not in the registry: recorded, not raised


def test_eager_matches_itself(result):
    for w in ("sin_cos", "tiny_mlp"):
        c = _cell(result, w, "eager")
        assert c["max_err"] == 0.0 and c["speedup"] == pytest.approx(1.0)


def test_failing_backend_is_recorded(result):
    for w in ("sin_cos", "tiny_mlp"):
        c = _cell(result, w, "raises")
        assert c["error"] == "RuntimeError: deliberately broken backend"
        assert c["error_phase"] == "compile"
        assert "median_ms" not in c and "speedup" not in c


def test_kiln_cell_is_a_result_or_an_error(result):
    for w in ("sin_cos", "tiny_mlp"):
        c = _cell(result, w, "kiln-eager")
        assert ("error" in c) != ("median_ms" in c)
        if "median_ms" in c:
            assert c["match"], c


def test_wrong_answers_are_flagged(result):
    c = _cell(result, "sin_cos", "off-by-one")
    assert c["match"] is False and c["max_err"] > c["tol"]
    t = _cell(result, "tiny_mlp", "off-by-one")  # loss shifted by one: gradients equal, loss not
    assert t["match"] is False and t["loss_err"] > 0 and t["grad_err"] == 0.0


def test_outputs_written(result):
    paths = result["_paths"]
    with open(paths["json"]) as f:
        data = json.load(f)
    assert {"meta", "ceilings", "cells", "skipped"} <= set(data)
    assert data["ceilings"]["copy_GBps"] > 0 and data["ceilings"]["matmul_TFLOPs"]["fp32"] > 0
    table = open(paths["table"]).read()
    assert "deliberately broken backend" in table and "torch.compile:eager" in table
    if "chart" in paths:
        assert open(paths["chart"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_backend_names():
    assert make_backend("torch.compile").inner == "inductor"
    assert make_backend("kiln").inner is None and make_backend("kiln-aot_eager").inner == "aot_eager"
    assert make_backend("kiln:foo").inner == "foo"
    with pytest.raises(ValueError):
        make_backend("nonsense")


def test_scaled_error():
    from benchmarks.measure import scaled_error

    a = torch.tensor([1.0, 2.0, 4.0])
    assert scaled_error(a, a) == 0.0
    assert scaled_error(a + torch.tensor([0, 0, 0.004]), a) == pytest.approx(1e-3, rel=1e-3)
    assert scaled_error(a.double(), a) == math.inf
    assert scaled_error(torch.tensor([float("nan")]), torch.tensor([1.0])) == math.inf
    assert scaled_error(torch.tensor([1e-6]), torch.tensor([0.0]), floor=1e-3) == pytest.approx(1e-3)


def test_grad_errors_floor():
    from benchmarks.measure import grad_errors

    ref = {"w": torch.tensor([10.0, -10.0]), "kbias": torch.tensor([1e-7, -1e-7])}
    got = {"w": torch.tensor([10.0, -10.0]), "kbias": torch.tensor([-1e-7, 1e-7])}  # noise only
    err, where = grad_errors(got, ref)
    assert err < 1e-5
    got["w"] = torch.tensor([10.1, -10.0])
    err, where = grad_errors(got, ref)
    assert where == "w" and err == pytest.approx(1e-2, rel=1e-3)


class Slower(Eager):
    """Eager with a fixed extra cost per call: the interleaved figures must keep the order."""

    family = "slow"

    def __init__(self):
        super().__init__("slower")

    def compile(self, fn):
        import time

        def slow(*a):
            time.sleep(0.05)
            return fn(*a)
        return slow


@pytest.mark.slow
def test_interleaved_rounds_time_every_live_cell_again():
    workloads = select("cpu", "micro", quick=True, only=["sin_cos"])
    opts = harness.Options(device="cpu", quick=True, log=lambda s: None, warm_compile=False,
                           interleave_rounds=3, backends=["eager", Slower(), Raises()])
    res = harness.run(workloads, opts)
    eager, slow, broken = (_cell(res, "sin_cos", b) for b in ("eager", "slower", "raises"))
    for c in (eager, slow):
        assert c["timing"] == "interleaved, 3 rounds" and len(c["round_medians_ms"]) == 3
        assert c["sequential_median_ms"] > 0 and c["runs"] >= 30
    assert "timing" not in broken and "error" in broken
    assert slow["median_ms"] > eager["median_ms"] + 25      # 50 ms added; margin for a loaded machine
    assert slow["speedup"] == pytest.approx(eager["median_ms"] / slow["median_ms"])
