"""Tensor guards checked by kiln's C++ library (``capture/native_guards.py``): the same
verdicts as the Python guards they stand for, one call per entry, explained in the same
words when they fail, and Python's guards wherever the library is not there."""
import functools
import logging
import shutil

import pytest
import torch

import kiln
from kiln import config, disk_cache
from kiln.capture import native_guards


@pytest.fixture(scope="module")
def library():
    why = native_guards.ensure_built()
    assert why is None, f"the native guards did not build here: {why}"
    return native_guards._state["module"]


def _python_verdict(spec, obj):
    try:
        return native_guards.python_check([spec], (obj,))
    except Exception:   # noqa: BLE001  (in an entry, a guard that raises is a miss)
        return False


class _Sub(torch.Tensor):
    pass


def _traced_tensors():
    base = torch.randn(4, 6)
    return {
        "contiguous": base,
        "transposed": base.t(),
        "0-d": torch.tensor(3.0),
        "empty": torch.empty(0, 5),
        "expanded": torch.randn(1, 6).expand(4, 6),
        "parameter": torch.nn.Parameter(torch.randn(4, 6)),
        "frozen parameter": torch.nn.Parameter(torch.randn(4, 6), requires_grad=False),
        "requires grad": torch.randn(4, 6, requires_grad=True),
        "int64": torch.arange(24).view(4, 6),
    }


def _candidates(t):
    yield "itself", t
    yield "a clone", t.clone()
    yield "another dtype", t.double() if t.dtype != torch.float64 else t.float()
    yield "another shape", t.reshape(-1)
    yield "a column", t[..., :1] if t.dim() else t.reshape(1)
    yield "another stride", t.t().contiguous().t() if t.dim() == 2 else t
    if t.dtype.is_floating_point:
        yield "requires_grad flipped", t.detach().requires_grad_(not t.requires_grad)
    yield "a parameter", torch.nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad) \
        if t.dtype.is_floating_point else t
    yield "a plain tensor", t.detach().clone()
    yield "a subclass", t.detach().clone().as_subclass(_Sub)
    yield "on meta", t.detach().to("meta")
    yield "sparse", t.detach().to_sparse() if t.dim() == 2 else t
    yield "a list", [1, 2]
    yield "None", None


def test_the_library_agrees_with_the_python_guards(library):
    checked = 0
    for name, t in _traced_tensors().items():
        for rg in (t.requires_grad, None):
            spec = native_guards.spec_of(t, rg)
            specs = library.make_specs([spec])
            for what, cand in _candidates(t):
                want = _python_verdict(spec, cand)
                got = library.check(specs, (cand,))
                assert got is want, (name, rg, what, got, want)
                checked += 1
    assert checked > 200
    # and several tensors at once: every one must match, in order
    a, b = torch.randn(3), torch.randn(2, 2)
    specs = library.make_specs([native_guards.spec_of(a, False), native_guards.spec_of(b, False)])
    assert library.check(specs, (a, b)) is True
    assert library.check(specs, (b, a)) is False
    assert library.check(specs, (a,)) is False


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5))


def test_an_entry_checks_its_tensors_in_one_native_call(library, caplog):
    net = _net().eval()
    compiled = kiln.compile(lambda x: net(x), backend="eager")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x))
        (entry,) = compiled.entries
        assert entry.source.count(f"{native_guards.CHECK_NAME}((") == 1, entry.source
        assert ".stride() ==" not in entry.source and ".dtype is" not in entry.source
        check = entry.namespace[native_guards.CHECK_NAME]
        assert isinstance(check, functools.partial) and check.func is library.check
        # every parameter, buffer and the input: 8 tensors, in the one call
        assert len(entry.namespace[native_guards.CHECK_NAME].args) == 1
        weight = net[4].weight
        with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
            net[4].weight.data = weight.data.t().contiguous().t()   # new strides, same values
            torch.testing.assert_close(compiled(x), net(x))
            net[4].weight.requires_grad_(False)
            torch.testing.assert_close(compiled(x), net(x))
            net.double()
            torch.testing.assert_close(compiled(x.double()), net(x.double()))
    assert len(compiled.entries) == 4
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.recompiles")
    # the Python guards still say what changed
    for words in ["stride()", "requires_grad", "dtype was torch.float32, now torch.float64"]:
        assert words in text, (words, text)


