"""Deliberate kernel-compiler bugs (``KILN_INJECT_BUG``), so that the minifier can be
tested end to end on a failure whose cause is known: ``relu_compile_error`` makes
building any aten graph that contains ``relu`` raise; ``relu_accuracy`` makes the relu
lowering compute ``relu(x) + 1`` (in ``kernels/lowering/``). Never set in normal use.
"""
from __future__ import annotations

import torch

from kiln import config

BUGS = ("relu_compile_error", "relu_accuracy")


class InjectedCompileError(RuntimeError):
    """Raised by the kernel compiler under KILN_INJECT_BUG=relu_compile_error."""


def _has_relu(gm) -> bool:
    relus = (torch.ops.aten.relu.default, torch.ops.aten.relu_.default)
    return any(n.op == "call_function" and n.target in relus for n in gm.graph.nodes)


def check_compile(gm) -> None:
    """Called as the kernel compiler starts building ``gm``."""
    bug = config.inject_bug
    if bug not in BUGS:
        raise ValueError(f"unknown KILN_INJECT_BUG {bug!r}; known: {', '.join(BUGS)}")
    if bug == "relu_compile_error" and _has_relu(gm):
        raise InjectedCompileError("kiln: injected bug: the kernel compiler fails on relu "
                                   "(KILN_INJECT_BUG=relu_compile_error)")
