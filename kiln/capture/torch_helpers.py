"""torch's own C helpers that library Python code asks about global settings: answered
at trace time as constants, each with a guard re-asking it on every call (a setting the
user changes between calls recompiles; kiln never changes them itself).

Registered into ``rule_tables.CONST_FOLD`` (by ``torch_rules``): both a ``torch.*``
callable and a builtin reach that table.
"""
from __future__ import annotations

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported


def _guarded_query(fn, what):
    def rule(tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("K0042", f"{what} with arguments")
        value = fn()
        g = tx.output.guards
        g.add(f"{g.const(fn, 'F')}() == {value!r}", f"{what} is {value!r}")
        return V.ConstantValue(value)

    return rule


def _queries():
    c = torch._C
    names = {
        "_get_cublas_allow_tf32": "torch.backends.cuda.matmul.allow_tf32",
        "_get_cudnn_allow_tf32": "torch.backends.cudnn.allow_tf32",
        "_get_cudnn_enabled": "torch.backends.cudnn.enabled",
        "_get_cudnn_benchmark": "torch.backends.cudnn.benchmark",
        "_get_cudnn_deterministic": "torch.backends.cudnn.deterministic",
        "_get_mkldnn_enabled": "torch.backends.mkldnn.enabled",
        "_get_float32_matmul_precision": "torch.get_float32_matmul_precision()",
        "_get_cublas_allow_fp16_reduced_precision_reduction": "allow_fp16_reduced_precision_reduction",
        "_get_cublas_allow_bf16_reduced_precision_reduction": "allow_bf16_reduced_precision_reduction",
        "_are_functorch_transforms_active": "a functorch transform is active",
        "_get_privateuse1_backend_name": "the privateuse1 backend name",
    }
    out = {getattr(c, n): _guarded_query(getattr(c, n), what) for n, what in names.items() if hasattr(c, n)}
    checkpoint_valid = getattr(torch.autograd, "_is_checkpoint_valid", None)
    if checkpoint_valid is not None:  # False only while the autograd engine runs a backward
        out[checkpoint_valid] = _guarded_query(checkpoint_valid, "torch.autograd._is_checkpoint_valid()")
    if hasattr(torch, "get_float32_matmul_precision"):
        f = torch.get_float32_matmul_precision
        out[f] = _guarded_query(f, "torch.get_float32_matmul_precision()")
    return out


QUERY_RULES = _queries()
