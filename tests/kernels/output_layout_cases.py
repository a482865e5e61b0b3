"""Programs whose outputs' memory layout eager decides: compiled against eager.

Shared by ``test_output_layout.py`` (C++ kernels, in process) and run as a script under
``TRITON_INTERPRET=1 KILN_KERNEL_TARGET=triton`` (the Triton kernels on the CPU):
``python output_layout_cases.py [name ...]`` prints the mismatches and exits non-zero
when there are any.

Each output is compared on what a caller can observe of its memory: shape, strides,
storage offset, dtype and values; which outputs share memory; and, after a write into
the first output, every output's values again (sharing exactly where eager shares); the
write is of a value that requires grad, with grad mode on (a view made under no_grad
would refuse it). In training a backward runs first, then the write.
"""
from __future__ import annotations

import sys

import torch

import kiln


def _perm3(*shape):
    return torch.randn(*shape).permute(2, 0, 1)


def _twice_read(x):
    y = x.t() + 1
    return y, y.sin()


def _slice_of_intermediate(x):
    return (x + 1)[:, 2]


def _diagonal_of_intermediate(x):
    return (x * 2)[:4].diagonal()


def _expanded_reduction(x):
    return x.sum(1, keepdim=True).expand(4, 6)


def _transpose_in_place_then_write(x):
    z = x.clone()
    z.transpose_(0, 1)
    z.mul_(2)
    return z.contiguous(), z


def _t_in_place(x):
    y = x + 1
    y.t_()
    return y * 2, y


def _views_of_one(x):
    y = x * 2
    return y, y[1:], y.t()


def _views_of_transposed(x):
    y = x.t().exp()
    return y[None], y.T, y[:, 1:3]


def _chunks(x):
    return (x + 1).chunk(2, 1)


def _unbind(x):
    return (x * 2).unbind(1)


def _mixed_layouts(a, b):
    return a + b, a * b.t().t()


def _reduction_of_permuted(x):
    return x.sum(1, keepdim=True), x.amax(2, keepdim=True), x.mean(0)


def _compare_of_transposed(x):
    return x.t() > 0, (x.t() * 3).long()


def _fuzz_1154(x0):
    v5 = torch.tensor(2.0) - x0
    v8 = v5.clone()[:, -2]
    v14 = torch.sign(v5).clone()[-2:]
    return v5, v14, v8


def _select_then_unsqueeze(x):
    y = torch.relu(x.t())
    return y[1].unsqueeze(0), y.narrow(1, 1, 2)


def _expanded_input(x):
    return x.expand(3, 4) + 1, x.expand(3, 4) * x.expand(3, 4).t().t()


def _where_on_permuted(x):
    return torch.where(x > 0, x, torch.zeros(()))


#: name -> (program, inputs maker)
PROGRAMS = {
    "pointwise_of_transposed": (lambda x: x.t() + 1, lambda: [torch.randn(4, 5)]),
    "pointwise_read_twice": (_twice_read, lambda: [torch.randn(4, 5)]),
    "pointwise_of_permuted_3d": (lambda x: x.exp() * 2, lambda: [_perm3(3, 4, 5)]),
    "permuted_with_broadcast": (lambda x, y: x + y, lambda: [_perm3(3, 4, 5), torch.randn(4)]),
    "mixed_layouts": (_mixed_layouts, lambda: [torch.randn(5, 4).t(), torch.randn(4, 5)]),
    "slice_of_intermediate": (_slice_of_intermediate, lambda: [torch.randn(4, 5)]),
    "diagonal_of_intermediate": (_diagonal_of_intermediate, lambda: [torch.randn(4, 5)]),
    "expanded_reduction": (_expanded_reduction, lambda: [torch.randn(4, 5)]),
    "transpose_in_place_then_write": (_transpose_in_place_then_write,
                                      lambda: [torch.randn(4, 3)]),
    "t_in_place": (_t_in_place, lambda: [torch.randn(3, 2)]),
    "views_of_one": (_views_of_one, lambda: [torch.randn(4, 5)]),
    "views_of_transposed": (_views_of_transposed, lambda: [torch.randn(4, 5)]),
    "chunks": (_chunks, lambda: [torch.randn(4, 6)]),
    "unbind": (_unbind, lambda: [torch.randn(4, 3)]),
    "reduction_of_permuted": (_reduction_of_permuted, lambda: [_perm3(3, 4, 5)]),
    "compare_of_transposed": (_compare_of_transposed, lambda: [torch.randn(4, 5)]),
    "fuzz_1154": (_fuzz_1154, lambda: [torch.randn(5, 5).mT]),
    "select_then_unsqueeze": (_select_then_unsqueeze, lambda: [torch.randn(4, 5)]),
    "expanded_input": (_expanded_input, lambda: [torch.randn(1, 4)]),
    "where_on_permuted": (_where_on_permuted, lambda: [_perm3(2, 3, 4)]),
}


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _sharing(outs) -> list:
    return [[a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
             for b in outs] for a in outs]


def _describe(outs) -> list:
    return [(tuple(o.shape), o.stride(), o.storage_offset(), o.dtype, o.is_contiguous())
            for o in outs]


def _values_differ(a, b) -> bool:
    return not torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-5, equal_nan=True)


def _run(fn, make, train):
    torch.manual_seed(0)
    args = make()
    leaves = []
    if train:
        args = [a.detach().requires_grad_() if a.is_floating_point() else a for a in args]
        leaves = [a for a in args if a.requires_grad]
    outs = _flat(fn(*args))
    layout, sharing = _describe(outs), _sharing(outs)
    before = [o.detach().clone() for o in outs]
    grads = None
    diff = [o for o in outs if o.requires_grad]
    if train and diff:
        sum(o.sum() for o in diff).backward()
        grads = [a.grad for a in leaves]
    error = None
    try:
        if outs[0].dtype == torch.bool:
            outs[0].logical_not_()
        elif train:
            outs[0].mul_(3)
        else:       # a value that requires grad, written with grad mode on
            outs[0].mul_(torch.full((), 3.0, requires_grad=True))
    except RuntimeError as e:
        error = type(e).__name__
    after = [o.detach().clone() for o in outs]
    return layout, sharing, before, error, after, grads


def mismatches(names=None, train=False) -> list:
    """(program, what differs) for each difference between eager and kiln."""
    found = []
    for name, (fn, make) in PROGRAMS.items():
        if names and name not in names:
            continue
        e = _run(fn, make, train)
        c = _run(kiln.compile(fn, backend="kiln"), make, train)
        for what, i in (("layout", 0), ("sharing", 1), ("write error", 3)):
            if e[i] != c[i]:
                found.append((name, f"{what}: eager {e[i]}, kiln {c[i]}"))
        for what, i in (("values", 2), ("values after a write into out[0]", 4)):
            if len(e[i]) != len(c[i]) or any(
                    a.shape != b.shape or _values_differ(a, b) for a, b in zip(e[i], c[i])):
                found.append((name, what))
        if (e[5] is None) != (c[5] is None) or any(
                (a is None) != (b is None) or (a is not None and _values_differ(a, b))
                for a, b in zip(e[5] or [], c[5] or [])):
            found.append((name, "gradients"))
    return found


if __name__ == "__main__":
    bad = mismatches(sys.argv[1:] or None) + [
        (n, "train: " + w) for n, w in mismatches(sys.argv[1:] or None, train=True)]
    for b in bad:
        print(*b)
    sys.exit(1 if bad else 0)
