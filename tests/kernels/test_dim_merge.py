"""Contiguous dims of a pointwise Triton kernel walked as one flat index
(kernels/codegen/triton/dim_merge.py): no division where every tensor is laid out alike,
divisions kept where one is not (a broadcast along an inner dim, a transposed read, a
strided slice), values equal to eager's in every case (Triton interpreter)."""
import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import compile_aten_graph
from kiln.kernels.codegen import dim_merge
from kiln.kernels.codegen.triton import kernel as triton_kernel
from kiln.kernels.ir import Affine, Const, Load, Op

aten = torch.ops.aten


def _a(**coefs) -> Affine:
    return Affine(tuple(sorted(coefs.items())), 0)


def test_runs_follow_the_coefficients():
    sizes = (8, 512, 64)
    flat = _a(x0=512 * 64, x1=64, x2=1)
    assert dim_merge.runs([flat], sizes, [0, 1, 2]) == [[0, 1, 2]]
    bias = _a(x2=1)                       # broadcast along the outer dims: they merge
    assert dim_merge.runs([flat, bias], sizes, [0, 1, 2]) == [[0, 1], [2]]
    rows = _a(x0=512, x1=1)               # a per-row value: the inner dim stays apart
    assert dim_merge.runs([flat, rows], sizes, [0, 1, 2]) == [[0, 1], [2]]
    sliced = _a(x0=2 * 512 * 64, x1=64, x2=1)        # x[::2] of a [16, 512, 64]
    assert dim_merge.runs([flat, sliced], sizes, [0, 1, 2]) == [[0], [1, 2]]
    assert dim_merge.runs([_a(x0=64, x2=1)], (8, 1, 64), [0, 1, 2]) == [[0, 2]]


