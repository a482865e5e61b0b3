"""Column reductions on the Triton path, on the CPU: runs ``column_reduction_cases.py`` in a
child pytest with TRITON_INTERPRET=1 and KILN_KERNEL_TARGET=triton (set before triton is
first imported)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _run(tmp_path, select=None):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_KERNEL_TARGET="triton",
               KILN_TEST_CACHE_DIR=str(tmp_path), KILN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "column_reduction_cases.py"), "--rootdir", ROOT]
    if select:
        cmd += ["-k", select]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


@pytest.mark.slow   # (the quick subset's time: run in full CI)
def test_column_reductions_quick(tmp_path):
    """The [4096, 768] form, fused sums, size classes, precision, arg kinds, LayerNorm's
    backward; the shape/dtype/op grid is the slow test."""
    _run(tmp_path, "4096x768 or fused_and_split or soundly or precision or not_split "
                   "or layer_norm or row_statistics or loops_apart")


@pytest.mark.slow
def test_column_reductions_all(tmp_path):
    _run(tmp_path)
