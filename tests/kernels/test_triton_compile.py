"""Every generated Triton kernel compiles for an H100 (sm_90), checked on the CPU.

Triton's interpreter is lenient: it runs bf16 math that the compiler rejects (``tl.erf``
has no bf16 version) and does not check that a loop-carried accumulator keeps its dtype.
Triton's own compiler runs without a GPU, so these tests compile each kernel of the
generated module to a cubin for ``cuda:90``.
"""
import importlib.util
import re
import os
import sys

import pytest
import torch
import torch.fx as fx

from kiln.kernels.runtime import cuda_launch
from kiln.kernels.toolchain import triton_build as triton_compile
from kiln.kernels.codegen.triton import source as triton_gen
from kiln.kernels.lowering import GraphLowering
from kiln.kernels.scheduler import schedule

aten = torch.ops.aten

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles for a GPU: needs the real compiler, not the interpreter",
                allow_module_level=True)

def generated(fn, inputs):
    gm = fx.symbolic_trace(fn)
    lo = GraphLowering(gm, inputs, "triton").run()
    outs = {b.name for b in lo.buffers}
    sched = schedule(lo.buffers, outs)
    return triton_gen.generate_detailed(sched, lo.buffers, interpret=False)


@pytest.fixture(autouse=True)
def _h100(monkeypatch):
    """Compile for an H100 (sm_90) whatever this machine has."""
    from triton.backends.compiler import GPUTarget
    monkeypatch.setattr(triton_compile, "target", lambda: GPUTarget("cuda", 90, 32))


def compile_all(source, kinfo, tmp_path):
    """Each kernel compiled as kiln compiles it at run time (``triton_compile``:
    pointers 16-byte aligned, as the caching allocator gives them), and each one a
    kernel ``cuda_launch`` can launch (its parameters: the pointers, and at most two
    scratch pointers)."""
    path = tmp_path / f"mod{abs(hash(source))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    compiled = {}
    for name, params, dtypes, consts, nw, _ in kinfo:
        k = getattr(mod, name)
        k = getattr(k, "fn", k) if not hasattr(k, "arg_names") or hasattr(k, "configs") else k
        ck = triton_compile.compile_kernel(k, dtypes, consts, {"num_warps": nw})
        assert cuda_launch._plain(ck.metadata), ck.metadata
        assert 0 <= cuda_launch.param_count(ck.asm["ptx"], ck.name) - len(params) <= 2
        compiled[name] = ck
    return compiled


def _gelu_mlp(x, w1, b1, w2, b2):
    h = aten.addmm.default(b1, x, aten.t.default(w1))
    h = aten.gelu.default(h)
    return (aten.addmm.default(b2, h, aten.t.default(w2)),)


def _attention_softmax(s, x, w, b):
    # vit_b_16 in bf16: softmax over long rows (a loop with a carried accumulator) and
    # LayerNorm, whose exp/rsqrt have no bf16 versions
    return (aten._softmax.default(s, -1, False),
            aten.native_layer_norm.default(x, [768], w, b, 1e-6)[0],
            aten.sum.dim_IntList(x, [0]), aten.amax.default(s, [-1]),
            aten.argmax.default(s, -1), aten.mean.dim(x, [-1]))


def _toy(a, b):
    x = aten.div.Tensor(a, aten.add.Tensor(aten.abs.default(a), 1))
    return (x, aten.lt.Scalar(aten.sum.default(b), 0))