@pytest.fixture
def texts(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(config, "graph_cache", False)
    lines = []
    decompose = triton_kernel.decompose

    def spied(*a, **k):
        out = decompose(*a, **k)
        lines.extend(out)
        return out
    monkeypatch.setattr(triton_kernel, "decompose", spied)
    return lines


def _check(f, inputs, texts, divisions: bool):
    cg = compile_aten_graph(fx.symbolic_trace(f), inputs, "triton")
    has_div = any("kiln_udiv" in t or "//" in t for t in texts)
    assert has_div == divisions, texts
    for _ in range(2):
        got, want = cg(*inputs), f(*inputs)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
            torch.testing.assert_close(g, w)


def test_contiguous_gelu_backward_is_one_flat_index(texts):
    def f(g, x):
        t = aten.tanh.default(aten.mul.Tensor(x, 0.79788))
        return (aten.mul.Tensor(aten.mul.Tensor(g, aten.add.Tensor(t, 1.0)), 0.5),)
    g, x = torch.randn(4, 33, 96), torch.randn(4, 33, 96)
    _check(f, [g, x], texts, divisions=False)
    assert texts == ["x2 = xindex"]


def test_bias_broadcast_keeps_the_inner_division(texts):
    def f(x, b):
        return (aten.relu.default(aten.add.Tensor(x, b)),)
    _check(f, [torch.randn(4, 33, 96), torch.randn(96)], texts, divisions=True)
    assert len([t for t in texts if "=" in t]) == 2       # [4*33] rows, [96] columns


def test_per_row_value_keeps_the_inner_division(texts):
    def f(x, m):
        return (aten.sub.Tensor(x, m),)
    _check(f, [torch.randn(4, 33, 96), torch.randn(4, 33, 1)], texts, divisions=True)


def test_transposed_read_keeps_its_divisions(texts):
    def f(x):
        t = aten.permute.default(x, [0, 2, 1])
        return (aten.add.Tensor(aten.clone.default(t, memory_format=torch.contiguous_format),
                                1.0),)
    _check(f, [torch.randn(4, 33, 96)], texts, divisions=True)


def test_strided_input_and_arange_values(texts):
    def f(x):
        s = aten.slice.Tensor(x, 2, 0, 96, 2)            # every other column
        i = aten.arange.start(0, 48, dtype=torch.float32)
        return (aten.add.Tensor(aten.mul.Tensor(s, 2.0), i),)
    _check(f, [torch.randn(4, 33, 96)], texts, divisions=True)


def test_channels_last_merges_height_and_width(texts):
    def f(x, y):
        return (aten.mul.Tensor(aten.exp.default(x), y),)
    x = torch.randn(2, 24, 7, 9).to(memory_format=torch.channels_last)
    y = torch.randn(2, 24, 7, 9).to(memory_format=torch.channels_last)
    _check(f, [x, y], texts, divisions=False)


def test_size_one_and_expanded_inputs(texts):
    def f(x, y):
        return (aten.add.Tensor(x, aten.expand.default(y, [5, 1, 40])),)
    _check(f, [torch.randn(5, 1, 40), torch.randn(1, 1, 40)], texts, divisions=True)

    texts.clear()

    def h(x):
        return (aten.cos.default(x),)
    _check(h, [torch.randn(5, 1, 40)], texts, divisions=False)


# --- the C++ loop nest (dim_merge.merged_pointwise) ----------------------------------
def _cpp(f, inputs):
    cg = compile_aten_graph(fx.symbolic_trace(f), inputs, "cpp")
    for _ in range(2):
        for g, w in zip(cg(*[a.clone() for a in inputs]), f(*inputs)):
            assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
            torch.testing.assert_close(g, w)
    return str(cg.artefacts["source"])


def _loops(src: str) -> int:
    body = src.split("static void kernel0")[1].split("\n}\n")[0]
    return body.count("for (int64_t x")


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_cpp_contiguous_map_is_one_loop(monkeypatch, layout):
    """A [8, 64, 7, 7] map: one vectorised loop of 25088, not an ``omp simd`` loop of 7
    (channels-last too: walked in memory order)."""
    monkeypatch.setattr(config, "graph_cache", False)

    def f(x, y):
        return (aten.mul.Tensor(aten.relu.default(x), y),)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x, y = (torch.randn(8, 64, 7, 7).to(memory_format=fmt) for _ in range(2))
    assert _loops(_cpp(f, [x, y])) == 1


def test_cpp_keeps_dims_a_read_tells_apart(monkeypatch):
    monkeypatch.setattr(config, "graph_cache", False)

    def bias(x, b):
        return (aten.add.Tensor(x, b),)
    assert _loops(_cpp(bias, [torch.randn(4, 33, 96), torch.randn(96)])) == 2

    def sliced(x):
        return (aten.mul.Tensor(aten.slice.Tensor(x, 0, 0, 8, 2), 3.0),)
    assert _loops(_cpp(sliced, [torch.randn(8, 5, 40)])) == 2

    def rows(x, m):
        return (aten.sub.Tensor(x, m),)
    assert _loops(_cpp(rows, [torch.randn(3, 5, 40), torch.randn(3, 5, 1)])) == 2

    def expanded(x, y):
        return (aten.add.Tensor(x, aten.expand.default(y, [5, 1, 40])),)
    _cpp(expanded, [torch.randn(5, 1, 40), torch.randn(1, 1, 40)])


# --- loads under a where's own mask (codegen/triton/unmask.py) ------------------------
def _pads_and_cats():
    def pad_cols(x, m):        # per-row values padded along the row: unmasked
        e = aten.expand.default(aten.unsqueeze.default(m, 1), [x.shape[0], x.shape[1]])
        return (aten.constant_pad_nd.default(aten.mul.Tensor(x, e), [0, 5]),)

    def pad_rows(x, m):        # padded along the rows: the row values keep their mask
        e = aten.expand.default(aten.unsqueeze.default(m, 1), [x.shape[0], x.shape[1]])
        return (aten.constant_pad_nd.default(aten.add.Tensor(x, e), [0, 0, 2, 3]),)

    def crop(x, m):            # negative padding: a crop, no mask at all
        return (aten.constant_pad_nd.default(x, [-1, 0]),)

    def cat_cols(x, m):        # a row value beside the rows, then the rows again
        e = aten.expand.default(aten.unsqueeze.default(aten.log.default(m), 1),
                                [x.shape[0], 3])
        return (aten.cat.default([e, x, aten.neg.default(x)], 1),)

    def empty_source(x, m):    # the padded tensor has no columns: every lane is fill
        z = aten.slice.Tensor(x, 1, 0, 0)
        return (aten.constant_pad_nd.default(z, [0, 4], 1.5),)
    return [pad_cols, pad_rows, crop, cat_cols, empty_source]


@pytest.mark.parametrize("fn", _pads_and_cats(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", [(5, 13), (1, 40), (7, 1)])
def test_masked_reads_match_eager(fn, shape, texts):
    x, m = torch.randn(*shape), torch.rand(shape[0]) + 0.5
    cg = compile_aten_graph(fx.symbolic_trace(fn), [x, m], "triton")
    for _ in range(2):
        for g, w in zip(cg(x, m), fn(x, m)):
            assert g.shape == w.shape and g.stride() == w.stride()
            torch.testing.assert_close(g, w)


def test_unmask_keeps_masks_it_cannot_drop():
    from kiln.kernels.codegen.triton.unmask import unmask
    from kiln.kernels.ir import Index
    x0, x1 = Affine((("x0", 1),), 0), Affine((("x1", 1),), 0)
    i64 = torch.int64
    cond = Op("lt", (Index(x1, i64), Const(10, i64)), torch.bool)
    row = Load("m", x0, torch.float32, cond)                # avoids x1: unmasked
    col = Load("x", Affine((("x0", 10), ("x1", 1)), 0), torch.float32, cond)  # keeps it
    other = Load("m", x0, torch.float32, Op("lt", (Index(x0, i64), Const(3, i64)),
                                            torch.bool))  # another mask: kept
    e = Op("where", (cond, Op("add", (Op("add", (row, col), torch.float32), other),
                              torch.float32), Const(0.0, torch.float32)), torch.float32)
    out = unmask(e, (4, 16))
    loads = {(ld.buf, ld.mask is None) for ld in _loads(out)}
    assert loads == {("m", True), ("x", False), ("m", False)}
    bare = Op("add", (row, col), torch.float32)              # no where: nothing changes
    assert unmask(bare, (4, 16)) is bare
    # no lane meets the mask (padding an empty tensor: x1 >= 10 over 10 columns, or a
    # constant false): the address need not be in bounds, the mask stays
    never = Op("ge", (Index(x1, i64), Const(10, i64)), torch.bool)
    off = Load("m", Affine((("x0", 1),), -1), torch.float32, never)
    e2 = Op("where", (never, off, Const(0.0, torch.float32)), torch.float32)
    assert unmask(e2, (4, 10)) is e2
    const = Op("and", (Op("ge", (Index(Affine(), i64), Const(1, i64)), torch.bool),
                       Op("lt", (Index(Affine(), i64), Const(1, i64)), torch.bool)), torch.bool)
    e3 = Op("where", (const, Load("m", Affine((), -1), torch.float32, const),
                      Const(0.0, torch.float32)), torch.float32)
    assert unmask(e3, (4, 10)) is e3
    assert unmask(e2, (4, 11)) is not e2                    # column 10 exists: it goes


def _loads(e):
    from kiln.kernels import ir
    return [x for x in ir.walk(e) if isinstance(x, Load)]


def _cpp_loops_of(src: str, kernel: int) -> int:
    body = src.split(f"static void kernel{kernel}(")[1].split("\n}\n")[0]
    return body.count("for (int64_t x")


def test_cpp_reductions_merge_kept_and_reduced_dims_apart(monkeypatch):
    """A spatial mean over [4, 16, 7, 7]: kept [64], reduced [49] (two loops, not
    four); the per-channel sum keeps the batch apart from the map. Values (argmax's
    flat position included, and a transposed input) against eager."""
    monkeypatch.setattr(config, "graph_cache", False)

    def f(x):
        return (aten.mean.dim(x, [2, 3]), aten.sum.dim_IntList(x, [0, 2, 3], True),
                aten.argmax.default(x), aten.amax.default(x, [3]))
    src = _cpp(f, [torch.randn(4, 16, 7, 7)])
    assert _cpp_loops_of(src, 0) == 2
    _cpp(f, [torch.randn(4, 7, 7, 16).permute(0, 3, 1, 2)])

    def col(x):                                    # a column sum: kept [5 * 40]
        vm = aten.var_mean.correction(x, [1, 2])
        return (aten.sum.dim_IntList(x, [0]), vm[0], vm[1])
    _cpp(col, [torch.randn(8, 5, 40)])
    _cpp(col, [torch.randn(8, 1, 40)])
