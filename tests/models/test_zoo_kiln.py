"""A few zoo models through the full ``kiln`` backend (C++ kernels on the CPU): outputs,
loss, gradients and buffers match eager in float64, and in every aten graph the kernel
compiler receives at most 2% of the ops fall back to aten (library calls aside) — except
in the transformers, where what may fall back is scatters (``index_put``: the backward of
indexing) and indexing by several tensors at once; gathers (embedding, one-tensor index,
gather) are lowered. ``python -m benchmarks.zoo_kiln`` runs the whole zoo."""
import pytest

from tests.models import zoo

INDEXING = {"aten.embedding.default", "aten.embedding_dense_backward.default",
            "aten.gather.default", "aten.index.Tensor", "aten.index_put.default",
            "aten.scatter_add.default", "aten._unsafe_index_put.default"}
MODELS = ["tv.alexnet", "tv.resnet18", "tv.mobilenet_v3_small", "hf.bert", "hf.gpt2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_on_the_kiln_backend(name):
    spec = zoo.by_name(name)
    if spec.family in ("timm", "transformers"):
        pytest.importorskip(spec.family)
    import torch
    torch.set_num_threads(2)
    with zoo.kernel_graphs() as seen:
        zoo.check_model(spec, "kiln", fullgraph=True)
    assert len(seen) == 3, seen            # eval, training forward, backward
    for ops, fallbacks in seen:
        others = [f for f in fallbacks if f not in INDEXING]
        assert not others if spec.family == "transformers" else len(fallbacks) <= 0.02 * ops, \
            (ops, fallbacks)