def _column(x):
    return (aten.sum.dim_IntList(x, [0]), aten.sum.dim_IntList(x, [1]),
            aten.amax.default(x, [1]), aten.any.dim(aten.gt.Scalar(x, 2.0), 0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gelu_mlp_kernels_compile(dtype, tmp_path):
    args = [torch.randn(8, 16), torch.randn(32, 16), torch.randn(32), torch.randn(16, 32),
            torch.randn(16)]
    source, _, kinfo = generated(_gelu_mlp, [a.to(dtype) for a in args])
    assert "tl.erf" in source
    assert compile_all(source, kinfo, tmp_path)


def _tanh_gelu(x):
    t = aten.tanh.default(aten.mul.Tensor(aten.add.Tensor(x, aten.mul.Tensor(
        aten.pow.Tensor_Scalar(x, 3), 0.044715)), 0.7978845608028654))
    return (aten.mul.Tensor(aten.mul.Tensor(x, 0.5), aten.add.Tensor(t, 1.0)),)


def test_tanh_gelu_is_float32_libdevice_over_a_flat_index(tmp_path):
    """GPT-2's tanh GELU over a contiguous [8, 64, 3072] bf16 activation: tanh is
    libdevice's float32 one (no float64 arithmetic in the PTX: the float64 emulation
    made the kernel compute-bound), and the dims are one flat index (no division)."""
    x = torch.randn(8, 64, 3072).to(torch.bfloat16)
    source, _, kinfo = generated(_tanh_gelu, [x])
    body = source.split("def kernel0")[1]
    assert "kiln_tanh(" in source and "kiln_udiv" not in body and "//" not in body
    (ck,) = compile_all(source, kinfo, tmp_path).values()
    body = ck.asm["ptx"].split(".entry")[1]
    assert ".f64" not in body, [l for l in body.splitlines() if ".f64" in l][:5]
    assert "ld.global.v4" in body or "ld.global.nc.v4" in body


def test_bf16_reductions_compile_with_fp32_accumulators(tmp_path):
    args = [torch.randn(4, 12000), torch.randn(3, 7, 768), torch.randn(768), torch.randn(768)]
    source, _, kinfo = generated(_attention_softmax, [a.bfloat16() for a in args])
    # the accumulator is declared float32 and every update is converted back to it
    accs = [l for l in source.splitlines() if "acc_" in l and "tl.full([" in l]
    assert accs and all("tl.float32" in l or "tl.int64" in l or "tl.int8" in l for l in accs)
    assert "for roffset" in source          # the 12000-wide rows loop
    for line in source.splitlines():
        if "tl.erf(" in line or "tl.exp(" in line:
            assert "bfloat16" not in line
    assert compile_all(source, kinfo, tmp_path)


def test_split_and_column_reductions_compile(tmp_path):
    source, _, kinfo = generated(_toy, [torch.randn(1 << 20), torch.randn(1 << 20)])
    assert "_split" in source
    compile_all(source, kinfo, tmp_path)
    source, _, kinfo = generated(_column, [torch.randn(64, 32, 1024)])
    compile_all(source, kinfo, tmp_path)


def test_persistent_softmax_loads_its_row_once(tmp_path):
    source, _, kinfo = generated(lambda x: (aten._softmax.default(x, -1, False),),
                                 [torch.randn(64, 4096)])
    assert "for roffset" not in source
    assert source.count("tl.load(") - source.count("tl.load(kiln_ks") == 1   # sizes aside
    ck = compile_all(source, kinfo, tmp_path)
    ptx = next(iter(ck.values())).asm["ptx"]
    assert "ld.global.v4" in ptx            # 16-byte loads


def _stem(x, mean, w):
    y = aten.relu.default(aten.mul.Tensor(aten.sub.Tensor(x, mean), w))
    return (aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0],
            aten.add.Tensor(x, 1))


def test_heavy_pointwise_kernels_get_more_warps(tmp_path):
    """A pool over a fused normalisation has many ops: 8 warps (4 elements a thread),
    which halves its compile time; a light kernel keeps 4."""
    args = [torch.randn(2, 8, 32, 32, dtype=torch.bfloat16), torch.randn(8, 1, 1),
            torch.randn(8, 1, 1)]
    source, _, kinfo = generated(_stem, args)
    warps = sorted(k[4] for k in kinfo)
    assert warps == [4, 8], kinfo
    compile_all(source, kinfo, tmp_path)


@pytest.mark.parametrize("dtype, xblock", [(torch.bfloat16, 2048), (torch.float16, 2048),
                                           (torch.float32, 1024), (torch.float64, 1024)])
def test_large_pointwise_kernels_read_32_bytes_a_thread(dtype, xblock, tmp_path):
    """A large pointwise kernel gives each of its 128 threads 32 bytes of its widest
    tensor (two 16-byte loads): 16 bf16 elements, 8 fp32 ones (H100: a bf16 GELU 89% ->
    96% of copy bandwidth; fp32 stays at 8, which measured best)."""
    x = torch.randn(1024, 1024).to(dtype)
    source, _, kinfo = generated(lambda t: (aten.gelu.default(t),), [x])
    (k,) = kinfo
    assert k[3]["XBLOCK"] == xblock and k[4] == 4, kinfo
    ptx = next(iter(compile_all(source, kinfo, tmp_path).values())).asm["ptx"]
    if dtype.itemsize <= 4:
        loads = re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx)
        assert len(loads) == 2, loads           # 2 x 16 bytes a thread


