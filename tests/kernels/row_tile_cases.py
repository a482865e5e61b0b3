"""Row-tiled pointwise kernels (``codegen/triton/row_tiles.py``) and scalar loads of
0-d inputs, through the Triton path under TRITON_INTERPRET=1, against eager.

Not collected by the normal run (no ``test_`` prefix): ``test_row_tiles.py`` runs this
file in a child pytest with the interpreter (and KILN_KERNEL_TARGET=triton) set before
triton is first imported.
"""
import os
import re

import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels.codegen.triton import heuristics, launcher
from kiln.kernels.compile import build

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_row_tiles.py)")

aten = torch.ops.aten
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _kernels(src: str) -> dict:
    """Each ``@triton.jit`` kernel of a module's text by name."""
    out = {}
    for m in re.finditer(r"^def (kernel\w+)\(.*?(?=^\S|\Z)", src, re.S | re.M):
        out[m.group(1)] = m.group(0)
    return out


def _row_kernels(src: str) -> list:
    return [k for k in _kernels(src).values() if "ROWS: tl.constexpr" in k]


#: the runtimes of compiled graphs, kept alive (a loaded module lives as long as one does)
_KEEP = []


def _check(fn, inputs, tol):
    gm = fx.symbolic_trace(fn)
    rt, art = build(gm, [a.clone() for a in inputs], "triton")
    _KEEP.append(rt)
    got = rt(*[a.clone() for a in inputs])
    want = gm(*[a.clone() for a in inputs])
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    return art["source"]


def _row_only_loads(kernel: str, bufs) -> list:
    return [l for l in kernel.splitlines() if "tl.load(" in l
            and any(f"tl.load({b} +" in l for b in bufs)]


def _centre(x, m, s, w):
    """(x - a row's mean) * its rstd * a per-column weight: LayerNorm's shape."""
    xf = aten._to_copy.default(x, dtype=torch.float32)
    y = aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(xf, aten.unsqueeze.default(m, -1)),
                                        aten.unsqueeze.default(s, -1)), w)
    return (aten._to_copy.default(y, dtype=x.dtype),)


