"""Triton kernels reused across sizes, on the CPU: runs ``size_generic_triton_cases.py``
in a child pytest with TRITON_INTERPRET=1 (set before triton is first imported)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _run(tmp_path, select=None):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "size_generic_triton_cases.py"), "--rootdir", ROOT]
    if select:
        cmd += ["-k", select]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


@pytest.mark.slow   # (the quick subset's time: run in full CI)
def test_size_generic_triton_quick(tmp_path):
    _run(tmp_path, "pointwise or multiple_of_16 or small_batches")


@pytest.mark.slow
def test_size_generic_triton_all(tmp_path):
    _run(tmp_path)
