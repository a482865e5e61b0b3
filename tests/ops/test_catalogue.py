"""The op catalogue (kiln/ops) is the one source of per-op facts, and every stage reads it."""
import ast
import logging
import os

import pytest
import torch
import torch.fx as fx

from kiln import fast_meta
from kiln.autograd import ops as op_sets
from kiln.autograd.partition import is_recomputable as partition_recomputable
from kiln.kernels import compile_aten_graph
from kiln.kernels.lowering.base import LOWERINGS
from kiln.ops import (CATALOGUE, KEEP_WHOLE, info, is_kiln_op, is_library_call,
                      is_recomputable)
from kiln.ops.catalogue import FAMILIES, ops_named

aten = torch.ops.aten
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "kiln")


def test_every_family_names_real_ops():
    for names, _facts, why in FAMILIES:
        assert why and ops_named(*names), names


def test_kept_whole_ops_are_library_calls_or_lowered():
    assert KEEP_WHOLE
    for op in KEEP_WHOLE:
        assert is_library_call(op) or op in LOWERINGS, op


def test_library_calls_are_kept_whole_or_never_in_a_core_graph():
    """A library call CORE would decompose would be a list disagreeing with itself."""
    calls = [op for op, i in CATALOGUE.items() if i.library_call]
    assert calls
    for op in calls:
        assert op in KEEP_WHOLE or op not in op_sets.CORE_OPS, op
    assert aten.scaled_dot_product_attention.default not in KEEP_WHOLE   # said why


def test_lowering_field_names_the_registered_module():
    for op, i in CATALOGUE.items():
        if i.lowering:
            assert op in LOWERINGS, op
            assert LOWERINGS[op].__module__.endswith(f"lowering.{i.lowering}"), op
    # a library call with a lowering says where it is
    for op in LOWERINGS:
        if is_library_call(op) and isinstance(op, torch._ops.OpOverload):
            assert info(op).lowering, op


def test_stages_read_the_catalogue():
    assert op_sets.CORE.keep_whole == KEEP_WHOLE
    for op in KEEP_WHOLE:
        assert op not in op_sets.DECOMPOSITIONS and op in op_sets.CORE_OPS
    for op, i in CATALOGUE.items():
        if i.decompose:
            assert op in op_sets.DECOMPOSITIONS, op
        if i.allowed:
            assert op in op_sets.CORE_OPS, op
        if i.recomputable:
            assert partition_recomputable(op), op
    assert set(fast_meta._SPECIAL) == {op for op, i in CATALOGUE.items() if i.meta}
    assert partition_recomputable is is_recomputable
    assert not is_recomputable(aten.bernoulli.p) and not is_recomputable(aten.mm.default)
    assert is_recomputable(aten.exp.default) and is_recomputable(aten.cat.default)


def test_kiln_ops_are_library_calls_and_core():
    from kiln.autograd.sdpa import SDPA, SDPA_BACKWARD
    for op in (SDPA, SDPA_BACKWARD):
        assert is_kiln_op(op) and is_library_call(op) and op in op_sets.CORE_OPS
    assert not is_kiln_op(aten.mm.default)


def test_library_call_extern_is_not_a_fallback(caplog):
    """bmm has no lowering: it runs as an extern, on purpose, so no fallback is logged;
    an op the catalogue does not list is."""
    def f(a, b):
        return (aten.cumprod.default(aten.bmm.default(a, b), 0),)
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    with caplog.at_level(logging.INFO, logger="kiln.fallbacks"):
        c = compile_aten_graph(fx.symbolic_trace(f), [a, b])
    assert "aten.cumprod.default" in caplog.text and "aten.bmm" not in caplog.text
    torch.testing.assert_close(c(a, b)[0], torch.cumprod(torch.bmm(a, b), 0))


_OWN_LISTS = {"KEEP_WHOLE", "LIBRARY_CALLS", "_CHEAP", "_EXTRA_ALLOWED", "_EXTRA_DECOMPOSE"}


def _sources():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        if os.path.relpath(d, ROOT).split(os.sep)[0] == "ops":
            continue
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(d, f)


@pytest.mark.parametrize("path", sorted(_sources()), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_second_list_outside_the_catalogue(path):
    """No op list of the catalogue's kinds, nor a "kiln:: op" test, outside kiln/ops."""
    with open(path) as fh:
        src = fh.read()
    tree = ast.parse(src, path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            assert not names & _OWN_LISTS, (path, names)
        if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value == "kiln" for c in node.comparators):
            left = node.left
            assert not (isinstance(left, ast.Call) and any(
                isinstance(a, ast.Constant) and a.value == "namespace" for a in left.args)), path