SHAPES = [(3, 1032), (7, 1024), (2, 4104), (5, 1096)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_row_broadcast_matches_eager(shape, dtype):
    """Rows whose length is no multiple of the column block (the tail masked), rows a
    program (rows masked), lengths that fill their blocks, one row a program or several;
    each narrow dtype rounded once at the store as eager does. The kernel is
    row-tiled: the per-row mean and rstd are loaded without the column mask (one per
    row of the block), and nothing divides by the row length."""
    torch.manual_seed(0)
    r, c = shape
    x = torch.randn(r, c).to(DTYPES[dtype])
    m, s, w = torch.randn(r), torch.rand(r) + 0.5, torch.randn(c)
    tol = 1e-5 if dtype == "fp32" else 1e-2
    src = _check(_centre, [x, m, s, w], tol)
    rows = _row_kernels(src)
    assert len(rows) == 1, src
    k = rows[0]
    assert "//" not in k and "%" not in k and "kiln_udiv" not in k and "xindex" not in k, k
    loads = _row_only_loads(k, ("in1", "in2"))
    assert len(loads) == 2 and not any("colmask" in l or "xmask" in l for l in loads), k


def test_rows_of_a_multiple_of_8_are_declared_so():
    """A row of 1032 bf16 elements (a multiple of 8, not of 16: a padded vocabulary) is
    declared a multiple of 8, so its column blocks and their mask are 16-byte aligned
    on a GPU; the values are eager's."""
    torch.manual_seed(0)
    x, m, s, w = torch.randn(3, 1032).bfloat16(), torch.randn(3), torch.rand(3) + 0.5, \
        torch.randn(1032)
    src = _check(_centre, [x, m, s, w], 1e-2)
    k = _row_kernels(src)[0]
    declared = r"ks\d+ = tl\.multiple_of\(tl\.load\(kiln_ks \+ \d+\)\.to\(tl\.int32\), 8\)"
    assert re.search(declared, k), k


def test_row_tiles_off_keeps_the_flat_form(monkeypatch):
    """KILN_TRITON_ROW_TILES=0: the same graph, one flat kernel dividing its flat index
    by the row length (what the row form removes), the same values."""
    monkeypatch.setattr(config, "triton_row_tiles", False)
    torch.manual_seed(0)
    x, m, s, w = torch.randn(3, 1032), torch.randn(3), torch.rand(3) + 0.5, torch.randn(1032)
    src = _check(_centre, [x, m, s, w], 1e-5)
    assert not _row_kernels(src) and ("kiln_udivm(xindex" in src or "(xindex // " in src), src


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_unaligned_rows_keep_the_flat_form(dtype):
    """Rows of 1500 bf16 (or 1100 fp32, a multiple of 4 but not declared one) start
    off 16-byte boundaries: as row tiles their columns would be narrow accesses, so the
    flat form stays (its contiguous flat index keeps vectors)."""
    c = 1500 if dtype == "bf16" else 1100
    torch.manual_seed(0)
    x, m, s, w = torch.randn(3, c).to(DTYPES[dtype]), torch.randn(3), torch.rand(3) + 0.5, \
        torch.randn(c)
    src = _check(_centre, [x, m, s, w], 1e-2)
    assert not _row_kernels(src), src


def test_non_contiguous_input_and_outer_dims():
    """Rows over two dims ([4, 3, 1104]: the row index split per row, not per element)
    of a sliced input, a transposed input (strided columns) into a contiguous result,
    the per-row value indexed by both row dims."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 1120)[:, :, 8:1112]
    y = torch.randn(1104, 3, 4).permute(2, 1, 0)
    m = torch.randn(4, 3)

    def f(x, y, m):
        e = aten.exp.default(aten.sub.Tensor(x, aten.unsqueeze.default(m, -1)))
        return (aten.clone.default(aten.mul.Tensor(e, y), memory_format=torch.contiguous_format),)
    src = _check(f, [x, y, m], 1e-5)
    rows = _row_kernels(src)
    assert len(rows) == 1 and "cols //" not in rows[0] and "udiv(cols" not in rows[0] and "udivm(cols" not in rows[0], src
    assert "kiln_udivm(rows" in rows[0] or "rows //" in rows[0], rows[0]


def test_scalar_rows_over_two_dims():
    """Long rows ([2, 20, 2048]: one row a program) over two row dims: the scalar row
    index split into both (a division a program), the per-row value a scalar load."""
    torch.manual_seed(0)
    x, m = torch.randn(2, 20, 2048).bfloat16(), torch.randn(2, 20)

    def f(x, m):
        return (aten.mul.Tensor(x, aten.unsqueeze.default(m, -1)),)
    src = _check(f, [x, m], 1e-2)
    k = _row_kernels(src)[0]
    assert "rows = tl.program_id(0)\n" in k and "(rows // 20)" in k, k     # a literal divisor
    assert "udiv(cols" not in k and "udivm(cols" not in k and "cols //" not in k, k


def test_single_row_reads_scalars():
    """R=1: one row is no row form (nothing varies per row), and its per-row value, a
    constant index, is one unmasked scalar load."""
    torch.manual_seed(0)
    x, m, s, w = torch.randn(1, 2000), torch.randn(1), torch.rand(1) + 0.5, torch.randn(2000)
    src = _check(_centre, [x, m, s, w], 1e-5)
    assert not _row_kernels(src)
    for b in ("in1", "in2"):
        assert re.search(rf"tl\.load\({b} \+ \(0\)\)", src), src


def test_zero_dim_input_is_a_scalar_load():
    """A 0-d tensor read by every element of a flat kernel: one load at its address, no
    mask, no per-lane pointer (``+ xzero``)."""
    torch.manual_seed(0)
    x, a = torch.randn(3000), torch.tensor(1.5)

    def f(x, a):
        return (aten.add.Tensor(aten.mul.Tensor(x, a), 1.0),)
    src = _check(f, [x, a], 1e-6)
    assert re.search(r"tl\.load\(in1 \+ \(0\)\)", src), src
    assert "in1 + (0) + xzero" not in src


def test_gathered_rows_with_row_weights():
    """A gather (rows picked by an index, ``index_select``) beside a per-row weight: the
    gathered load takes the full mask, the weight the row's."""
    torch.manual_seed(0)
    table, idx, wt = torch.randn(10, 1304), torch.tensor([3, 0, 9, 3, 7]), torch.randn(5)

    def f(t, i, w):
        return (aten.mul.Tensor(aten.index_select.default(t, 0, i),
                                aten.unsqueeze.default(w, -1)),)
    src = _check(f, [table, idx, wt], 1e-6)
    assert _row_kernels(src), src


def test_sizes_share_one_module():
    """Row lengths of one size class (multiples of 8 but not 16, the same blocks): one
    module text, loaded once, each launch with its own sizes and grid."""
    torch.manual_seed(0)
    srcs = []
    before = None
    for c in (1512, 1528):
        x, m, s, w = torch.randn(4, c), torch.randn(4), torch.rand(4) + 0.5, torch.randn(c)
        srcs.append(_check(_centre, [x, m, s, w], 1e-5))
        if before is None:
            before = launcher.stats["loaded"]
    assert srcs[0] == srcs[1] and launcher.stats["loaded"] == before
    assert "colmask = cols < ks" in _row_kernels(srcs[0])[0]


def test_cross_entropy_forward_backward():
    """The loss gradient of a cross-entropy over a tiny vocabulary (1504 > the row
    threshold) — fp32 logits, and bf16 logits of an autocast product as GPT-2's —
    compiled by kiln against eager (loss, the weight's gradient); under autocast the
    backward's gradient kernel is row-tiled (a row's max, sum and target read once per
    row; in fp32 it is fused into the row sum's kernel)."""
    import kiln
    from .plan_spy import record_plans
    mp = pytest.MonkeyPatch()
    try:
        plans = record_plans(mp)
        for autocast, tol in ((False, 1e-5), (True, 2e-2)):
            torch.manual_seed(0)
            h, w = torch.randn(2, 3, 32), torch.randn(32, 1504) / 4
            target = torch.randint(0, 1504, (2, 3))
            target[1, 1] = -100                   # an ignored row

            def f(h, w, t):      # as transformers' causal-LM loss: float logits, flattened
                with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                    logits = (h @ w).float()
                    return torch.nn.functional.cross_entropy(logits.view(-1, 1504), t.view(-1))
            a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
            got = kiln.compile(f)(h, a, target)
            want = f(h, b, target)
            got.backward()
            want.backward()
            assert got.dtype == want.dtype and a.grad.dtype == b.grad.dtype
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
            torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol)
    finally:
        mp.undo()
    srcs = [p.source for p in plans if getattr(p, "source", None)]
    assert any(_row_kernels(s) for s in srcs), srcs


