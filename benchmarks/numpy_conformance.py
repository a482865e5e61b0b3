"""How many of the NumPy test programs each compiler runs as NumPy does.

Every program of ``tests/capture/test_numpy.py`` (``PROGRAMS``) runs under kiln and under
torch.compile, both with ``fullgraph=True`` and the ``eager`` backend, and its result is
compared with NumPy's own: the type (ndarray or NumPy scalar), dtype, shape and values.

    python -m benchmarks.numpy_conformance

Prints the counts and the first line of each mismatch; writes
``benchmarks/results/cpu/numpy_conformance.md``.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch


def _copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def main():
    warnings.filterwarnings("ignore")
    import kiln
    from tests.capture.test_numpy import PROGRAMS, same

    def kiln_run(fn):
        kiln.reset()
        return kiln.compile(fn, backend="eager", fullgraph=True)

    def torch_run(fn):
        torch._dynamo.reset()
        return torch.compile(fn, backend="eager", fullgraph=True)

    lines = ["# NumPy programs run as NumPy runs them (tests/capture/test_numpy.py)", ""]
    for name, make in (("kiln", kiln_run), ("torch.compile", torch_run)):
        bad = []
        for fn, args in PROGRAMS:
            try:
                same(make(fn)(*_copy(args)), fn(*_copy(args)))
            except Exception as e:  # noqa: BLE001 -- a mismatch or a refusal is a row
                bad.append(f"- `{fn.__name__}`: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}")
        lines.append(f"## {name}: {len(PROGRAMS) - len(bad)} / {len(PROGRAMS)}")
        lines += bad + [""]
    lines.append(f"`python -m benchmarks.numpy_conformance` (torch {torch.__version__}, NumPy {np.__version__})")
    text = "\n".join(lines)
    print(text)
    out = os.path.join(os.path.dirname(__file__), "results", "cpu", "numpy_conformance.md")
    with open(out, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
