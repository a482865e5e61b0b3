"""Divisions by size arguments in Triton kernels as multiply and shift
(``codegen/triton/exprs.py``, the prelude's ``kiln_udiv``): the arithmetic against ``//`` over
divisors and dividends at the edges, and kernels that use it against eager under the
Triton interpreter."""
import random

import pytest
import torch

from kiln.kernels.codegen.triton import exprs


def magic(d: int) -> tuple[int, int]:
    """(m, s) as the prelude's ``kiln_udiv`` computes them: s = ceil(log2 d),
    m = floor(2**32 * (2**s - d) / d) + 1 (Granlund and Montgomery's round-up method)."""
    s = (d - 1).bit_length()
    return (((1 << 32) * ((1 << s) - d)) // d + 1) & 0xFFFFFFFF, s


def _udiv(x: int, d: int) -> int:
    """``kiln_udiv`` in Python's integers, with its 32-bit wraps."""
    m, s = magic(d)
    hi = (x * m) >> 32
    return ((hi + x) & 0xFFFFFFFF) >> s


def _divisors():
    rng = random.Random(0)
    ds = list(range(2, 2050)) + [3 * 2 ** k for k in range(1, 29)] + [2 ** k for k in range(1, 31)]
    ds += [2 ** k - 1 for k in range(2, 32)] + [2 ** k + 1 for k in range(1, 31)]
    ds += [50257, 50264, 768 * 3072, 512 * 50257, 2 ** 31 - 1]
    ds += [rng.randrange(2, 2 ** 31) for _ in range(3000)]
    return ds


def test_magic_division_equals_floor_division():
    rng = random.Random(1)
    top = 2 ** 31 - 1
    for d in _divisors():
        xs = {0, 1, d - 1, d, d + 1, top, top - 1, top - d, 2 * d - 1, 2 * d}
        xs |= {q * d + r for q in (top // d, top // d - 1) for r in (0, d - 1) if 0 <= q * d + r <= top}
        xs |= {rng.randrange(0, top + 1) for _ in range(20)}
        for x in xs:
            if 0 <= x <= top:
                assert _udiv(x, d) == x // d, (x, d)


def test_magic_numbers_fit_32_bits():
    for d in _divisors():
        m, s = magic(d)
        assert 0 <= m < 2 ** 32 and 0 <= s <= 31


def test_small_or_unlifted_divisors_stay_plain(monkeypatch):
    from kiln import config
    lines = exprs.decompose(_vars(2), [4, 8], "xindex", bound=64)
    assert not any("kiln_udiv" in l for l in lines)      # 8 is a literal
    monkeypatch.setattr(config, "kernel_size_args", False)
    lines = exprs.decompose(_vars(2), [40, 3000], "xindex", bound=120000)
    assert not any("kiln_udiv" in l for l in lines)


def test_large_flat_index_keeps_plain_division():
    lines = exprs.decompose(_vars(2), [40, 3000], "xindex", bound=2 ** 31)
    assert not any("kiln_udiv" in l for l in lines)
    lines = exprs.decompose(_vars(2), [40, 3000], "xindex", bound=120064)
    assert any("kiln_udiv" in l for l in lines)


def _vars(n):
    from kiln.kernels import ir
    return ir.loop_vars(tuple(range(1, n + 1)))


@pytest.mark.parametrize("shape,perm", [((3, 50, 37), (0, 1, 2)), ((2, 17, 40, 33), (0, 2, 1, 3)),
                                        ((8, 1, 300), (0, 1, 2)), ((64, 129), (1, 0)),
                                        pytest.param((3, 2, 50257), (1, 0, 2), marks=pytest.mark.slow)])
def test_triton_kernel_with_divisions_matches_eager(shape, perm, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch.fx as fx

    from kiln import config
    from kiln.kernels import compile_aten_graph
    from kiln.kernels.codegen.triton import kernel as triton_kernel

    monkeypatch.setattr(config, "graph_cache", False)     # generate the kernels here
    # a static graph's divisors are literals; a symbolic graph's are size arguments,
    # as they are here
    monkeypatch.setattr(config, "triton_literal_divisors", False)
    texts = []
    decompose = triton_kernel.decompose

    def spied(*a, **k):
        lines = decompose(*a, **k)
        texts.extend(lines)
        return lines
    monkeypatch.setattr(triton_kernel, "decompose", spied)
    aten = torch.ops.aten

    def f(x):
        t = aten.permute.default(aten.sin.default(x), list(perm))
        return (aten.add.Tensor(aten.clone.default(t, memory_format=torch.contiguous_format),
                                1.0),)
    x = torch.randn(*shape)
    cg = compile_aten_graph(fx.symbolic_trace(f), [x], "triton")
    if list(perm) == sorted(perm):      # contiguous: walked as one flat index (dim_merge)
        assert not any("kiln_udiv" in t or "//" in t for t in texts), texts
    else:
        assert any("kiln_udiv" in t for t in texts), texts
    for _ in range(2):
        (got,), (want,) = cg(x), f(x)
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got, want)


def test_host_magic_numbers_are_the_kernels():
    """The magic numbers the host passes (``exprs.udiv_magic``) are the ones
    ``kiln_udiv`` computes in a kernel, which the arithmetic above checks."""
    for d in _divisors():
        assert exprs.udiv_magic(d) == magic(d), d


def test_divisions_by_size_arguments_read_host_magic():
    """A kernel dividing by size arguments reads each divisor's magic number and shift
    (passed after its sizes) instead of computing them per thread; nested divisions
    too; a literal divisor (the fused tier's) keeps the in-kernel helper."""
    from kiln.kernels.codegen import size_args
    from kiln.kernels.codegen.triton import source
    m = size_args._OPEN + "{}" + size_args._CLOSE
    text = ("def kernel0(a, XBLOCK: tl.constexpr):\n"
            f"    x0 = kiln_udiv(xindex, {m.format(3000)})\n"
            f"    x1 = (kiln_udiv(kiln_udiv(xindex, {m.format(40)}), {m.format(75)}) - 2)\n"
            "    x2 = kiln_udiv(xindex, 77)\n")
    src, values = source._take_sizes(text, "kernel0", [3000, 40, 75])
    assert "kiln_udiv(xindex, ks" not in src and "kiln_udiv(xindex, 77)" in src
    assert "x0 = kiln_udivm(xindex, ksm0, kss0)" in src
    assert "kiln_udivm(kiln_udivm(xindex, ksm1, kss1), ksm2, kss2)" in src
    assert values[:3] == [3000, 40, 75]
    for i, d in enumerate([3000, 75, 40]):       # in order of first use, outer first
        assert values[3 + 2 * i: 5 + 2 * i] == list(magic(d))
    for i, d in enumerate([3000, 40, 75]):
        k = values.index(magic(d)[0], 3)
        assert f"ksm{i} = tl.load(kiln_ks + {k})" in src
