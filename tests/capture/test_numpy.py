"""NumPy programs traced into one graph (torch.compile's FAQ, "Does NumPy work with
torch.compile?"): each program runs compiled with ``fullgraph=True`` on the ``eager``
and ``kiln`` backends and its result is compared with NumPy's own run — type (ndarray
or NumPy scalar), dtype, shape and values — and it must be exactly one graph."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln


class Counting:
    def __init__(self, inner):
        self.inner = inner
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        if self.inner == "eager":
            return gm.forward
        from kiln.backends import lookup_backend

        return lookup_backend(self.inner)(gm, example_inputs)


def same(got, want, rtol=1e-7, atol=1e-12):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w, rtol, atol)
        return
    if isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        assert np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        return
    if isinstance(want, float):  # summed in another order than NumPy's pairwise sum
        assert got == pytest.approx(want, rel=rtol, abs=atol)
        return
    assert got == want


def run(fn, *args, backend="eager", rtol=1e-7, atol=1e-12, graphs=1):
    want = fn(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
    be = Counting(backend)
    kiln.reset()
    cf = kiln.compile(fn, backend=be, fullgraph=True)
    ins = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = cf(*ins)
    same(got, want, rtol, atol)
    got2 = cf(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])  # the cached entry
    same(got2, want, rtol, atol)
    assert len(be.graphs) == graphs, len(be.graphs)
    return ins


rng = np.random.default_rng(0)
A = rng.standard_normal((4, 5))
B = rng.standard_normal((4, 5))
V3 = rng.standard_normal(3)
I = rng.integers(-5, 5, (4, 5))
F32 = rng.standard_normal((4, 5)).astype(np.float32)
SQ = rng.standard_normal((3, 3)) + 3 * np.eye(3)


def p_faq(X, Y):
    return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))


def p_sum_keepdims(x):
    return np.sum(x, axis=1, keepdims=True), x.sum(0), np.sum(x)


def p_mean_std(x):
    return np.mean(x, axis=0), x.std(axis=1, ddof=1), np.var(x)


def p_int_mean(i):
    return i.mean(), np.mean(i, axis=1)


def p_max_min(x):
    return x.max(axis=1), np.min(x), np.amax(x, axis=0, keepdims=True)


def p_arg(x):
    return np.argmax(x), x.argmin(axis=1), np.argmax(x, axis=0, keepdims=True)


def p_prod_cumsum(x):
    return np.prod(x, axis=1), np.cumsum(x), x.cumsum(axis=0)


def p_int_sum(i):
    return np.sum(i.astype(np.int32), axis=0), np.cumsum(i.astype(np.int8))


def p_broadcast(x, v):
    return x[:, :3] + v, x[:, :3] * v[None, :] - 2.0


def p_operators(x, y):
    return x / y, x // 2, x % 3, -x, abs(x), x ** 2, +x


def p_reflected(x):
    return 2.0 - x, 1 / (x * x + 1), 3 * x, 2 ** x, 1 - (x > 0)


def p_int_division(i):
    return i / 2, i // 3, i % 4, i * 2.5


def p_compare(x, y):
    return x > y, x <= 0.5, x == y, np.logical_and(x > 0, y > 0)


def p_f32_promotion(a, b):
    return a + 1.0, a * b, a + np.float64(1.0), a.astype(np.float16) + 1


def p_ufuncs(x):
    return np.exp(x), np.sin(x), np.sqrt(np.abs(x)), np.log1p(np.abs(x)), np.tanh(x)


def p_int_ufuncs(i):
    return np.sin(i), np.sqrt(np.abs(i.astype(np.int16))), np.exp(i.astype(np.int8))


def p_sign_nan(x):
    y = x / (x - x)  # 0/0: nan
    return np.sign(y), np.sign(x)


def p_maximum(x, y):
    return np.maximum(x, y), np.minimum(x, 0), np.clip(x, -0.5, 0.5)


def p_where(x):
    return np.where(x > 0, x, 0.0), np.where(x > 0, 1, -1)


def p_inplace(x):
    x += 1
    x *= 2
    return x


def p_setitem(x):
    y = x.copy()
    y[0] = 0.0
    y[:, 1] = -1.0
    y[1:3, 2:4] = y[0:2, 0:2] * 2
    return y


def p_indexing(x):
    return x[0], x[1:3], x[:, ::2], x[..., 1], x[None, 0, :], x[1, 2], x[-1, -1]


def p_fancy_index(x):
    idx = np.array([0, 2, 3])
    return x[idx], x[[1, 0]]


def p_attributes(x):
    return x.shape, x.ndim, x.size, x.dtype, x.T, x.itemsize, x.nbytes


def p_reshape(x):
    return x.reshape(5, 4), x.reshape((2, -1)), np.reshape(x, (20,)), x.ravel(), x.flatten()


def p_transpose(x):
    y = x.reshape(2, 2, 5)
    return y.transpose(2, 0, 1), np.transpose(y), np.swapaxes(y, 0, 2), np.moveaxis(y, 0, -1)


def p_expand_squeeze(x):
    y = np.expand_dims(x, 0)
    return y.shape, np.squeeze(y, axis=0), y.squeeze()


def p_astype(x):
    return x.astype(np.float32), x.astype(np.int64), x.astype("float16"), x.astype(bool)


def p_dtype_objects(x):
    d = x.dtype
    y = x.astype(np.float32)
    return d == np.float64, y.dtype == np.dtype("float32"), np.zeros(3, dtype=d), y.dtype.itemsize


def p_finfo(x):
    eps = np.finfo(np.float32).eps
    big = np.iinfo(np.int16).max
    return x.astype(np.float32) + eps, x * big, np.finfo(x.dtype).tiny


def p_creation(x):
    return (np.zeros((2, 3)), np.ones(4, dtype=np.int32), np.full((2, 2), 7), np.full(3, 1.5),
            np.zeros_like(x), np.ones_like(x, dtype=np.int8), np.empty((0, 2)).shape)


def p_arange_linspace(x):
    return x[0] * np.arange(5), np.linspace(0, 1, 5), np.arange(1, 10, 2.5), np.eye(3)


def p_array_lists(x):
    a = np.array([1, 2, 3])
    b = np.array([[1.0, 2.0], [3.0, 4.0]])
    c = np.array([x[0, 0], x[1, 1]])
    return a * 2, b @ b, c, np.array([True, False]), np.asarray(x) is x


def p_meshgrid(v):
    xx, yy = np.meshgrid(v, v[:2])
    ii, jj = np.meshgrid(v, v, indexing="ij")
    return xx + yy, ii * jj


def p_concat(x, y):
    return (np.concatenate([x, y]), np.concatenate((x, y), axis=1), np.stack([x, y], axis=-1),
            np.vstack([x, y]), np.hstack([x, y]))


def p_matmul(x, y):
    return x @ y.T, np.dot(x, y.T), np.matmul(x.T, y), x.dot(y[0]), np.outer(x[0], y[0])


def p_einsum(x, y):
    return np.einsum("ij,ij->i", x, y), np.einsum("ij->j", x)


def p_linalg(s):
    return np.linalg.inv(s), np.linalg.det(s), np.linalg.norm(s), np.linalg.solve(s, s[0])


def p_linalg_norms(x):
    return (np.linalg.norm(x, axis=1), np.linalg.norm(x, ord=1, axis=0),
            np.linalg.norm(x, "fro", axis=(0, 1)), np.linalg.norm(x[0], np.inf, axis=0))


def p_linalg_int(i):
    return np.linalg.norm(i), np.linalg.matrix_power(i[:4, :4], 2)


def p_fft(x):
    return np.fft.fft(x), np.fft.ifft(np.fft.fft(x)).real, np.fft.rfft(x, axis=0)


def p_fft_more(x):
    return np.fft.fft2(x), np.fft.irfft(np.fft.rfft(x[0]), n=5), np.fft.fftshift(x), np.fft.fftfreq(8)


def p_fft_f32(a):
    return np.fft.fft(a), np.fft.rfft(a)


def p_flip_tile(x):
    return np.broadcast_to(x[0], (2, 5)), np.tile(x[0], (2, 1)), np.repeat(x[0], 2), np.triu(x), np.tril(x, -1)


def p_all_any(x):
    return np.all(x > -10), (x > 0).any(axis=0), np.any(x > 100)


def p_numpy_scalar(x):
    s = np.sum(x)
    m = x.mean()
    return s * 2, s + m, np.float32(3.5), np.float32(s)


def p_round(x):
    return np.round(x, 2), x.round(), np.floor(x), np.ceil(x), np.trunc(x), np.rint(x)


def p_median_trace(x):
    return np.median(x), np.median(x, axis=1), np.trace(x[:4, :4]), x[:4, :4].trace()


def p_loop(x):
    acc = np.zeros(x.shape[1])
    for row in x:
        acc = acc + row * row
    return np.sqrt(acc)


def p_len_isinstance(x):
    return len(x), isinstance(x, np.ndarray), isinstance(np.sum(x), np.floating)


def p_bool_ops(x, y):
    a, b = x > 0, y > 0
    return a & b, a | b, a ^ b, ~a, np.logical_not(a)


def p_complex(x, y):
    z = x + 1j * y
    return np.abs(z), z.real, z.imag, np.conj(z), z * z


def p_softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def p_pi_constants(x):
    return np.pi * x, x * np.e, np.sin(x + np.pi / 2), x[np.newaxis].shape


def p_uint8(i):
    u = i.astype(np.uint8)
    return u + 1, u * 2.0, np.sum(u, axis=0, dtype=np.int64), u.max()


def p_int_division_by_zero(i):
    j = i.copy()
    j[0] = 0
    return i // j, i % j, np.fmod(i, j), i / j


def p_sort(x):
    y = x.copy()
    y.sort(axis=0)
    return np.sort(x), np.sort(x, axis=None), y, np.argsort(x, kind="stable"), x.argsort(axis=0, kind="stable")


def p_int_power(i):
    return i ** 2, np.power(i, 3), i.astype(np.float64) ** -1.5


def p_dtype_queries(x, i):
    if np.issubdtype(x.dtype, np.floating) and not np.issubdtype(i.dtype, np.floating):
        r = np.result_type(x.dtype, i.dtype)
        return (x + i).astype(r), np.shape(x), np.ndim(i), np.size(x, 0), np.can_cast(i.dtype, np.float32)
    return x


def p_pairwise_distances(x, y):
    d = np.sqrt(np.sum((x[:, None, :] - y[None, :, :]) ** 2, axis=-1))
    return d, np.argmin(d, axis=1)


def p_kmeans_step(x):
    centers = x[:2]
    d = ((x[:, None, :] - centers[None]) ** 2).sum(-1)
    onehot = (d == d.min(axis=1, keepdims=True)).astype(np.float64)
    return (onehot.T @ x) / np.maximum(onehot.sum(0)[:, None], 1.0)


def p_standardize(x):
    mu = x.mean(axis=0)
    sd = x.std(axis=0)
    z = (x - mu) / np.where(sd > 0, sd, 1.0)
    return z, np.abs(z).max()


def p_horner(x):
    coeffs = [1.0, -2.0, 0.5, 3.0]
    acc = np.zeros_like(x)
    for c in coeffs:
        acc = acc * x + c
    return acc


def p_gaussian_kernel(v):
    xs = np.linspace(-1.0, 1.0, 7)
    k = np.exp(-0.5 * (xs / 0.4) ** 2)
    k /= k.sum()
    return np.outer(v, k).sum(axis=0), k


def p_rotation(v):
    theta = np.pi / 6
    r = np.array([[np.cos(theta), -np.sin(theta), 0.0], [np.sin(theta), np.cos(theta), 0.0], [0.0, 0.0, 1.0]])
    return r @ v, np.linalg.det(r), (r @ r.T).round(12)


def p_more_reductions(x):
    return (np.cumprod(x[:, :3], axis=1), np.var(x, axis=1, ddof=1), np.mean(x, dtype=np.float32),
            np.any(x > 1, axis=1, keepdims=True), np.all(x > -3, axis=0))


def p_more_linalg(s):
    c = np.linalg.cholesky(s @ s.T + np.eye(3))
    return c, np.linalg.matrix_power(s, 3), np.linalg.inv(s) @ s


def p_more_fft(x):
    f = np.fft.fft2(x)
    return np.fft.ifft2(f).real, np.fft.irfftn(np.fft.rfftn(x), s=x.shape), np.fft.ifftshift(x, axes=0)


def p_more_creation(x):
    return (np.ones((2, 2), dtype=bool), np.full_like(x, 3), np.identity(2), np.logspace(0, 2, 3),
            np.empty_like(x).shape, np.zeros((2, 0)).size)


def p_more_shapes(x):
    y = np.expand_dims(x, (0, -1))
    return y.shape, np.swapaxes(y, 1, 2).shape, np.vstack([x[0], x[1]]), np.hstack([x[:, 0], x[:, 1]])


def p_more_ufuncs(x, y):
    return np.hypot(x, y), np.arctan2(x, y), np.logaddexp(x, y), np.copysign(x, y), np.fmax(x, np.nan)


def p_mixed_int_float(i, a):
    j = i.astype(np.int32)
    return j / j.clip(1, None), j * a.astype(np.float32), j // 2, (j > 0) * 1.5, j + np.int8(3)


def p_float16(a):
    h = a.astype(np.float16)
    return h * 2, h + h, np.sqrt(np.abs(h)), h.sum(), h.astype(np.float64).mean()


def p_scalar_types(x, i):
    return x[0, 0], i[1, 1], (x > 0)[0, 0], x.astype(np.float32)[2, 2], i.astype(np.uint8)[0, 0]


def p_overlapping_update(x):
    y = x.copy()
    y[1:] -= y[:-1]
    y[:, :-1] += y[:, 1:]
    return y


def p_gram(x):
    g = x.T @ x
    return g, np.trace(g), g[np.arange(5), np.arange(5)]


def p_tril_triu(x):
    s = x[:4, :4]
    return np.tril(s, 1), np.triu(s, -1), np.tril(s) + np.triu(s, 1)


def p_clip_variants(x):
    return np.clip(x, None, 0.2), x.clip(-0.1), np.clip(x, 0, 1).dtype, np.clip(x.astype(np.int64), -1, 1)


def p_weighted_mean(x, v):
    w = np.abs(v) / np.sum(np.abs(v))
    return np.sum(x[:, :3] * w, axis=1), np.einsum("ij,j->i", x[:, :3], w)


def p_normalize_rows(x):
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / n, (x / n).sum(axis=1)


PROGRAMS = [
    (p_faq, (A, B)), (p_sum_keepdims, (A,)), (p_mean_std, (A,)), (p_int_mean, (I,)),
    (p_max_min, (A,)), (p_arg, (A,)), (p_prod_cumsum, (A,)), (p_int_sum, (I,)),
    (p_broadcast, (A, V3)), (p_operators, (A, B)), (p_reflected, (A,)), (p_int_division, (I,)), (p_compare, (A, B)),
    (p_f32_promotion, (F32, F32)), (p_ufuncs, (A,)), (p_int_ufuncs, (I,)), (p_sign_nan, (A,)),
    (p_maximum, (A, B)), (p_where, (A,)), (p_inplace, (A,)), (p_setitem, (A,)),
    (p_indexing, (A,)), (p_fancy_index, (A,)), (p_attributes, (A,)), (p_reshape, (A,)),
    (p_transpose, (A,)), (p_expand_squeeze, (A,)), (p_astype, (A,)), (p_dtype_objects, (A,)),
    (p_finfo, (A,)), (p_creation, (A,)), (p_arange_linspace, (A,)), (p_array_lists, (A,)),
    (p_meshgrid, (V3,)), (p_concat, (A, B)), (p_matmul, (A, B)), (p_einsum, (A, B)),
    (p_linalg, (SQ,)), (p_linalg_norms, (A,)), (p_linalg_int, (I,)), (p_fft, (A,)),
    (p_fft_more, (A,)), (p_fft_f32, (F32,)), (p_flip_tile, (A,)), (p_all_any, (A,)),
    (p_numpy_scalar, (A,)), (p_round, (A,)), (p_median_trace, (A,)), (p_loop, (A,)),
    (p_len_isinstance, (A,)), (p_bool_ops, (A, B)), (p_complex, (A, B)), (p_softmax, (A,)),
    (p_pi_constants, (A,)), (p_uint8, (I,)), (p_int_division_by_zero, (I,)), (p_sort, (A,)),
    (p_int_power, (I,)), (p_dtype_queries, (A, I)), (p_pairwise_distances, (A, B)),
    (p_kmeans_step, (A,)), (p_standardize, (A,)), (p_horner, (A,)), (p_gaussian_kernel, (V3,)),
    (p_rotation, (V3,)), (p_more_reductions, (A,)), (p_more_linalg, (SQ,)), (p_more_fft, (A,)),
    (p_more_creation, (A,)), (p_more_shapes, (A,)), (p_more_ufuncs, (A, B)),
    (p_mixed_int_float, (I, A)), (p_float16, (A,)), (p_scalar_types, (A, I)),
    (p_overlapping_update, (A,)), (p_gram, (A,)), (p_tril_triu, (A,)), (p_clip_variants, (A,)),
    (p_weighted_mean, (A, V3)), (p_normalize_rows, (A,)),
]


@pytest.mark.parametrize("fn,args", PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_program_eager_backend(fn, args):
    run(fn, *args)


@pytest.mark.slow
@pytest.mark.parametrize("fn,args", PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_program_kiln_backend(fn, args):
    run(fn, *args, backend="kiln", rtol=1e-6, atol=1e-9)


# --- the boundary: tensors and ndarrays ------------------------------------------------------
def test_tensor_numpy_and_from_numpy_are_views():
    def f(t):
        a = t.numpy()
        b = np.cos(a) * 2
        c = torch.tensor(b)
        c.add_(1)  # a copy: b unchanged
        return torch.from_numpy(b) + 1, a.dtype, c, torch.as_tensor(b)

    be = Counting("eager")
    t = torch.randn(5)
    got = kiln.compile(f, backend=be, fullgraph=True)(t)
    want = f(t)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[2], want[2])
    torch.testing.assert_close(got[3], want[3])
    assert got[1] == want[1] and len(be.graphs) == 1
    assert all(n.target is not torch.from_numpy for n in be.graphs[0].graph.nodes)


@pytest.mark.parametrize("backend", ["eager", pytest.param("kiln", marks=pytest.mark.slow)])
def test_input_array_written_in_place_reaches_the_caller(backend):
    def f(x, y):
        x[0] = 5.0
        x *= 2
        y[:, 1] += x[:, 0]
        return np.sum(x), y.T

    x, y = A.copy(), B.copy()
    got = kiln.compile(f, backend=backend, fullgraph=True)(x, y)
    x2, y2 = A.copy(), B.copy()
    want = f(x2, y2)
    same(got, want, rtol=1e-12)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert np.shares_memory(got[1], y)


def test_returned_input_is_the_same_array():
    def f(x):
        return x, x.T

    x = A.copy()
    got = kiln.compile(f, backend="eager", fullgraph=True)(x)
    assert got[0] is x and np.shares_memory(got[1], x)


def test_guards_retrace_on_dtype_and_shape():
    be = Counting("eager")
    cf = kiln.compile(lambda x: x * 2, backend=be, fullgraph=True)
    same(cf(A), A * 2)
    same(cf(F32), F32 * 2)
    same(cf(V3), V3 * 2)
    same(cf(A), A * 2)
    assert len(be.graphs) == 3


@pytest.mark.parametrize("arr", [np.array(["a", "b"]), np.array([1, None], dtype=object),
                                 A[::-1], A.astype(">f8"), np.arange(3, dtype=np.uint32)],
                         ids=["str", "object", "negative_stride", "big_endian", "uint32"])
def test_untraceable_arrays_break(arr):
    def f(x):
        return x[:1]

    with pytest.raises(kiln.Unsupported):
        kiln.compile(f, backend="eager", fullgraph=True)(arr)
    got = kiln.compile(f, backend="eager")(arr)  # runs NumPy instead
    np.testing.assert_array_equal(got, f(arr))


def _broadcast_write(x):
    b = np.broadcast_to(x[0], (3, 5))
    c = b[1]
    c[0] = 1.0
    return x


@pytest.mark.parametrize("fn", [
    lambda x: np.polyfit(x[0], x[1], 1),           # no rule: NumPy runs it
    lambda x: x[x > 0],                           # data-dependent shape
    lambda x: float(np.sum(x)),                   # needs the data
    lambda x: x.astype(np.int8) + 1000,           # NumPy raises OverflowError
    lambda x: np.sort(x, axis=1) if x.sum() > 0 else x,  # data-dependent branch
    lambda x: np.flip(x, 0),                      # a negative-stride view
    lambda x: x[::-1],
    _broadcast_write,                             # a read-only view
], ids=["polyfit", "mask", "float", "overflow", "branch", "flip", "negative_step", "broadcast_write"])
def test_unsupported_is_a_break_never_a_different_answer(fn):
    x = A.copy()
    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend="eager", fullgraph=True)(x)
    try:
        want = fn(A.copy())
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            kiln.compile(fn, backend="eager")(x)
        return
    same(kiln.compile(fn, backend="eager")(x), want)


def _w_setitem(x):
    x[0] = 1.0


def _w_view_setitem(x):
    y = x[0]
    y[1:3] = 2.0


def _w_inplace_view(x):
    y = x.T
    y *= 2


def _w_view_sort(x):
    x.reshape(-1).sort()


@pytest.mark.parametrize("write", [_w_setitem, _w_view_setitem, _w_inplace_view, _w_view_sort])
def test_read_only_arrays_refuse_writes(write):
    def f(x):
        write(x)
        return x

    x = A.copy()
    x.flags.writeable = False
    with pytest.raises(kiln.Unsupported, match="read-only"):
        kiln.compile(f, backend="eager", fullgraph=True)(x)
    with pytest.raises(ValueError):
        kiln.compile(f, backend="eager")(x)  # NumPy's own error, the array unchanged
    np.testing.assert_array_equal(x, A)


def test_graph_break_materializes_arrays():
    def f(x):
        y = np.exp(x) + 1
        kiln.graph_break()
        return np.sum(y, axis=0)

    ex = kiln.explain(f)(A.copy())
    assert (ex.graph_count, ex.graph_break_count) == (2, 1)
    same(kiln.compile(f, backend="eager")(A.copy()), f(A.copy()))


# --- kiln.wrap_numpy -------------------------------------------------------------------------
def _faq_wrapped():
    @kiln.wrap_numpy
    def numpy_fn(X, Y):
        return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))
    return numpy_fn


def test_wrap_numpy_takes_and_returns_tensors():
    fn = _faq_wrapped()
    X, Y = torch.randn(32, 8, dtype=torch.float64), torch.randn(32, 8, dtype=torch.float64)
    be = Counting("eager")
    got = kiln.compile(fn, backend=be, fullgraph=True)(X, Y)
    want = fn(X, Y)  # eager: through NumPy
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    assert len(be.graphs) == 1


def test_wrap_numpy_differentiates():
    @kiln.wrap_numpy
    def numpy_fn(X, Y):
        return np.mean(np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1)))

    X = torch.randn(16, 8, dtype=torch.float64, requires_grad=True)
    Y = torch.randn(16, 8, dtype=torch.float64)
    Z = kiln.compile(numpy_fn, fullgraph=True)(X, Y)
    assert isinstance(Z, torch.Tensor)
    Z.backward()
    Xr = X.detach().clone().requires_grad_()
    torch.mean(torch.sum(Xr[:, :, None] * Y[:, None, :], dim=(-2, -1))).backward()
    torch.testing.assert_close(X.grad, Xr.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_wrap_numpy_runs_on_cuda():
    fn = _faq_wrapped()
    X = torch.randn(1024, 64, device="cuda")
    Y = torch.randn(1024, 64, device="cuda")
    Z = kiln.compile(fn, fullgraph=True)(X, Y)
    assert isinstance(Z, torch.Tensor) and Z.device.type == "cuda" and Z.dtype == torch.float32
    # Each result sums 4096 float32 products in some order: both kiln's and torch's
    # float32 answers round. Against float64, kiln's error may be at most twice torch's
    # own float32 error (a dropped or wrong term is ~100x more).
    exact = torch.sum(X.double()[:, :, None] * Y.double()[:, None, :], dim=(-2, -1))
    ref_err = (torch.sum(X[:, :, None] * Y[:, None, :], dim=(-2, -1)).double() - exact).abs()
    kiln_err = (Z.double() - exact).abs()
    assert kiln_err.max() <= 2 * ref_err.max(), (kiln_err.max(), ref_err.max())
    assert kiln_err.mean() <= 2 * ref_err.mean(), (kiln_err.mean(), ref_err.mean())


# --- np.random: the entry makes NumPy's own draws, in program order ---------------------------
def _random_program(x):
    np.random.seed(3)
    a = np.random.rand(4, 5)
    b = np.random.randn(5)
    c = np.random.randint(0, 10, size=(3,))
    return x * a + b, c, np.random.uniform(-1, 1, size=2), np.random.choice(5, size=3)


@pytest.mark.parametrize("backend", ["eager", pytest.param("kiln", marks=pytest.mark.slow)])
def test_random_draws_are_numpys(backend):
    be = Counting(backend)
    cf = kiln.compile(_random_program, backend=be, fullgraph=True)
    for _ in range(2):
        got = cf(A.copy())
        after_compiled = np.random.rand()
        want = _random_program(A.copy())
        after_eager = np.random.rand()
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
        assert after_compiled == after_eager  # the generator advanced alike
    assert len(be.graphs) == 1


def test_random_without_seed_follows_the_global_state():
    def g(x):
        return x + np.random.rand(3)

    cg = kiln.compile(g, backend="eager", fullgraph=True)
    np.random.seed(0)
    got = [cg(np.zeros(3)) for _ in range(3)]
    np.random.seed(0)
    want = [g(np.zeros(3)) for _ in range(3)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(got[0], got[1])


def test_random_seed_alone_still_runs():
    def h():
        np.random.seed(7)
        return np.random.rand(2)

    np.testing.assert_array_equal(kiln.compile(h, backend="eager", fullgraph=True)(), h())


@pytest.mark.parametrize("fn", [lambda x: x + np.random.rand(),         # a Python float
                                lambda x: np.random.normal(x),             # array arguments
                                lambda x: x + np.random.default_rng(0).random(3)],
                         ids=["no_size", "array_arg", "generator"])
def test_random_unsupported_breaks(fn):
    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend="eager", fullgraph=True)(np.zeros(3))


def test_numpy_arrays_stay_on_the_cpu_under_a_device_block():
    def f(x):
        return x * np.arange(5) + np.zeros(5), np.ones_like(x) + 1, x + 1.5

    want = f(A.copy())
    with torch.device("meta"):
        got = kiln.compile(f, backend="eager", fullgraph=True)(A.copy())
    same(got, want)


def test_trace_numpy_off_breaks_at_numpy():
    def f(x):
        y = np.sum(x, axis=0)
        return y * 2

    with kiln.config.patch(trace_numpy=False):
        with pytest.raises(kiln.Unsupported):
            kiln.compile(f, backend="eager", fullgraph=True)(A.copy())
        same(kiln.compile(f, backend="eager")(A.copy()), f(A.copy()))
    same(kiln.compile(f, backend="eager", fullgraph=True)(A.copy()), f(A.copy()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_numpy_in_a_cuda_device_block_runs_on_the_gpu():
    be = Counting("eager")
    X, Y = A.copy(), B.copy()
    with torch.device("cuda"):
        Z = kiln.compile(p_faq, backend=be, fullgraph=True)(X, Y)
    same(Z, p_faq(X, Y), rtol=1e-10)
    (gm,) = be.graphs
    assert any(n.target == "to" for n in gm.graph.nodes)  # the inputs moved to the GPU


@pytest.mark.parametrize("fn,bid", [(lambda x: np.polyfit(x[0], x[1], 1), "K0301"),
                                    (lambda x: np.flip(x), "K0303"),
                                    (lambda x: x.astype(np.int8) + 1000, "K0304"),
                                    (lambda x: x + np.random.rand(), "K0305"),
                                    (lambda x: x + torch.ones(5), "K0306")],
                         ids=["no_rule", "flip", "numpy_raises", "random", "mixed"])
def test_breaks_name_their_id(fn, bid):
    with pytest.raises(kiln.Unsupported) as info:
        kiln.compile(fn, backend="eager", fullgraph=True)(A.copy())
    assert info.value.break_id == bid, info.value
