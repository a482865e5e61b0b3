"""The Triton path on CPU: runs ``triton_cases.py`` in a child pytest with
TRITON_INTERPRET=1, which must be set before triton is first imported."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QUICK = ["unary_contig", "binary_noncontig", "int_ops", "casts", "views_noncontig",
         "softmax_noncontig", "fusion", "layer_norm", "full_arange", "fallback"]


def _run(select, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "triton_cases.py"), "--rootdir", ROOT]
    if select:
        cmd += ["-k", " or ".join(f"[{c}]" for c in select)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
    return r.stdout


def test_triton_interpreter_quick(tmp_path):
    out = _run(QUICK, tmp_path)
    assert f"{len(QUICK)} passed" in out


@pytest.mark.slow
def test_triton_interpreter_all_cases(tmp_path):
    _run(None, tmp_path)
