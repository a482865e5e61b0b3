"""Run by ``test_specialize.py`` in a child process with TRITON_INTERPRET=1 (set before
triton is first imported): a dynamic stream through the Triton code generator loads one
module for every batch size of the dynamic graph (the batch lifted however small), and
each call matches eager. Prints ``OK <modules loaded>``."""
import os
import sys

import torch
import torch.nn.functional as F

import kiln
from kiln.kernels.codegen.triton import launcher


def main() -> int:
    torch.manual_seed(0)
    w = torch.randn(8, 4, 3, 3)

    def f(x):
        y = F.relu(F.conv2d(x, w, padding=1))
        return y * 2, y.mean((2, 3))
    c = kiln.compile(f, backend="kiln")
    loaded = []
    with kiln.config.patch(suppress_errors=False, perf_fallback=False, kernel_target="triton"), \
            torch.no_grad():
        for b in (3, 5, 9, 17, 7):       # none a multiple of 16 times 3*24*24 / 16
            before = launcher.stats["loaded"]
            x = torch.randn(b, 4, 6, 6)
            got, ref = c(x), f(x)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            for g, r in zip(got, ref):
                assert g.dtype == r.dtype and g.stride() == r.stride()
            loaded.append(launcher.stats["loaded"] - before)
    assert sum(len(e.graphs) for e in c.entries) == 2
    print("OK", loaded)
    return 0


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.exit(main())