def test_pointwise_block_follows_the_widest_tensor():
    """Bytes, not elements: a bool mask over bf16 values is sized by the bf16; small
    kernels keep 1024 (more programs than multiprocessors)."""
    big = torch.randn(1 << 21)
    cases = [((lambda m: (aten.logical_not.default(m),)), [big > 0], 4096),
             ((lambda m, v: (aten.where.ScalarOther(m, v, 0.0),)), [big > 0, big.bfloat16()], 2048),
             ((lambda v: (aten._to_copy.default(v, dtype=torch.float32),)), [big.bfloat16()], 1024),
             ((lambda v: (aten.gelu.default(v),)), [torch.randn(1000).bfloat16()], 1024)]
    for fn, args, xblock in cases:
        _, _, kinfo = generated(fn, args)
        assert [k[3]["XBLOCK"] for k in kinfo] == [xblock], (args, kinfo)


def _ln_wgrad(a, b):
    return (aten.sum.dim_IntList(aten.mul.Tensor(a, b), [0, 1]), aten.sum.dim_IntList(a, [0, 1]))


def test_split_column_reduction_loads_16_byte_vectors(tmp_path):
    """LayerNorm's weight/bias gradients over [8, 512, 768] (GPT-2's backward): a split
    column reduction whose [RBLOCK, XBLOCK] blocks load 16-byte vectors along the
    contiguous outputs, in both stages (the partials laid [split, outputs])."""
    source, _, kinfo = generated(_ln_wgrad, [torch.randn(8, 512, 768), torch.randn(8, 512, 768)])
    assert [k[0] for k in kinfo] == ["kernel0_split", "kernel0"], kinfo
    for name, ck in compile_all(source, kinfo, tmp_path).items():
        ptx = ck.asm["ptx"]
        assert re.search(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx), name
        assert "sizePerThread = [1, 4]" in ck.asm["ttgir"], name     # 4 fp32 along x


def _loss_grad(logits, target, m, lse, g):
    """A cross-entropy's logit gradient over [rows, a padded vocabulary]: per-row max,
    sum and target, a 0-d scale, bf16 logits in and out."""
    x = aten._to_copy.default(logits, dtype=torch.float32)
    p = aten.exp.default(aten.sub.Tensor(aten.sub.Tensor(x, aten.unsqueeze.default(m, 1)),
                                         aten.log.default(aten.unsqueeze.default(lse, 1))))
    keep = aten._to_copy.default(aten.unsqueeze.default(aten.ne.Scalar(target, -100), 1),
                                 dtype=torch.float32)
    return (aten._to_copy.default(aten.mul.Tensor(aten.mul.Tensor(p, keep), g),
                                  dtype=torch.bfloat16),)


