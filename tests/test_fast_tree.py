"""kiln/fast_tree.py gives pytree's results (it only skips pytree's per-leaf dispatch
for exact tuples, lists and dicts)."""
import collections

import pytest
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.immutable_collections import immutable_dict, immutable_list

from kiln import fast_tree

Pair = collections.namedtuple("Pair", "a b")


def _node():
    g = fx.Graph()
    return g.placeholder("x")


CASES = [
    None, 3, 2.5, "s", torch.float16, torch.device("cpu"), slice(1, 4), ...,
    torch.ones(2), torch.Size([2, 3]), (1, [2, None], {"a": 3, "b": (4,)}),
    [torch.zeros(1), (torch.ones(1), [None, 5])], Pair(1, [2, 3]),
    collections.OrderedDict(x=1, y=[2]), collections.defaultdict(list, {"k": [1, 2]}),
    torch.return_types.max((torch.ones(1), torch.zeros(1, dtype=torch.long))),
    ((), [], {}), [[[[1]]]], {"n": _node()},
    immutable_list([1, (2, immutable_dict(a=3, b=[4]))]), immutable_list(),
    immutable_dict(k=immutable_list([None, 5]), j=2), (immutable_list([_node()]),),
]


@pytest.mark.parametrize("x", CASES, ids=[type(c).__name__ for c in CASES])
def test_leaves_and_map_are_pytrees(x):
    assert _same(fast_tree.leaves(x), pytree.tree_leaves(x))
    fn = lambda a: ("leaf", type(a).__name__, a if not isinstance(a, torch.Tensor) else tuple(a.shape))  # noqa: E731
    got, want = fast_tree.tree_map(fn, x), pytree.tree_map(fn, x)
    assert type(got) is type(want) and got == want


def _same(a, b):
    return len(a) == len(b) and all(x is y or (not isinstance(x, torch.Tensor) and x == y)
                                    for x, y in zip(a, b))
