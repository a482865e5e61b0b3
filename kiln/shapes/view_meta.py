"""``view`` of a tensor with symbolic sizes, as PyTorch's C++ kernel computes it.

Not every PyTorch takes SymInts in ``view``'s meta kernel (2.11's converts them to
ints and refuses), and its Python reference reaches the same result through many more
questions (a dozen guards for ``x.view(s // 2, -1)`` where the C++ kernel asks two).
This is the C++ kernel's algorithm (``infer_size`` then ``computeStride``), asking
the same questions in the same order, so the guards a trace keeps do not depend on the
PyTorch version. The arguments are fakes; the result is an ``as_strided`` alias.
"""
from __future__ import annotations


def _fail(msg):
    raise RuntimeError(msg)


def infer_size(shape, numel):
    """``shape`` with its ``-1`` (if any) replaced by what makes ``numel`` elements."""
    res = list(shape)
    newsize, infer_dim = 1, None
    for d, n in enumerate(shape):
        if n == -1:
            if infer_dim is not None:
                _fail("only one dimension can be inferred")
            infer_dim = d
        elif n >= 0:
            newsize = newsize * n
        else:
            _fail(f"invalid shape dimension {n}")
    if infer_dim is not None:
        if newsize == 0:
            _fail(f"cannot reshape tensor of 0 elements into shape {list(shape)} because "
                  "the unspecified dimension size -1 can be any value and is ambiguous")
        if numel % newsize != 0:
            _fail(f"shape '{list(shape)}' is invalid for input of size {numel}")
        res[infer_dim] = numel // newsize
    elif numel != newsize:
        _fail(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return res


def compute_stride(oldshape, oldstride, newshape):
    """The strides of ``newshape`` viewing a tensor of ``oldshape``/``oldstride``, or
    None where no view can (the dims merged are not one chunk of memory)."""
    if not oldshape:
        return [1] * len(newshape)
    numel = 1
    for n in oldshape:
        numel = numel * n
    if numel == 0:
        if list(oldshape) == list(newshape):
            return list(oldstride)
        newstride = [1] * len(newshape)
        for d in range(len(newshape) - 2, -1, -1):
            newstride[d] = max(newshape[d + 1], 1) * newstride[d + 1]
        return newstride
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    chunk_base_stride = oldstride[-1]
    tensor_numel = view_numel = 1
    for tensor_d in range(len(oldshape) - 1, -1, -1):
        tensor_numel = tensor_numel * oldshape[tensor_d]
        if tensor_d == 0 or (oldshape[tensor_d - 1] != 1 and
                             oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base_stride
                view_numel = view_numel * newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = oldstride[tensor_d - 1]
                tensor_numel = view_numel = 1
    return newstride if view_d == -1 else None


def view(a, *shape):
    """``aten.view(a, shape)`` on a fake (``shape`` as one list or spread out)."""
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = shape[0]
    size = infer_size(shape, a.numel())
    stride = compute_stride(a.shape, a.stride(), size)
    if stride is None:
        _fail(f"view size is not compatible with input tensor's size and stride (at least "
              "one dimension spans across two contiguous subspaces). Use .reshape(...) "
              "instead.")
    return a.as_strided(size, stride, a.storage_offset())
