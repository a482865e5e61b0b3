"""Edge values through the kernel compiler, against eager: NaN, infinities and signed
zeros, empty and size-1 dims, 0-d tensors, integer overflow and division, type
promotion with Python scalars and 0-d tensors, and errors eager raises from values.

``mismatches()`` compiles each group with the ``kiln`` backend and returns what
differs from eager (empty when all agree). ``test_soundness_backend.py`` runs it with
the C++ target in process and, as ``python soundness_edge_cases.py``, with the Triton
target under TRITON_INTERPRET=1 (which must be set before Triton is imported).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import kiln  # noqa: E402

NAN, INF = float("nan"), float("inf")


def inputs(device="cpu"):
    f = torch.tensor([1.5, -2.5, NAN, -0.0, 0.0, INF, -INF, 3.0, -4.0, 4.0, -1e-3, 2.5])
    i = torch.tensor([7, -7, 0, 2 ** 40, -(2 ** 40), 3, -1, 5, -8, 9, 1, -3])
    d = torch.tensor([2, -2, 3, -3, 1, 7, -5, 4, 3, -4, 6, 2])
    return f.to(device), i.to(device), d.to(device)


def signs_and_nans(f):
    return (torch.sign(f), torch.relu(f), f.clamp(min=0.0), f.clamp(-1.0, 1.0),
            torch.nn.functional.hardtanh(f), f * -0.0, f * 0 + -0.0, torch.remainder(f, 2.0),
            torch.fmod(f, -1.5), f // 1.5, f // f.flip(0), f % f.flip(0),
            torch.round(f), torch.trunc(f), torch.tanh(f), f.pow(f.flip(0)),
            f.pow(2), f.abs() ** 0.5, torch.nan_to_num(f), torch.signbit(f),
            f.view(3, 4).amax(1), f.view(3, 4).amin(0), f.max(), f.min(),
            torch.where(f > 0, f, -0.0), torch.clamp(f, min=f.flip(0)))


def empty_and_small(f):
    g = f.view(3, 4)
    return (f[:0].sum(), f[:0].prod(), f[:0].mean(), g[:, :0].sum(1), g[:, :0].prod(1),
            g[:, :0].mean(1), g[:0].amax(1), g[:, :0].logsumexp(1), f[:0].any(),
            f[:0].all(), g[:0].softmax(1), (g[:1] * 2).sum(0), f[:1].view(()) + 1,
            g[:, 1:2].expand(3, 4) * 1, (f[:1] > 0).sum())


def integers(i, d):
    i32 = i.clamp(-1000, 1000).to(torch.int32)
    u8 = (i.abs() % 256).to(torch.uint8)
    i8 = (i % 100).to(torch.int8)
    return (i // d, i % d, torch.fmod(i, d), torch.div(i, d, rounding_mode="trunc"),
            torch.div(i, d, rounding_mode="floor"), i / d, i // 3, i % -3, i32 * 100000 * 100000,
            i * 3 + 2 ** 62, u8 + 200, -u8, u8 - u8.flip(0), i8 + 100, i8 * 3, i << 3,
            i >> 2, i & d, i ^ d, i.sum(), i32.sum(), u8.sum(), i.max(), i.amin(),
            torch.cumsum(i32, 0), i ** 2, d.pow(d.flip(0)), torch.abs(i), -i32,
            i.clamp(-2.5, 2.5))


def promotion(f, i):
    h, b = f.half(), i > 0
    d0 = torch.tensor(1.5, dtype=torch.float64)
    return (i * 2.5, i / 3, h + d0, i + d0, i.int() + torch.tensor(2 ** 40), b + b.flip(0),
            b * 1.5, b + torch.tensor(2), (i > 0).sum(), torch.where(i > 0, 1, 0.5),
            torch.where(i > 0, i, 2.5), i.int() * torch.tensor(3, dtype=torch.uint8),
            f.double() + i, torch.tensor(2.0) * torch.tensor(3), i.to(torch.float32) * 1000003)


def _raises_int_pow(i):
    return i ** -1


def _raises_int_div(i, d):
    return i // (d * 0)


def _raises_empty_max(f):
    return f[:0].amax()


GROUPS = [(signs_and_nans, ("f",)), (empty_and_small, ("f",)), (integers, ("i", "d")),
          (promotion, ("f", "i"))]
RAISING = [(_raises_int_pow, ("i",)), (_raises_empty_max, ("f",))]
#: eager raises on the CPU only (its CUDA kernels do not check the divisor)
RAISING_ON_CPU = [(_raises_int_div, ("i", "d"))]


def _differs(out, ref):
    if isinstance(ref, (tuple, list)):
        if len(out) != len(ref):
            return f"{len(out)} results, eager {len(ref)}"
        for k, (o, r) in enumerate(zip(out, ref)):
            e = _differs(o, r)
            if e:
                return f"[{k}] {e}"
        return None
    if not isinstance(out, torch.Tensor):
        return f"{type(out).__name__}, eager a tensor"
    if (out.dtype, out.shape) != (ref.dtype, ref.shape):
        return f"{out.dtype}{tuple(out.shape)}, eager {ref.dtype}{tuple(ref.shape)}"
    if out.numel() > 1 and [s for s, n in zip(out.stride(), out.shape) if n != 1] != \
            [s for s, n in zip(ref.stride(), ref.shape) if n != 1]:
        return f"strides {out.stride()}, eager {ref.stride()}"
    if ref.dtype.is_floating_point:
        same = torch.equal(out.isnan(), ref.isnan()) and torch.equal(
            out.nan_to_num(0.0), ref.nan_to_num(0.0)) and torch.equal(
            torch.signbit(out), torch.signbit(ref))
        if not same and not torch.allclose(out, ref, rtol=1e-5, atol=0, equal_nan=True):
            return f"{out.tolist()}, eager {ref.tolist()}"
        if not torch.equal(torch.signbit(out[ref == 0]), torch.signbit(ref[ref == 0])):
            return f"signed zeros {out.tolist()}, eager {ref.tolist()}"
    elif not torch.equal(out, ref):
        return f"{out.tolist()}, eager {ref.tolist()}"
    return None


def mismatches(on_cpu_semantics=True, device="cpu"):
    f, i, d = inputs(device)
    named = {"f": f, "i": i, "d": d}
    bad = []
    for fn, names in GROUPS:
        args = [named[n].clone() for n in names]
        ref = fn(*[a.clone() for a in args])
        e = _differs(kiln.compile(fn, backend="kiln")(*args), ref)
        if e:
            bad.append(f"{fn.__name__}: {e}")
    raising = RAISING + (RAISING_ON_CPU if on_cpu_semantics else [])
    for fn, names in raising:
        args = [named[n].clone() for n in names]
        try:
            fn(*[a.clone() for a in args])
        except RuntimeError as expected:
            try:
                out = kiln.compile(fn, backend="kiln")(*args)
            except RuntimeError:
                pass        # (the message may be the meta kernel's: capture raises it)
            else:
                bad.append(f"{fn.__name__}: returned {out}, eager raises {expected!r}")
    return bad


if __name__ == "__main__":
    # the Triton target runs here on CPU tensors (the interpreter): eager's CPU
    # kernels raise for an integer division by zero, its CUDA kernels do not
    problems = mismatches(on_cpu_semantics=False)
    print("\n".join(problems) if problems else "all agree")
    sys.exit(1 if problems else 0)
