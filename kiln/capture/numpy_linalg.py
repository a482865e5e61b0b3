"""``np.linalg`` and ``np.fft`` as ``torch.linalg`` and ``torch.fft``, in NumPy's dtypes.

NumPy computes these in a float or complex dtype (integers become float64; NumPy 2
keeps float32 and complex64): the rule asks NumPy for the result dtype on a sample
(``sample_dtype``), casts the input to that precision and calls the torch function.
"""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.numpy_ufuncs import cast
from kiln.capture.numpy_values import NdarrayValue, np_module, torch_dtype


def _rules():
    from kiln.capture import numpy_rules as R

    return R


def _real_of(np, dt):
    return np.dtype(dt).type(0).real.dtype


def _complex_of(np, dt):
    return np.result_type(dt, np.complex64)


def _norm(tx, x, ord=None, axis=None, keepdims=False):
    R = _rules()
    np = np_module()
    x = R.as_array(tx, x)
    o, ax, kd = R.k(ord), R.k(axis), bool(R.k(keepdims))
    r = R.sample_dtype(np.linalg.norm, x, ord=o, axis=ax, keepdims=kd) if o is None or ax is not None \
        else None
    if ax is None and o is None:
        src = cast(tx, x, _real_or_same(np, x.dtype, r)).tensor
        t = R.op(tx, torch.linalg.vector_norm, src, 2, keepdim=kd) if not kd else \
            R.method(tx, "reshape", R.op(tx, torch.linalg.vector_norm, src, 2), (1,) * x.ndim)
    elif isinstance(ax, int):
        src = cast(tx, x, _real_or_same(np, x.dtype, r)).tensor
        t = R.op(tx, torch.linalg.vector_norm, src, 2 if o is None else o, dim=ax, keepdim=kd)
    elif isinstance(ax, tuple) and len(ax) == 2 and o in (None, "fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf):
        src = cast(tx, x, _real_or_same(np, x.dtype, r)).tensor
        t = R.op(tx, torch.linalg.matrix_norm, src, "fro" if o is None else o, dim=ax, keepdim=kd)
    else:
        raise Unsupported("K0301", "np.linalg.norm with this ord/axis")
    t = cast(tx, NdarrayValue(t), r).tensor
    return NdarrayValue(t, scalar=True)


def _real_or_same(np, dt, r):
    """The dtype a norm's input is computed in: NumPy casts integers to float64."""
    if dt.kind in "fc":
        return dt
    return r


def _solve(tx, a, b):
    R = _rules()
    np = np_module()
    a, b = R.as_array(tx, a), R.as_array(tx, b)
    r = _inexact(np, a.dtype, b.dtype)
    t = R.op(tx, torch.linalg.solve, cast(tx, a, r).tensor, cast(tx, b, r).tensor)
    return NdarrayValue(t)


def _inexact(np, *dts):
    r = np.result_type(*dts)
    if r.kind in "biu":
        return np.dtype(np.float64)
    if r == np.float16:
        raise Unsupported("K0304", "np.linalg on float16 (NumPy refuses)")
    return r


def _matrix_fn(torch_fn):
    def rule(tx, a, *args):
        R = _rules()
        np = np_module()
        if args:
            raise Unsupported("K0301", "extra arguments to an np.linalg function")
        a = R.as_array(tx, a)
        r = _inexact(np, a.dtype)
        t = R.op(tx, torch_fn, cast(tx, a, r).tensor)
        return NdarrayValue(t, scalar=True)
    return rule


def _matrix_power(tx, a, n):
    R = _rules()
    a = R.as_array(tx, a)
    n = R.k(n)
    if n < 0:
        a = cast(tx, a, _inexact(np_module(), a.dtype))
    return NdarrayValue(R.op(tx, torch.linalg.matrix_power, a.tensor, n))


# --- fft ----------------------------------------------------------------------------------
def _fft(np_name, torch_fn, kind):
    """``kind``: what the input is cast to: "c" complex, "r" real (rfft), "h" the
    complex input of a real-output inverse (irfft)."""
    def rule(tx, a, *args, **kwargs):
        R = _rules()
        np = np_module()
        a = R.as_array(tx, a)
        consts = [R.k(v) for v in args]
        kw = {n: R.k(v) for n, v in kwargs.items()}
        if kw.get("out") is not None:
            raise Unsupported("K0301", "np.fft with out=")
        kw.pop("out", None)
        np_fn = getattr(np.fft, np_name)
        r = R.sample_dtype(np_fn, a, *consts, **kw) if not consts and not any(
            n in kw for n in ("n", "s")) else _fft_dtype(np, a.dtype, kind)
        if kind == "r":
            src = cast(tx, a, _real_of(np, r))
        elif kind == "h":
            src = cast(tx, a, _complex_of(np, r))
        else:
            src = cast(tx, a, r if r.kind == "c" else _complex_of(np, r))
        names = {"axis": "dim", "axes": "dim"}
        tkw = {names.get(n, n): v for n, v in kw.items()}
        if "dim" in tkw and isinstance(tkw["dim"], list):
            tkw["dim"] = tuple(tkw["dim"])
        t = R.op(tx, torch_fn, src.tensor, *[R.C(c) for c in consts], **tkw)
        if t.fake.dtype != torch_dtype(r):
            t = R.method(tx, "to", t, torch_dtype(r))
        return NdarrayValue(t)
    return rule


def _fft_dtype(np, dt, kind):
    real = dt if dt.kind == "f" and dt != np.float16 else (
        _real_of(np, dt) if dt.kind == "c" else np.dtype(np.float64))
    if real == np.float16:
        real = np.dtype(np.float32)
    return real if kind == "h" else _complex_of(np, real)


def _shift(torch_fn):
    def rule(tx, x, axes=None):
        R = _rules()
        a = R.as_array(tx, x)
        ax = R.k(axes)
        return NdarrayValue(R.op(tx, torch_fn, a.tensor, dim=ax if not isinstance(ax, list) else tuple(ax)))
    return rule


def linalg_fft_rules(np):
    L, F = np.linalg, np.fft
    return {
        L.norm: _norm, L.inv: _matrix_fn(torch.linalg.inv), L.det: _matrix_fn(torch.linalg.det),
        L.cholesky: _matrix_fn(torch.linalg.cholesky), L.solve: _solve,
        L.matrix_power: _matrix_power,
        F.fft: _fft("fft", torch.fft.fft, "c"), F.ifft: _fft("ifft", torch.fft.ifft, "c"),
        F.fft2: _fft("fft2", torch.fft.fft2, "c"), F.ifft2: _fft("ifft2", torch.fft.ifft2, "c"),
        F.fftn: _fft("fftn", torch.fft.fftn, "c"), F.ifftn: _fft("ifftn", torch.fft.ifftn, "c"),
        F.rfft: _fft("rfft", torch.fft.rfft, "r"), F.rfft2: _fft("rfft2", torch.fft.rfft2, "r"),
        F.rfftn: _fft("rfftn", torch.fft.rfftn, "r"), F.irfft: _fft("irfft", torch.fft.irfft, "h"),
        F.irfft2: _fft("irfft2", torch.fft.irfft2, "h"),
        F.irfftn: _fft("irfftn", torch.fft.irfftn, "h"),
        F.fftshift: _shift(torch.fft.fftshift), F.ifftshift: _shift(torch.fft.ifftshift),
    }
