"""KILN_REPLAY_RECORD: a failed capture writes a record; `python -m kiln.replay FILE`
re-runs the capture from it alone and fails the same way."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import kiln
from kiln import config
from kiln.capture import eval_frame
from kiln.capture.errors import InternalError
from kiln import replay as replay_run
from kiln.debug import replay

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent("""
    import torch, kiln
    SCALE = 3.0

    def helper(t):
        return t * SCALE

    def f(x, n, flag=True):
        y = helper(x) + n
        print("side effect")          # Unsupported under fullgraph
        return y.sin()

    kiln.compile(f, fullgraph=True, backend="eager")(torch.randn(2, 3).t(), 4)
""")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(PYTHONPATH=ROOT, **extra)
    return env


@pytest.mark.slow
def test_fullgraph_failure_recorded_and_replayed_alone(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True,
                       env=_env(KILN_REPLAY_RECORD="1"), timeout=300)
    assert r.returncode != 0 and "Unsupported" in r.stderr
    records = list((tmp_path / "kiln_replay").iterdir())
    assert len(records) == 1 and "replay record written" in r.stderr
    (tmp_path / "prog.py").unlink()            # the replay needs nothing of the program
    rr = subprocess.run([sys.executable, "-m", "kiln.replay", str(records[0])], cwd=ROOT,
                        capture_output=True, text=True, env=_env(), timeout=300)
    assert rr.returncode != 0
    assert "x: tensor (3, 2) float32 cpu stride (1, 3)" in rr.stdout
    assert "n: 4" in rr.stdout and "helper" in rr.stdout
    assert "REPRODUCED: Unsupported: [K0018] print() has a side effect" in rr.stderr
    assert "Traceback" in rr.stderr and "prog.py:10 in f" in rr.stderr


SCALE = 2.0


def _helper(t):
    return t * SCALE


def _g(x, n, lock=None, *, k=1.5):
    return (_helper(x) + n * k).cos()


def test_record_round_trip(tmp_path, monkeypatch):
    """The record holds the inputs (geometry, requires_grad), the globals and helper
    functions the frame names, defaults; what it cannot hold is listed."""
    monkeypatch.chdir(tmp_path)
    x = torch.randn(4, 6)[:, ::2].requires_grad_(False)
    w = torch.randn(3, requires_grad=True)
    path = replay.record(_g, (x, w), {"lock": threading.Lock()}, True, RuntimeError("boom"))
    fn, args, kwargs, rec = replay.load(path)
    assert args[0].stride() == x.stride() and torch.equal(args[0], x)
    assert args[1].requires_grad and torch.equal(args[1], w)
    assert kwargs["lock"] is None and rec["missing"] and "lock" in rec["missing"][0].lower()
    assert fn.__kwdefaults__ == {"k": 1.5}
    torch.testing.assert_close(fn(x, w), _g(x, w))          # helper and SCALE came along
    assert fn.__globals__["_helper"] is not _helper           # rebuilt from its code
    text = replay.summary(fn, args, kwargs, rec)
    assert "RuntimeError: boom" in text and "NOT recorded" in text and "_helper" in text


def _failing_trace(real):
    def trace_frame(fn, *a, **k):
        if fn.__name__ == "_g":
            raise KeyError("planted capture bug")
        return real(fn, *a, **k)
    return trace_frame


def test_internal_error_recorded_and_replayed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real = eval_frame.trace_frame
    monkeypatch.setattr(eval_frame, "trace_frame", _failing_trace(real))
    x = torch.randn(3)
    with config.patch(replay_record=True, suppress_errors=False):
        with pytest.raises(InternalError):
            kiln.compile(_g, backend="eager")(x, 2)
    (path,) = (tmp_path / "kiln_replay").iterdir()
    with pytest.raises(InternalError, match="planted capture bug"):
        replay_run.replay(str(path))
    monkeypatch.setattr(eval_frame, "trace_frame", real)       # the bug fixed:
    assert replay_run.replay(str(path)) == 0                        # the capture succeeds


def test_nothing_recorded_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def h(x):
        print("x")
        return x

    with pytest.raises(kiln.Unsupported):
        kiln.compile(h, fullgraph=True, backend="eager")(torch.randn(2))
    assert not (tmp_path / "kiln_replay").exists()


def test_unloadable_pickle_is_listed_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = replay.record(_g, (torch.randn(2), 1), {"lock": _Picklable()}, False, RuntimeError("x"))
    monkeypatch.setattr(sys.modules[__name__], "_Picklable", None)   # its class is gone
    fn, args, kwargs, rec = replay.load(path)
    assert kwargs["lock"] is None and "pickled value" in rec["missing"][0]


class _Picklable:
    pass
