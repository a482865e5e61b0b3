"""``tests/models/zoo_autocast.py`` on the CPU (bf16 autocast) on two small zoo models:
the kiln backend passes its rule against float64, and the rule fails a backend whose
graphs compute something else, one that drops autocast's dtypes, one that crashes and
one that runs past the per-model limit — each a FAIL row, the run going on."""
from __future__ import annotations

import json
import time

import pytest
import torch

from kiln.backends import lookup_backend
from tests.models import zoo, zoo_autocast

#: a transformer; convs with biases (casts needed); a bf16 output kiln's C++ kernels
#: cannot store, laid out channels-last by kiln (a library copy into eager's strides)
MODELS = ["hf.gpt2", "tv.alexnet", "timm.coatnet_nano_rw_224"]


def _args(*extra):
    return zoo_autocast.parse(["--device", "cpu", "--autocast", "bf16", "--budget-s", "0", *extra])


def _mapped(fn):
    """aot_eager with ``fn`` applied to each floating output of the graph."""
    inner = lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        compiled = inner(gm, example_inputs)

        def call(*args):
            out = compiled(*args)
            return type(out)(fn(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                             for t in out)
        return call
    return backend


def _raising(gm, example_inputs):
    raise RuntimeError("a broken backend")


def _slow(gm, example_inputs):
    time.sleep(30)


def _specs(names):
    for family in {"tv": "torchvision", "timm": "timm", "hf": "transformers"}.values():
        pytest.importorskip(family)
    torch.set_num_threads(2)
    return [zoo.by_name(n) for n in names]


@pytest.mark.parametrize("names,inner", [pytest.param(MODELS[:1], False, marks=pytest.mark.slow),
                                         (MODELS[:1], True),
                                         pytest.param(MODELS, False, marks=pytest.mark.slow)])
def test_kiln_backend_within_the_rule_and_rows_printed(names, inner):
    """Around the compiled model, and (``inner``) entered inside the compiled function."""
    lines = []
    rows = zoo_autocast.run(_specs(names), _args(*(["--inner"] if inner else [])),
                            log=lambda s, **k: lines.append(s))
    for r in rows:
        assert r["ok"], r
        assert (r["graphs"], r["breaks"], r["eager_graphs"]) == (1, 0, 0), r
        assert 0 < r["grads_eager"] < 0.5 and r["score"] <= 1.0
    assert [ln.split()[:2] for ln in lines] == [[n, "ok"] for n in names]


@pytest.mark.parametrize("backend,expect", [
    (_mapped(lambda t: t * 1.05), "score"),            # 5% off: outside the rule
    (_mapped(lambda t: t.float()), "mismatch"),        # float32 where eager gives bf16
    (_mapped(lambda t: t.transpose(0, 1).contiguous().transpose(0, 1)), "strides"),
    (_raising, "error"),
    (_slow, "error"),
])
def test_a_wrong_backend_is_a_fail_row(backend, expect):
    a = _args("--timeout-s", "1" if backend is _slow else "120")
    a.backend = backend
    [row] = zoo_autocast.run(_specs(["hf.gpt2"]), a, log=lambda *x, **k: None)
    assert row["ok"] is False, row
    if expect == "score":
        assert row["score"] > 1.0 and not row["mismatch"]
    elif expect == "mismatch":
        assert "float32" in row["mismatch"]
    elif expect == "strides":
        assert "strides" in row["mismatch"]
    else:
        assert row["error"]
    if backend is _slow:
        assert "limit" in row["error"] and row["seconds"] < 20


def test_the_budget_skips_the_rest():
    a = _args()
    a.budget_s = 1e-9
    rows = zoo_autocast.run(_specs(MODELS), a, log=lambda *x, **k: None)
    assert all("skipped" in r for r in rows[1:]) and "budget" in rows[-1]["skipped"]


def test_start_and_resume_hints(tmp_path):
    out = tmp_path / "rows.json"
    assert zoo_autocast.main(["--only", "hf.", "--start", "hf.clip_text", "--budget-s", "1e-9",
                              "--out", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["hf.clip_text", "hf.mobilebert"]
    assert all("--start hf.clip_text" in r["skipped"] for r in rows)
    assert zoo_autocast.main(["--only", "hf.gpt2", "--start", "tv.alexnet"]) == 2


def test_a_lost_cuda_context_skips_the_rest(monkeypatch):
    """After an illegal memory access every CUDA call fails: the rest are skipped, with
    where to go on from, instead of 60 rows of the same error."""
    def crash(spec, *a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(zoo_autocast, "check", crash)
    a = _args("--budget-s", "0")
    a.device = "cuda"
    rows = zoo_autocast.run([zoo.by_name(n) for n in ("tv.alexnet", "tv.vgg11_bn", "tv.resnet18")], a,
                            log=lambda *x, **k: None)
    assert rows[0]["ok"] is False and "illegal" in rows[0]["error"]
    assert [r.get("skipped", "")[:30] for r in rows[1:]] == ["the CUDA context was lost at t"] * 2
    assert all("--start tv.vgg11_bn" in r["skipped"] for r in rows[1:])


def test_the_check_runs_kiln_strict(monkeypatch):
    """Internal errors raise and the perf fallback is off while a model is checked (the
    step must run kiln's kernels, not a timing trial's aten graph), restored after."""
    import kiln
    monkeypatch.setattr(kiln.config, "perf_fallback", True)
    monkeypatch.setattr(kiln.config, "suppress_errors", True)
    seen = []
    inner = lookup_backend("aot_eager")

    def spy(gm, example_inputs):
        seen.append((kiln.config.perf_fallback, kiln.config.suppress_errors))
        return inner(gm, example_inputs)
    a = _args()
    a.backend = spy
    [row] = zoo_autocast.run(_specs(["hf.gpt2"]), a, log=lambda *x, **k: None)
    assert row["ok"] and seen and set(seen) == {(False, False)}
    assert kiln.config.perf_fallback and kiln.config.suppress_errors


def _rule(eager, comp, ref):
    return zoo_autocast.compare(eager, comp, ref, factor=2.0, floor=2.0 ** -8, tensor_factor=8.0)


def test_a_gradient_zero_up_to_float64_rounding_is_measured_against_its_group():
    """A bias before a batch norm over two values: float64 computes its zero gradient as
    ~1e-17; bf16 rounding noise there passes, a real value there fails."""
    big = torch.full((100,), 3.0, dtype=torch.float64)
    ref = {"grad w": big, "grad b": torch.full((4,), 1e-17, dtype=torch.float64)}
    eager = {"grad w": big * (1 + 2 ** -9), "grad b": torch.zeros(4)}
    noise = _rule(eager, {"grad w": big * (1 + 2 ** -9), "grad b": torch.full((4,), 1e-6)}, ref)
    assert noise["score"] <= 1, noise
    wrong = _rule(eager, {"grad w": big * (1 + 2 ** -9), "grad b": torch.full((4,), 0.5)}, ref)
    assert wrong["score"] > 1 and wrong["worst"] == "grad b", wrong


def test_where_eager_is_noise_the_floor_is_the_groups():
    """A squeeze-excitation weight behind a batch norm over two values: eager's value has
    no correct digit, a compiled one rounding elsewhere differs from it by far more than
    tensor_factor allows while both are far below the group's bf16 resolution; a value
    off at the group's scale still fails."""
    big = torch.full((100,), 300.0, dtype=torch.float64)
    ref = {"grad w": big, "grad se": torch.full((4,), 0.01, dtype=torch.float64)}
    eager = {"grad w": big * (1 + 2 ** -9), "grad se": torch.full((4,), 0.03)}
    cancel = {"grad w": big * (1 + 2 ** -9), "grad se": torch.full((4,), 5.0)}
    assert _rule(eager, cancel, ref)["score"] <= 1
    wrong = {"grad w": big * (1 + 2 ** -9), "grad se": torch.full((4,), 200.0)}
    r = _rule(eager, wrong, ref)
    assert r["score"] > 1 and r["worst"] == "grad se", r
