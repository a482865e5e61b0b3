"""A test helper: the plans the kernel compiler makes while a test runs."""
from kiln.kernels import compile as kcompile


def record_plans(monkeypatch) -> list:
    """Every ``compile.plan`` result from now on, while ``monkeypatch`` holds."""
    plans = []
    real = kcompile.plan

    def spy(*a, **kw):
        p = real(*a, **kw)
        plans.append(p)
        return p
    monkeypatch.setattr(kcompile, "plan", spy)
    return plans
