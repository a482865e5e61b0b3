"""timm's ``crossvit_tiny_240`` (random weights) is one graph under ``fullgraph=True``:
its blocks call ``torch.jit.annotate(List[torch.Tensor], [])``, whose ``List[...]``
goes through typing's ``functools.lru_cache``-wrapped subscription. Eval on the eager
backend (bit for bit, two calls, one graph) and a training step (a second graph).

Slow (a 240-px ViT on two cores): ``pytest -m slow tests/models/test_crossvit.py``.
"""
import pytest
import torch

from tests.models import zoo


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_crossvit_tiny_240_one_graph(train):
    pytest.importorskip("timm")
    torch.set_num_threads(2)
    spec = zoo.ModelSpec("crossvit_tiny_240", "timm", zoo._timm("crossvit_tiny_240"),
                         zoo._images(240))
    result = zoo.check_model(spec, "eager", fullgraph=True, train=train)
    assert result.graphs == 1
