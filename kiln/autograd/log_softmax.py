"""``_log_softmax`` as core ops when its backward will run, so the partitioner can save
the logits and one value per row instead of the log-softmax.

Whole, ``_log_softmax``'s backward (``grad - exp(out) * sum(grad)``) reads its output,
so the forward saves the full log-softmax: for a causal LM's loss that is an fp32
[tokens, vocab] tensor written, kept and read back, when the (bf16) logits the matmul
made are alive anyway. Expanded to ``x - max - log(sum(exp(x - max)))`` (eager's own
order: the row max subtracted first; fp16 with ``half_to_float`` upcast first) the
output is pointwise in the logits and two per-row reductions, so the
min-cut (``partition.py``: reductions are saved, pointwise ops and casts recomputed)
keeps the logits and the [rows, 1] max and log-sum, and the backward recomputes the
log-softmax inside its one kernel. ``_log_softmax_backward_data`` is already expanded by
PyTorch's core table. nll_loss's ``gather`` from the log-softmax is expanded the same way
on the gathered logits, so the forward never stores the log-softmax either (the kernel
compiler stores a gather's source).

Only where autograd will differentiate it (grad mode on, the input requiring grad):
an inference graph keeps the op whole (the kernel compiler lowers it to the same
reductions, and an eager-run graph keeps eager's fused kernel).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

aten = torch.ops.aten

#: dtypes eager's kernel computes in float32 (its accumulate type).
_UPCAST = (torch.float16, torch.bfloat16)


def log_softmax_in_training(x: torch.Tensor, dim: int, half_to_float: bool = False):
    """``aten._log_softmax(x, dim, half_to_float)`` as amax, sub, exp, sum, log, sub
    when its gradient will be taken; ``NotImplemented`` (recorded whole) otherwise.

    A bf16/fp16 result (no ``half_to_float``) stays whole: eager's kernels round it
    differently per device (the CPU's rounds the log-sum-exp to the input's dtype, then
    the result; CUDA's rounds once), and a bf16 unit near zero is far outside the
    tolerance its callers compare with. Mixed precision's log-softmax (autocast, a
    ``.float()`` before the loss) takes a float32 input, which this covers."""
    if not (torch.is_grad_enabled() and x.requires_grad) or x.numel() == 0 \
            or not x.dtype.is_floating_point or (x.dtype in _UPCAST and not half_to_float):
        return NotImplemented
    out_dtype = torch.float32 if half_to_float else x.dtype
    if not x.is_contiguous():       # eager returns a contiguous tensor
        x = aten.clone.default(x, memory_format=torch.contiguous_format)
    work = aten._to_copy.default(x, dtype=torch.float32) if x.dtype in _UPCAST else x
    row_max = aten.amax.default(work, [dim], True)
    shifted = aten.sub.Tensor(work, row_max)
    log_sum = aten.log.default(aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True))
    out = aten.sub.Tensor(shifted, log_sum)
    if out.dtype != out_dtype:
        out = aten._to_copy.default(out, dtype=out_dtype)
    out._kiln_log_softmax = _Parts(work, row_max, log_sum, dim % max(x.dim(), 1),
                                   out_dtype, out._version)
    return out


class _Parts(NamedTuple):
    """How a decomposed log-softmax was made: ``out = cast((work - row_max) - log_sum)``
    along ``dim``; ``version``: ``out``'s when made (a later write makes it stale)."""
    work: torch.Tensor
    row_max: torch.Tensor
    log_sum: torch.Tensor
    dim: int
    dtype: torch.dtype
    version: int


def gather_of_log_softmax(x: torch.Tensor, dim: int, index: torch.Tensor,
                          sparse_grad: bool = False):
    """``gather(log_softmax, dim, target)`` (nll_loss's forward) as the same arithmetic
    on the gathered inputs: ``cast((gather(work) - row_max) - log_sum)``, each element
    computed as the full log-softmax computes it, so the value is the same; the
    forward then never materialises the [rows, vocab] log-softmax (the kernel compiler
    stores a gather's source). ``NotImplemented`` for any other gather."""
    parts = getattr(x, "_kiln_log_softmax", None)
    if parts is None or sparse_grad or x._version != parts.version or x.dim() == 0 \
            or dim % x.dim() != parts.dim or index.dim() != x.dim() \
            or any(index.shape[d] != x.shape[d] for d in range(x.dim()) if d != parts.dim):
        return NotImplemented
    picked = aten.gather.default(parts.work, parts.dim, index)
    out = aten.sub.Tensor(aten.sub.Tensor(picked, parts.row_max), parts.log_sum)
    if out.dtype != parts.dtype:
        out = aten._to_copy.default(out, dtype=parts.dtype)
    return out


#: op -> decomposition, merged into the CORE table (``autograd/ops.py``).
TRAINING_DECOMPOSITIONS = {aten._log_softmax.default: log_softmax_in_training,
                           aten.gather.default: gather_of_log_softmax}
