"""Attributes read through descriptors written in C that kiln has no rule for
(pybind11's ``instancemethod`` on torch's C++ classes, as DDP's logger has): the value
traced is the one the read gives (a bound method), and its guards hold on the inputs it
was traced with."""
import torch

import kiln
from kiln import config


def _ctx():
    return torch._C.DeserializationStorageContext()


def _returns_bound(x, c):
    return x + 1, c.has_storage


def _calls(x, c):
    if c.has_storage("a"):
        return x - 1
    return x + 1


def test_bound_c_method_is_traced_as_its_read(monkeypatch):
    monkeypatch.setattr(config, "suppress_errors", False)
    kiln.reset()
    f = kiln.compile(_returns_bound, fullgraph=True)
    c, x = _ctx(), torch.randn(3)
    for _ in range(3):
        out, m = f(x, c)
        ref, m_ref = _returns_bound(x, c)
        torch.testing.assert_close(out, ref)
        assert type(m) is type(m_ref) and m("a") == m_ref("a")
    ex = kiln.explain(_returns_bound)(x, c)
    assert ex.graph_count == 1 and ex.graph_break_count == 0


def test_calling_a_c_method_runs_as_eager(monkeypatch):
    monkeypatch.setattr(config, "suppress_errors", False)
    kiln.reset()
    f = kiln.compile(_calls)
    c, x = _ctx(), torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(f(x, c), _calls(x, c))
