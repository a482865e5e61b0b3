"""The reduction-kind table (``kiln/kernels/reductions.py``) is complete for both code
generators: every row says how to start, update and finish on each backend, and the
Triton helpers it names exist in the prelude. (Whether each kind computes eager's
values is for the shared cases, which reach every kind: test_coverage.py.)"""
import re

import torch

from kiln.kernels import ir
from kiln.kernels.codegen.cpp import source as cpp_source
from kiln.kernels.codegen.triton import kernel as triton_kernel
from kiln.kernels.codegen.triton.prelude import PRELUDE
from kiln.kernels.reductions import KINDS


def test_every_kind_has_both_backends():
    for k in KINDS.values():
        if k.is_arg:
            assert k.triton_arg_combine and k.combine is None, k.name
            continue
        for field in ("cpp_update", "cpp_clause", "triton_update", "triton_finish"):
            assert getattr(k, field), (k.name, field)
        assert k.combine in KINDS and not KINDS[k.combine].is_arg, k.name


def test_the_ir_knows_the_table_kinds():
    assert set(ir.REDUCTIONS) == set(KINDS)


def test_triton_helpers_named_by_the_table_exist():
    defined = set(re.findall(r"^def (kiln_\w+)", PRELUDE, re.M))
    for k in KINDS.values():
        text = " ".join(filter(None, (k.triton_update, k.triton_finish, k.triton_arg_combine)))
        for helper in re.findall(r"kiln_\w+", text):
            assert helper in defined, (k.name, helper)


def test_identities_per_backend():
    """The start values as each backend spells them (those the generators emitted before
    the table: the generated source is unchanged)."""
    f32, i64 = torch.float32, torch.int64
    assert cpp_source.identity("sum", "float", f32) == cpp_source.cconst(0, f32)
    assert cpp_source.identity("any", "bool", torch.bool) == "false"
    assert cpp_source.identity("max", "float", f32) == "-std::numeric_limits<float>::infinity()"
    assert cpp_source.identity("argmin", "int64_t", i64) == "std::numeric_limits<int64_t>::max()"
    assert triton_kernel.identity("prod", f32) == "1"
    assert triton_kernel.identity("any", torch.bool) == "0"
    assert triton_kernel.identity("argmax", f32) == 'float("-inf")'
    assert triton_kernel.identity("min", torch.bool) == "1"
    assert triton_kernel.identity("max", torch.int32) == str(torch.iinfo(torch.int32).min)
