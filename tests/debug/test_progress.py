"""The progress line: shown on a terminal during a long compile, silent otherwise."""
import io
import sys

import pytest
import torch

import kiln
from kiln import config
from kiln.debug import progress


class _Tty(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def _compile_once():
    def f(x):
        return torch.cos(x) + 1
    kiln.compile(f, backend="eager")(torch.randn(3))


@pytest.mark.parametrize("tty,setting,shown", [(True, "auto", True), (False, "auto", False),
                                               (True, "0", False), (False, "1", True)])
def test_progress_line(monkeypatch, tty, setting, shown):
    err = _Tty(tty)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with config.patch(progress=setting):
        _compile_once()
    text = err.getvalue()
    if shown:
        assert "[kiln] compiling f: graph 1, capture" in text
        assert text.endswith("\r\x1b[K")        # cleared when the compile ends
    else:
        assert text == ""


def test_short_compile_is_silent(monkeypatch):
    err = _Tty(True)
    monkeypatch.setattr(sys, "stderr", err)
    _compile_once()
    assert err.getvalue() == ""


PROGRAM = """
import torch, kiln
from kiln.debug import progress
progress.DELAY_S = 0.0
kiln.compile(lambda x: torch.cos(x) + 1, backend="eager")(torch.randn(3))
"""


@pytest.mark.slow
def test_real_terminal_and_pipe():
    import os
    import pty
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = root
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", PROGRAM], stderr=slave, stdout=subprocess.DEVNULL,
                         env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:             # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert p.wait(timeout=300) == 0
    os.close(master)
    assert b"[kiln] compiling <lambda>: graph 1" in b"".join(chunks)
    piped = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, env=env,
                           timeout=300)
    assert piped.returncode == 0 and b"[kiln]" not in piped.stderr
