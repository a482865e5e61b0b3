"""Which device a compiled graph's kernels run on, and which of its values live there.

A graph may mix devices as eager allows: CPU 0-d tensors and CPU constants
(``torch.tensor(...)`` made in the graph) beside CUDA tensors. Kernels run on one
device, the accelerator's when the graph has accelerator inputs; an op on another
device's values is a library call, run as eager runs it (``lowering._dtypes_ok``).
"""
from __future__ import annotations

import torch


def graph_device(example_inputs) -> torch.device:
    """The device a graph's kernels run on: that of its first input not on the CPU,
    if any, else the CPU (whatever the position of CPU tensors among the inputs)."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def _current_index() -> int:
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def same_device(d: torch.device, graph: torch.device) -> bool:
    """``d`` is the graph's device ("cuda" without an index is the current one)."""
    if d.type != graph.type:
        return False
    if d.type == "cpu" or d.index == graph.index:
        return True
    return (d.index if d.index is not None else _current_index()) == \
        (graph.index if graph.index is not None else _current_index())
