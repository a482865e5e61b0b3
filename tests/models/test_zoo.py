"""The model zoo of issue 6 (``zoo.py``): every model compiled with ``fullgraph=True`` on
the eager and aot_eager backends matches eager — eval outputs on two calls (one graph,
reused) and a training step's loss, parameter gradients and buffers (a second graph, for
train mode).  Entries marked ``xfail`` in the registry fail today for the reason given.

Slow (about a quarter of an hour on two cores): ``pytest -m slow tests/models/test_zoo.py``.
"""
import pytest
import torch

from tests.models import zoo


def _params():
    out = []
    for spec in zoo.REGISTRY:
        for backend in ("eager", "aot_eager"):
            marks = [pytest.mark.slow]
            if spec.xfail:
                marks.append(pytest.mark.xfail(reason=spec.xfail, strict=False))
            out.append(pytest.param(spec, backend, marks=marks, id=f"{spec.name}-{backend}"))
    return out


@pytest.mark.parametrize("spec,backend", _params())
def test_zoo_model(spec, backend):
    if spec.family in ("timm", "transformers"):
        pytest.importorskip(spec.family)
    else:
        pytest.importorskip("torchvision")
    torch.set_num_threads(2)
    zoo.check_model(spec, backend, fullgraph=True)
