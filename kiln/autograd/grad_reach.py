"""Which outputs of a compiled graph each differentiable input's gradient comes from.

A compiled training graph is one autograd node for all its outputs. When the loss
reaches only some of them, autograd calls the node's backward with None for the
others (zeros are filled for the backward graph), and every input would receive a
gradient — zeros where eager gives none: in eager an input reached by no output the
loss uses keeps ``.grad`` None. So the trace records, per input, the outputs whose
autograd graph reaches it, and the backward returns None for an input that none of the
outputs holding a gradient reaches.
"""
from __future__ import annotations


def inputs_needs(outputs, leaves) -> list[int]:
    """For each of ``leaves``, a bitset over ``outputs`` (bit n: ``outputs[n]``'s
    autograd graph reaches the leaf)."""
    index = {id(leaf): j for j, leaf in enumerate(leaves)}
    memo: dict[int, int] = {}     # id(autograd node) -> bitset over leaves it reaches
    keep = []                     # the nodes, alive while their ids are keys
    needs = [0] * len(leaves)
    for n, out in enumerate(outputs):
        reached = _reach(out.grad_fn, index, memo, keep)
        for j in range(len(leaves)):
            if reached >> j & 1:
                needs[j] |= 1 << n
    return needs


def _reach(root, index, memo, keep) -> int:
    if root is None:
        return 0
    stack = [(root, False)]
    while stack:
        fn, children_done = stack.pop()
        key = id(fn)
        if key in memo:
            continue
        if not children_done:
            keep.append(fn)
            stack.append((fn, True))
            stack.extend((child, False) for child, _ in fn.next_functions
                         if child is not None and id(child) not in memo)
            continue
        bits = 0
        var = getattr(fn, "variable", None)     # AccumulateGrad: a leaf
        if var is not None and id(var) in index:
            bits |= 1 << index[id(var)]
        for child, _ in fn.next_functions:
            if child is not None:
                bits |= memo[id(child)]
        memo[key] = bits
    return memo[id(root)]


def unreached(needs: list[int], present: int) -> list[int]:
    """Positions of the leaves that no output in ``present`` (a bitset) reaches."""
    return [j for j, bits in enumerate(needs) if not bits & present]