def test_training_gradients_with_native_guards(library):
    net = _net().train()
    ref = _net().train()
    compiled = kiln.compile(lambda x: net(x))
    for seed in range(3):
        x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        compiled(x).sum().backward()
        ref(x).sum().backward()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert all(native_guards.CHECK_NAME in e.source for e in compiled.entries)


def test_entries_made_while_it_builds_check_in_python_then_switch(library, monkeypatch):
    monkeypatch.setattr(native_guards, "_state", {"module": None, "status": "building", "why": None})

    def f(x, w):
        return torch.relu(x @ w)

    compiled = kiln.compile(f, backend="eager")
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(compiled(x, w), f(x, w))
    (entry,) = compiled.entries
    check = entry.namespace[native_guards.CHECK_NAME]
    assert check.func is native_guards.python_check
    torch.testing.assert_close(compiled(x.t().contiguous().t(), w), f(x, w))   # a miss, in Python
    assert len(compiled.entries) == 2
    native_guards._state.update(module=library, status="ready")
    native_guards._switch_waiting()
    for e in compiled.entries:
        assert e.namespace[native_guards.CHECK_NAME].func is library.check
    torch.testing.assert_close(compiled(x, w), f(x, w))
    torch.testing.assert_close(compiled(x.double(), w.double()), f(x.double(), w.double()))
    assert len(compiled.entries) == 3


def test_off_the_guards_stay_in_python(monkeypatch):
    monkeypatch.setattr(config, "native_guards", False)

    def f(x):
        return x * 2

    compiled = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    (entry,) = compiled.entries
    assert native_guards.CHECK_NAME not in entry.source
    assert ".stride() == (1,)" in entry.source
    torch.testing.assert_close(compiled(x.double()), f(x.double()))
    assert len(compiled.entries) == 2


def test_a_corrupt_library_file_is_rejected_never_loaded(library, monkeypatch, tmp_path):
    good = native_guards.library_path()
    monkeypatch.setattr(config, "native_dir", str(tmp_path))
    monkeypatch.setattr(native_guards, "_state", {"module": None, "status": "idle", "why": None})
    path = native_guards.library_path()
    assert path.startswith(str(tmp_path))
    with open(good, "rb") as f:
        data = f.read()
    before = disk_cache.stats["rejected"]
    for bad in (b"garbage", data[:len(data) // 2], data[:-3] + b"xyz"):
        with open(path, "wb") as f:
            f.write(bad)
        assert native_guards._load_built() is False
        assert native_guards._state["module"] is None
    assert disk_cache.stats["rejected"] == before + 3
    shutil.copyfile(good, path)          # the checked copy loads
    assert native_guards._load_built() is True
    assert native_guards._state["status"] == "ready"


def test_a_guard_reading_through_a_tensor_keeps_its_type_guard_first(library, monkeypatch):
    """``x.grad``'s guard reads an attribute of ``x``: ``x``'s type is still checked
    before it, as the Python chain had it, though the library checks it too (guard
    programs off, so that the chain is all text)."""
    from kiln.capture import guard_program
    monkeypatch.setattr(guard_program, "MIN_RUN", 10 ** 9)

    def f(x):
        return x * 2 if x.grad is None else x * 3

    compiled = kiln.compile(f, backend="eager")
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(compiled(x), f(x))
    (entry,) = compiled.entries
    src = entry.source
    assert native_guards.CHECK_NAME in src
    type_guard = next(g.code for g in entry.guards if g.code.startswith("type(x) is"))
    grad_guard = next(g.code for g in entry.guards if "x.grad" in g.code)
    assert src.index(type_guard) < src.index("x.grad"), src
    assert grad_guard