def test_row_tiled_loss_gradient_is_vector_and_division_free(tmp_path):
    """GPT-2's loss gradient (rows of 50264 bf16 logits, a multiple of 8: 16-byte rows)
    row-tiled for sm_90: the logits loaded and the gradient stored as 16-byte vectors,
    each per-row value and the 0-d scale one scalar load a program, no division."""
    r, c = 64, 50264
    args = [torch.randn(r, c).bfloat16(), torch.randint(0, c, (r,)), torch.randn(r),
            torch.rand(r) + 1, torch.tensor(0.5)]
    source, _, kinfo = generated(_loss_grad, args)
    rows = [k for k in kinfo if "ROWS" in k[3]]
    assert len(rows) == 1, kinfo
    ck = compile_all(source, [rows[0]], tmp_path)[rows[0][0]]
    ptx = ck.asm["ptx"]
    assert re.search(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx)
    assert re.search(r"st\.global(?:\.\w+)*\.v4\.b32", ptx)
    assert not re.search(r"ld\.global(?:\.\w+)*\.b16", ptx)
    assert not re.search(r"\b(div|rem)\.|mul\.hi", ptx)
    text = source[source.index(f"def {rows[0][0]}("):].split("\n\n\n")[0]
    sizes = len(re.findall(r"ks\d+ = tl", text))
    scalars = re.findall(r"^\s*ld\.global\.b(?:32|64) ", ptx, re.M)
    assert len(scalars) <= 4 + sizes, scalars     # target, max, sum, scale: once each
    # rows over [batch, sequence]: the scalar row index divided once a program
    args3 = [args[0].view(4, 16, c), args[1].view(4, 16), args[2].view(4, 16),
             args[3].view(4, 16), args[4]]

    def grad3(logits, target, m, lse, g):
        x = aten._to_copy.default(logits, dtype=torch.float32)
        p = aten.exp.default(aten.sub.Tensor(x, aten.unsqueeze.default(m, 2)))
        return (aten._to_copy.default(aten.div.Tensor(aten.mul.Tensor(p, g),
                                                      aten.unsqueeze.default(lse, 2)),
                                      dtype=torch.bfloat16),)
    source, _, kinfo = generated(grad3, args3)
    rows = [k for k in kinfo if "ROWS" in k[3]]
    assert len(rows) == 1, kinfo
    ptx = compile_all(source, rows, tmp_path)[rows[0][0]].asm["ptx"]
    assert re.search(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx) and "mul.hi" not in ptx


def _scaled(x, a):
    return (aten.sum.dim_IntList(aten.mul.Tensor(x, a), [1]),
            aten.amax.default(aten.add.Tensor(x, a), [1]),
            aten.argmax.default(aten.mul.Tensor(x, a), 1),
            aten.mul.Tensor(aten.sum.dim_IntList(x, [0]), a))


def test_zero_dim_inputs_are_scalar_loads_and_compile(tmp_path):
    """A 0-d tensor read in looped and persistent reductions and a pointwise kernel: one
    unmasked scalar load each (no per-lane pointers), which the real compiler takes."""
    for r in (12000, 300):
        source, _, kinfo = generated(_scaled, [torch.randn(4, r), torch.tensor(0.5)])
        assert re.search(r"tl\.load\(in1 \+ \(0\)\)\n", source), source
        assert "in1 + (0) + xzero" not in source
        compile_all(source, kinfo, tmp_path)


def _padded_row_values(logits, m):
    """Per-row values padded along the row (``constant_pad_nd``: a load of ``m[row]``
    under a mask of its own, ``col < 50257``) subtracted from padded-vocabulary logits."""
    mv = aten.expand.default(aten.unsqueeze.default(m, 1), [logits.shape[0], logits.shape[1] - 7])
    y = aten.constant_pad_nd.default(mv, [0, 7])
    return (aten._to_copy.default(aten.sub.Tensor(aten._to_copy.default(logits, dtype=torch.float32), y),
                                  dtype=torch.bfloat16),)


@pytest.mark.parametrize("cols", [50264, 1032], ids=["one_row_a_program", "rows_a_program"])
def test_row_loads_under_a_mask_of_their_own_compile(cols, tmp_path):
    """A row-tiled kernel's per-row load under a column mask of its own (padding) is a
    block load: Triton rejects a block mask on a scalar (or [ROWS, 1]) pointer, which the
    interpreter let through (GPT-2's padded loss gradient ran eagerly on the H100)."""
    r = 64
    args = [torch.randn(r, cols).bfloat16(), torch.randn(r)]
    source, _, kinfo = generated(_padded_row_values, args)
    rows = [k for k in kinfo if "ROWS" in k[3]]
    assert len(rows) == 1, kinfo
    compile_all(source, rows, tmp_path)
