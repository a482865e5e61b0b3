"""Row-tiled pointwise kernels on the Triton path, on the CPU: runs ``row_tile_cases.py``
in a child pytest with TRITON_INTERPRET=1 and KILN_KERNEL_TARGET=triton (set before
triton is first imported)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.mark.slow   # (the quick subset's time: run in full CI)
def test_row_tiles(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_KERNEL_TARGET="triton",
               KILN_TEST_CACHE_DIR=str(tmp_path), KILN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "row_tile_cases.py"), "--rootdir", ROOT]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


def test_setting_is_in_the_graph_cache_key(monkeypatch):
    """A plan made with row tiles is not one made without: the setting keys the cache."""
    import torch
    import torch.fx as fx

    from kiln import config
    from kiln.kernels.toolchain import graph_cache

    monkeypatch.setattr(config, "graph_cache", True)
    gm = fx.symbolic_trace(lambda x: (torch.ops.aten.sin.default(x),))
    x = torch.randn(4, 2048)
    keys = set()
    for on in (True, False):
        monkeypatch.setattr(config, "triton_row_tiles", on)
        keys.add(graph_cache.key_of(gm, [x], "triton"))
    assert len(keys) == 2 and None not in keys