def test_block_plan():
    """Column blocks halve while a row's tail would waste more than its share; rows per
    program keep the block's size and never exceed the rows there are; a row of more
    blocks than grid axis 1 holds is no row form."""
    p = heuristics.plan_row_tiles
    assert (p(100, 50264, 2048).cblock, p(100, 50264, 2048).rows) == (2048, 1)
    assert p(100, 1025, 1024).cblock == 128 and p(100, 1025, 1024).rows == 8
    assert p(3, 1025, 1024).rows == 4
    assert p(100, 1536, 1024).cblock == 512
    assert p(1, 1024 * 70000, 1024) is None


def _padded_rows(x, m):
    """Per-row values padded along the row (a load of ``m[row]`` under a column mask of
    its own) subtracted from the rows: the padded vocabulary of a loss gradient."""
    aten = torch.ops.aten
    mv = aten.expand.default(aten.unsqueeze.default(m, 1), [x.shape[0], x.shape[1] - 7])
    return (aten.sub.Tensor(x, aten.constant_pad_nd.default(mv, [0, 7])),)


@pytest.mark.parametrize("cols", [20008, 1032])
def test_row_values_under_a_mask_of_their_own(cols):
    """The padded columns read 0, the others the row's value (the load is a block under
    its own mask: ``test_triton_compile`` compiles it for sm_90)."""
    torch.manual_seed(0)
    src = _check(_padded_rows, [torch.randn(6, cols), torch.randn(6)], 1e-6)
    assert _row_kernels(src), src


def _padded_loss_grad(x, s):
    """A loss gradient's shape: ``exp(x - log(row sum))`` over the real columns, padded
    with zeros to the padded vocabulary (``where(col < C, ..., 0)`` reading every input
    under that mask)."""
    aten = torch.ops.aten
    g = aten.exp.default(aten.sub.Tensor(x, aten.unsqueeze.default(aten.log.default(s), 1)))
    return (aten.constant_pad_nd.default(g, [0, 8]),)


@pytest.mark.parametrize("cols", [20000, 1024])
def test_row_values_under_the_padding_mask_load_once_a_row(cols):
    """The row sum is read unmasked (``codegen/triton/unmask.py``): its address is the
    row's own on every lane, and the padded lanes' values are thrown away by the
    ``where``; with one row a program it is a scalar load and its log a scalar. The
    logits keep their mask (their address moves along the row)."""
    torch.manual_seed(0)
    x, s = torch.randn(6, cols), torch.rand(6) + 0.5
    src = _check(_padded_loss_grad, [x, s], 1e-5)
    (k,) = _row_kernels(src)
    loads = [l for l in k.splitlines() if "tl.load(" in l]
    row_loads = [l for l in loads if "in1 +" in l]
    assert row_loads and all("xzero" not in l and "mask=t" not in l for l in row_loads), k
    assert any("in0 +" in l and "mask=" in l for l in loads), k
