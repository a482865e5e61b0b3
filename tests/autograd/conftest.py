import pytest

from kiln.autograd import runtime


@pytest.fixture
def traces(monkeypatch):
    """The number of autograd traces (``trace_joint`` calls) so far."""
    n = [0]
    orig = runtime.trace_joint

    def counting(*a, **k):
        n[0] += 1
        return orig(*a, **k)
    monkeypatch.setattr(runtime, "trace_joint", counting)
    return n
