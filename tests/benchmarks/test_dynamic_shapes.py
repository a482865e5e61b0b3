"""benchmarks/dynamic_shapes.py: the size orders of issue 23's rows."""
import pytest

from benchmarks import dynamic_shapes


def test_resnet18_orders():
    pytest.importorskip("torchvision")
    a = dynamic_shapes.parse(["--workload", "resnet18", "--order", "ascending", "--batches", "6"])
    assert (a.order, a.batches) == ("ascending", 6)
    _, inputs, _, labels = dynamic_shapes.resnet18("cpu", True, a.order, a.batches)
    assert [x.shape[0] for x in inputs] == [1, 2, 3, 4, 5, 6]
    _, inputs, _, _ = dynamic_shapes.resnet18("cpu", True, "shuffled", 6)
    sizes = [x.shape[0] for x in inputs]
    assert sorted(sizes) == [1, 2, 3, 4, 5, 6] and sizes != sorted(sizes)
    assert dynamic_shapes.parse([]).order == "shuffled"
