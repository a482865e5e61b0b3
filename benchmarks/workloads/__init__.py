"""Workloads: what gets compiled, its inputs, and the figures needed to judge it.

A ``Workload`` is a recipe; ``build(device)`` makes a fresh ``Instance`` (new module
with seeded weights, new input sets) so that every backend starts from the same state
and a training step under one backend cannot leak into another's.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable

import torch

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class Instance:
    #: what the backend compiles: an nn.Module or function (inference), or the
    #: forward+loss function returning a scalar loss (training)
    fn: Callable
    #: input sets; calls rotate over them
    inputs: list[tuple]
    #: training only: the module whose parameters get gradients and optimizer steps
    model: torch.nn.Module | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    suite: str                      # "micro" | "models"
    mode: str                       # "infer" | "train"
    dtype: torch.dtype
    build: Callable[[str], Instance] = field(repr=False)
    #: largest accepted max|got-ref| / max|ref| (outputs; and gradients in training)
    tol: float = 1e-5
    #: ideal bytes read + written per call (memory-bound kernels), for % of copy bandwidth
    bytes_moved: int | None = None
    #: floating-point operations per call (compute-bound kernels), for % of matmul peak
    flops: int | None = None
    #: Python packages the workload needs; missing ones turn the row into a skip
    needs: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.name}/{self.mode}/{DTYPE_NAMES.get(self.dtype, str(self.dtype))}"

    def missing(self) -> list[str]:
        return [p for p in self.needs if importlib.util.find_spec(p) is None]


def select(device: str, suite: str, quick: bool, only: list[str] | None = None,
           all_dtypes: bool = False) -> list[Workload]:
    """The workloads of ``suite`` ("micro", "models" or "all") sized for ``device``;
    ``only`` keeps those whose key contains one of the given substrings; ``all_dtypes``
    gives every model both modes at fp32 and bf16 (not only the default rows)."""
    from benchmarks.workloads import micro, models

    out: list[Workload] = []
    if suite in ("micro", "all"):
        out += micro.workloads(device, quick)
    if suite in ("models", "all"):
        out += models.workloads(device, quick, all_dtypes)
    if only:
        out = [w for w in out if any(s in w.key for s in only)]
    return out


def find(key: str, device: str, quick: bool) -> Workload:
    for w in select(device, "all", quick, all_dtypes=True):
        if w.key == key:
            return w
    raise KeyError(key)
