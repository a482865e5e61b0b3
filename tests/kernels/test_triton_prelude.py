"""The Triton modules' interpreter shims (kiln/kernels/codegen/triton/prelude.py)."""
import types

import numpy as np
import pytest

from kiln.kernels.codegen.triton.prelude import INTERPRETER_SHIMS, LIBDEVICE_UNARY


def test_loop_bounds_take_the_interpreters_one_element_scalars():
    """Under Triton's interpreter a size argument loaded from ``kiln_ks`` is a tensor
    holding a 1-element array, which Triton 3.6 cannot turn into an index (``int()``
    of a 1-d array, refused by NumPy 2): the module's ``range`` takes its one value,
    so ``for roffset in range(0, ks1, RBLOCK)`` runs as with a literal bound."""
    pytest.importorskip("triton")
    import triton.language as tl
    ns = {"tl": tl}                                   # (the rest of PRELUDE's names)
    ns.update({f"kiln_{n}_emulated": None for n in ("fmodf",) + LIBDEVICE_UNARY})
    exec(compile(INTERPRETER_SHIMS, "<kiln module>", "exec"), ns)
    ks1 = tl.tensor(types.SimpleNamespace(data=np.array([37], dtype=np.int64)), tl.int64)
    with pytest.raises(TypeError):
        int(ks1.handle.data)          # what Triton 3.6's interpreter does for an index
    assert list(ns["range"](0, ks1, 8)) == list(range(0, 37, 8))
    assert list(ns["range"](3)) == [0, 1, 2]
    assert list(ns["range"](tl.constexpr(2), 9, 3)) == [2, 5, 8]
