"""The meta kernels of kiln's attention ops plan what the real kernels return: the
kernel compiler lays out and types its buffers from them (a float32 logsumexp planned
for a float64 CPU attention was converted to float32 and the backward refused it)."""
from __future__ import annotations

import pytest
import torch

from kiln.autograd import sdpa


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_meta_matches_the_cpu_kernel(dtype, masked):
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=dtype) for _ in range(3))
    mask = torch.randn(2, 1, 5, 5, dtype=dtype) if masked else None
    real = torch.ops.kiln.sdpa_fused(q, k, v, mask, False, 0.3, sdpa.FLASH, 0)
    meta = torch.ops.kiln.sdpa_fused(*(t.to("meta") for t in (q, k, v)),
                                     None if mask is None else mask.to("meta"),
                                     False, 0.3, sdpa.FLASH, 0)
    for r, m in zip(real, meta):
        assert (r.dtype, r.shape, r.stride()) == (m.dtype, m.shape, m.stride())
    out, lse = real
    grads = torch.ops.kiln.sdpa_fused_backward(torch.ones_like(out), q, k, v, mask, out,
                                               lse, False, 0.3, sdpa.FLASH)
    assert [g.dtype for g in grads] == [dtype] * 3


def test_graph_cache_key_covers_all_of_kilns_sources(tmp_path, monkeypatch):
    """A plan depends on kiln's meta kernels outside the kernel compiler too."""
    import shutil

    from kiln import disk_cache
    from kiln.kernels.toolchain import graph_cache
    root = tmp_path / "kiln"
    shutil.copytree(graph_cache.__file__.rsplit("/kernels/", 1)[0], root,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(disk_cache, "__file__", str(root / "disk_cache.py"))
    before = graph_cache._sources_hash.__wrapped__()
    with open(root / "autograd" / "sdpa.py", "a") as f:
        f.write("\n# edited\n")
    assert graph_cache._sources_hash.__wrapped__() != before
